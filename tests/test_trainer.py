"""The trainer end to end: the smoke CLI, exact resume, config validation."""

import json
import os
import re
import shutil
import subprocess
import sys

import jax
import numpy as np
import pytest
from helpers import run_main

from configs import grpo
from explore_rl import checkpoint, testing
from explore_rl import config as config_lib
from explore_rl.logs import read_metrics
from explore_rl.modes import eval as eval_mode
from explore_rl.rl.plan import base_plan
from explore_rl.train import loop, steps


@pytest.mark.slow
def test_smoke_cli_writes_the_run_directory_and_reruns(tmp_path):
    # the starting model evaluated (step 0), then every 2 steps of 3: at step 2, and after
    # the last step whatever the period
    args = [
        "--config=configs/grpo.py:smoke",
        f"--workdir={tmp_path}",
        "--config.train.eval_every=2",
        "--config.train.eval_before=True",
    ]
    out = run_main(*args)
    assert out.returncode == 0, out.stderr[-3000:]
    names = set(os.listdir(tmp_path))
    assert {"config.json", "metrics.jsonl", "checkpoints", "samples"} <= names
    assert any(n.startswith("events.out.tfevents") for n in names)
    folder = str(tmp_path / "checkpoints")  # the last 2 (keep_checkpoints), each digested
    assert checkpoint.steps(folder) == checkpoint.digested(folder) == [2, 3]
    rows = read_metrics(str(tmp_path))
    assert [r["step"] for r in rows] == [0, 1, 2, 3]
    assert ["eval/arithmetic/pass@1" in r for r in rows] == [True, False, True, True]
    for key in (
        "reward/mean",
        "groups/zero_adv_frac",
        "policy/entropy",
        "train/grad_norm",
        "time/rollout_s",
        "perf/tokens_per_s",
        "eval/arithmetic/pass@1",
    ):
        assert key in rows[-1], key
    said = out.stderr.splitlines()  # what the run uses, said at start; a summary at the end
    assert "model: random tiny-llama weights (llama, 2M params), the tokenizer of embedded" in said
    # the attention it runs: on a CPU the portable path (a GPU in bfloat16: the fused one)
    attention = "attention: dense up to 512 queries, blockwise above (model.attention=auto,"
    assert any(s.startswith(attention) for s in said), said
    assert "task: arithmetic: 2000 training problems; held out: arithmetic (4)" in said
    assert "reward: 1 x math" in said
    assert "methods: none (GRPO)" in said
    assert any(s.startswith("update: advantage grpo (GRPO's group mean and std") for s in said)
    assert any(s.startswith("memory per device (estimate, GiB): ") for s in said)
    assert "step 1 compiles the run's programs first" in out.stderr  # before a silent minute
    evaluation = [s for s in said if s.startswith("evaluation: ")]  # its size, then its time
    size = re.fullmatch(r"evaluation: 8 responses of up to (\d+) tokens \(eval.samples=2 per "
                        r"question\), every 2 steps and after the last", evaluation[0])  # fmt: skip
    timed = re.fullmatch(r"evaluation: about ([\d.]+) min each at this step's generation rate "
                         r"\((\d+) response slots/s; .*\)", evaluation[1])  # fmt: skip
    assert len(evaluation) == 2 and size and timed  # 8 responses' slots at the rate said
    assert float(timed[1]) == pytest.approx(8 * int(size[1]) / int(timed[2]) / 60, abs=0.051)
    assert f"run: {tmp_path} (new); tensorboard --logdir {tmp_path}" in said
    done = [s for s in said if s.startswith(f"done: 3 steps in {tmp_path}; step 3: reward/mean ")]
    assert len(done) == 1 and re.search(r"pass@1 [\d.]+, eval/average/pass@2 [\d.]+$", done[0])
    again = run_main(*args)
    assert again.returncode == 0 and len(read_metrics(str(tmp_path))) == 4  # resumed at the end
    assert f"{tmp_path}: finished at step 3 (train.steps=3): nothing to train" in again.stderr


def _resume_config():
    """Smoke scale (a tiny random model) with a reward that gives mixed groups, so every
    step updates the params, the AdamW moments and the data position: what a resume must
    restore does not depend on the model's size."""
    c = grpo.get_config("smoke")
    c.reward.fn = testing.PARITY
    c.train.steps, c.train.checkpoint_every, c.train.eval_every = 4, 2, 0
    return c


@pytest.mark.slow
def test_resume_continues_exactly(tmp_path):
    straight = loop.train(config_lib.spec(_resume_config()), str(tmp_path / "a"))
    # The same run killed after logging step 4 but before its checkpoint: the newest
    # complete checkpoint is step 2's, and the lines of steps 3 and 4 must not repeat.
    skip_step_4 = lambda folder, names: ["4", "4.sha256"] if folder.endswith("checkpoints") else []  # noqa: E501, E731
    shutil.copytree(tmp_path / "a", tmp_path / "b", ignore=skip_step_4)
    assert checkpoint.steps(str(tmp_path / "b" / "checkpoints")) == [2]
    resumed = loop.train(config_lib.spec(_resume_config()), str(tmp_path / "b"))
    a, b = read_metrics(str(tmp_path / "a")), read_metrics(str(tmp_path / "b"))
    assert [r["step"] for r in b] == [1, 2, 3, 4]
    drop = ("time/", "perf/")
    # exact: a resume runs the same programs on the same shapes and restored state
    for ra, rb in zip(a, b):
        assert {k: v for k, v in ra.items() if not k.startswith(drop)} == {
            k: v for k, v in rb.items() if not k.startswith(drop)
        }
    assert all(r["groups/zero_adv_frac"] < 1 for r in a)  # real updates at every step
    leaves = zip(jax.tree.leaves(straight.state), jax.tree.leaves(resumed.state))
    assert all(np.array_equal(np.asarray(x), np.asarray(y)) for x, y in leaves)
    assert int(straight.data_position) == int(resumed.data_position) == 8


def test_config_validation_messages():
    c = grpo.get_config("smoke")
    c.rollout.group_size = 1
    with pytest.raises(ValueError, match="group_size=1"):
        config_lib.spec(c)
    c = grpo.get_config("smoke")
    c.rl.aggregation = "mean"
    with pytest.raises(ValueError, match="aggregation='mean'"):
        config_lib.spec(c)
    c = grpo.get_config("smoke")
    c.optim.micro_batches = 3
    with pytest.raises(ValueError, match="micro_batches=3 must divide"):
        config_lib.spec(c)
    c.optim.micro_batches, c.optim.decay_steps = 1, -5
    with pytest.raises(ValueError, match=r"^config: optim.decay_steps=-5: must be an integer >= 0"):
        config_lib.spec(c)
    with pytest.raises(
        ValueError, match=r"grpo.py:huge: .* scales \[.smoke., .demo., .lab., .lab2., .paper.\]"
    ):
        grpo.get_config("huge")


def _fake_rollouts(rewards):
    """Rollouts of q groups x 2 rows with the given rewards (tokens encode the row)."""
    from explore_rl.data.tasks import Problem
    from explore_rl.rl.plan import RolloutPlan
    from explore_rl.rl.rollout import Rollouts
    from explore_rl.sampling.sampler import Samples

    rewards = np.asarray(rewards, np.float32)
    q, g = rewards.shape
    rows = np.arange(q * g)
    zeros = jax.numpy.zeros((q * g, 3))
    out = Samples(
        tokens=jax.numpy.asarray(np.repeat(rows[:, None], 3, 1)),
        mask=jax.numpy.ones((q * g, 3), bool),
        logprobs=zeros,
        entropy=zeros,
        sampling_entropy=zeros,
        finished=jax.numpy.ones(q * g, bool),
    )
    return Rollouts(
        [Problem(f"q{i}", "1") for i in range(q)],
        np.ones((q, 2), np.int32),
        np.ones((q, 2), bool),
        out,
        [f"r{i}" for i in rows],
        rewards,
        rewards > 0,
        RolloutPlan(zeros + 1.0, info={"t": {"row": rows, "group": np.arange(q)}}),
    )


def test_dynamic_sampling_keeps_informative_groups_and_fills():
    from explore_rl.rl.rollout import informative, select_groups

    a = _fake_rollouts([[1, 1], [0, 1], [0, 0]])  # only group 1 is informative
    b = _fake_rollouts([[1, 0], [1, 1], [0, 0]])  # only group 0
    kept = [(r, i) for r in (a, b) for i in np.flatnonzero(informative(r))]
    spare = [(r, i) for r in (a, b) for i in np.flatnonzero(~informative(r))]
    parts, filled = steps.fill_groups(kept, spare, 3)
    assert filled == 1 and parts[:2] == [(a, 1), (b, 0)] and parts[2] == (b, 2)
    batch = select_groups(parts, pad_id=0)
    np.testing.assert_array_equal(batch.rewards, [[0, 1], [1, 0], [0, 0]])
    assert batch.texts == ["r2", "r3", "r0", "r1", "r4", "r5"]
    np.testing.assert_array_equal(np.asarray(batch.out.tokens[:, 0]), [2, 3, 0, 1, 4, 5])
    # explorers' per-row and per-group plan arrays follow their rows and groups
    np.testing.assert_array_equal(batch.plan.info["t"]["row"], [2, 3, 0, 1, 4, 5])
    np.testing.assert_array_equal(batch.plan.info["t"]["group"], [1, 0, 2])
    assert steps.fill_groups(kept, spare, 1) == ([(a, 1)], 0)


@pytest.mark.slow
def test_dynamic_sampling_runs_until_its_budget(tmp_path):
    c = grpo.get_config("smoke")  # a random model: every group is all-wrong
    c.rollout.dynamic_sampling, c.rollout.max_generation_batches = True, 3
    c.train.steps, c.train.eval_every = 1, 0
    loop.train(config_lib.spec(c), str(tmp_path))
    row = read_metrics(str(tmp_path))[0]
    assert row["rollout/generation_batches"] == 3 and row["rollout/filled_groups"] == 2


def test_pi_old_pass_is_skipped_only_when_mu_is_pi_old():
    from explore_rl.exploration import base
    from explore_rl.exploration.ead import EAD
    from explore_rl.models.transformer import Interventions

    def plan(c):
        return base_plan(4, 16, c.rollout.temperature, [])

    def skipped(c, p=None):
        return steps.behaviour_is_pi_old(config_lib.spec(c), plan(c) if p is None else p)

    c = grpo.get_config("demo")
    assert c.rl.minibatches == 4 and skipped(c)
    # pi_old is the sampling policy whatever the number of optimizer steps on the batch
    for field, value in [("ppo_epochs", 2), ("minibatches", 2)]:
        changed = grpo.get_config("demo")
        setattr(changed.rl, field, value)
        assert skipped(changed), field
    hot = grpo.get_config("demo")
    hot.rollout.temperature = 1.2  # scored at the rollout temperature: still mu = pi_old
    assert skipped(hot)
    hot.rl.score_temperature = "1.0"  # scored at 1: the sampler drew from another policy
    assert not skipped(hot)
    for field, value in [("top_p", 0.95), ("top_k", 20)]:
        changed = grpo.get_config("demo")
        setattr(changed.rollout, field, value)
        assert not skipped(changed), field
    c.rl.pi_old = "recompute"
    assert not skipped(c)
    c.rl.pi_old = "auto"
    spec = config_lib.spec(c)
    ctx = base.StepContext(None, None, None, spec, step=3)
    annealed = EAD(EAD.Spec(), spec).plan({}, plan(c), ctx, None)  # hot from t = c = 10
    assert not skipped(c, annealed)
    steered = plan(c).replace(interventions=Interventions(steer=jax.numpy.zeros((4, 8))))
    assert not skipped(c, steered)


@pytest.mark.slow
def test_kl_to_the_frozen_reference_through_the_trainer(tmp_path):
    c = grpo.get_config("smoke")
    c.rl.kl_coef, c.train.steps, c.train.eval_every = 0.1, 3, 0
    c.rl.minibatches = 1  # one update a step: step 1's is evaluated at the reference
    c.optim.lr = 1e-2  # move far from the reference in two updates
    # the smoke model's rewards are all 0: the entropy bonus is what moves the policy
    c.rl.entropy_coef = 0.1
    loop.train(config_lib.spec(c), str(tmp_path))
    kl = [r["policy/kl_ref"] for r in read_metrics(str(tmp_path))]
    assert kl[0] == 0.0  # the first update starts at the reference: k3 = 0 exactly
    assert 0 < kl[1] < kl[2]  # the reference stays frozen while the policy moves away


@pytest.mark.slow
def test_eval_of_any_checkpoint_restores_params_only_and_writes_the_responses(tmp_path):
    from configs import ase
    from explore_rl.checkpoint import Checkpointer

    c = ase.get_config("smoke")  # trained with ASE: explorer state in the checkpoint
    c.reward.fn = testing.PARITY
    c.train.steps, c.train.eval_every, c.train.checkpoint_every = 3, 0, 2
    loop.train(config_lib.spec(c), str(tmp_path / "run"))
    folder, step = checkpoint.locate(str(tmp_path / "run"), 2)
    params = checkpoint.restore_subset(folder, step, {"state": {"params": _params(c)}})
    full = Checkpointer(str(tmp_path / "run")).restore(
        2, testing.start(c, str(tmp_path / "x"), None)[1]
    )
    # exact: two restores of the same saved arrays
    for a, b in zip(jax.tree.leaves(params["state"]["params"]), jax.tree.leaves(full.state.params)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    e = grpo.get_config("smoke")  # evaluated without the run's exploration method
    e.eval.checkpoint, e.eval.step = str(tmp_path / "run"), 2
    results = eval_mode.run_eval(config_lib.spec(e), str(tmp_path / "eval"))
    written = json.load(open(tmp_path / "eval" / "eval.json"))
    assert written["step"] == 2 and written["eval/average/pass@1"] == results["eval/average/pass@1"]
    rows = [json.loads(line) for line in open(tmp_path / "eval" / "eval_responses.jsonl")]
    assert len(rows) == e.task.test_size * e.eval.samples
    assert set(rows[0]) == {
        "benchmark",
        "question",
        "reference",
        "response",
        "extracted",
        "correct",
    }
    assert np.mean([r["correct"] for r in rows]) == pytest.approx(results["eval/average/mean@2"])
    with pytest.raises(ValueError, match="no checkpoint of step 5 .there are \\[2, 3\\]"):
        checkpoint.locate(str(tmp_path / "run"), 5)
    with pytest.raises(ValueError, match="is step 3, eval.step=2"):
        checkpoint.locate(str(tmp_path / "run" / "checkpoints" / "3"), 2)
    assert checkpoint.locate(str(tmp_path / "run" / "checkpoints" / "3"))[1] == 3


def _params(c):
    return config_lib.resolve(c).model.load(c.seed)[0]


@pytest.mark.slow
def test_a_wandb_offline_run_writes_its_files_and_resumes_the_same_run(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    c = grpo.get_config("smoke")
    c.train.steps, c.train.eval_every = 2, 0
    c.logging.wandb, c.logging.name, c.logging.tags = True, "smoke-run", "a, b"
    loop.train(config_lib.spec(c), str(tmp_path))
    run_id = (tmp_path / "wandb_id").read_text().strip()
    runs = list((tmp_path / "wandb").glob(f"offline-run-*-{run_id}"))
    assert len(runs) == 1 and list(runs[0].glob(f"run-{run_id}.wandb"))
    c.train.steps = 3  # the rerun resumes: the same W&B run id
    loop.train(config_lib.spec(c), str(tmp_path))
    assert (tmp_path / "wandb_id").read_text().strip() == run_id
    assert len(list((tmp_path / "wandb").glob(f"offline-run-*-{run_id}"))) == 2


@pytest.mark.slow
def test_wandb_without_a_login_stops_the_run_at_start_in_one_line(tmp_path):
    """Before the model loads or the work directory is made, W&B's own words and the way
    out. In a fresh process: W&B keeps its settings (an offline run's mode) per process."""
    pytest.importorskip("wandb")
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    env.update(HOME=str(tmp_path), WANDB_MODE="online", WANDB_SILENT="true")  # no saved key
    env.update(JAX_PLATFORMS="cpu")
    workdir = tmp_path / "run"
    out = subprocess.run(
        [sys.executable, "-m", "explore_rl.main", "--config", "configs/grpo.py:smoke",
         "--config.logging.wandb=True", "--workdir", str(workdir)],
        env=env, capture_output=True, text=True, cwd=os.path.dirname(os.path.dirname(__file__)),
    )  # fmt: skip
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2, out.stderr[-2000:]
    assert re.match(r"error: logging.wandb=True: W&B says: .*API key.*WANDB_MODE", lines[-1])
    assert not any(line.startswith("model:") for line in lines)  # nothing was loaded
    assert not workdir.exists()


@pytest.mark.slow
def test_a_bfloat16_run_trains_and_logs(tmp_path, caplog):
    """Weights and activations in bfloat16: the update's metrics (bfloat16 scalars on
    the device) average into the log; the run warns that small steps round away."""
    c = grpo.get_config("smoke")
    c.model.dtype = c.model.param_dtype = "bfloat16"
    c.train.steps, c.train.eval_every, c.optim.lr = 1, 0, 1e-6
    progress = loop.train(config_lib.spec(c), str(tmp_path))
    assert "~optim.lr=1e-06 is rounded away on every weight above ~0.00026" in caplog.text
    assert jax.tree.leaves(progress.state.params)[0].dtype == jax.numpy.bfloat16
    (row,) = read_metrics(str(tmp_path))
    assert np.isfinite(row["train/loss"]) and np.isfinite(row["train/grad_norm"])


def _said(c, tmp_path) -> dict[str, str]:
    """The start-up header of config `c`'s run, by each line's first word."""
    from explore_rl.train import build

    spec = config_lib.spec(c)
    cfg, tok = spec.model.config()
    run = build.Run.create(spec.with_stop_ids(tok.stop_ids), [], cfg, tok, None)
    lines = build.what_runs(run, str(tmp_path), 0, run.train_set[0]).splitlines()
    return {line.split(": ", 1)[0]: line.split(": ", 1)[1] for line in lines}


def test_the_start_up_header_says_the_data_prompts_update_and_methods(tmp_path):
    """A user's file is said as the task that reads it (config.json too), the first prompt
    as the model reads it (instruction and chat template shown), the update by its papers'
    names (half of Dr. GRPO said to be half), and each method with its settings."""
    from configs import eden

    data = tmp_path / "mine.jsonl"
    data.write_text('{"question": "What is 2 + 3?", "answer": "5"}\n' * 3)
    c = grpo.get_config("smoke")
    c.task.train_path, c.rl.advantage = str(data), "dr_grpo"
    said = _said(c, tmp_path)
    assert said["task"].startswith(f"jsonl, {data}: 3 training problems")
    assert config_lib.spec(c).record["task"]["name"] == "jsonl"
    assert said["prompts"].startswith(
        "the question + task.instruction=' Put the final answer in \\\\boxed{}.' in the "
        "model's chat template"
    )
    assert "<|im_start|>user\\nWhat is 2 + 3? Put the final answer in" in said["prompts"]
    assert said["update"].startswith(
        "advantage dr_grpo (Dr. GRPO's group mean, no std (Liu et al. 2025)); loss ppo_clip "
        "clip [1-0.2, 1+0.28], aggregation token_mean (DAPO's token mean (Yu et al. 2025))"
    )
    assert "half of Dr. GRPO" in said["update"] and said["methods"] == "none (GRPO)"
    c.rl.aggregation = "seq_mean_token_sum_norm"
    c.task.raw_prompt, c.task.instruction = "{question}", ""  # TRL's standard prompt
    said = _said(c, tmp_path)
    assert "half" not in said["update"] and "Dr. GRPO's token sum" in said["update"]
    assert said["prompts"] == "task.raw_prompt='{question}' with task.instruction='', no " \
        "chat; the first: 'What is 2 + 3?'"  # fmt: skip
    c = eden.get_config("smoke")
    c.rl.advantage = "rloo"
    said = _said(c, tmp_path)
    assert said["update"].startswith("advantage rloo (RLOO's leave-one-out mean")
    assert said["method eden"].startswith("noisy=1, rho=")
