"""`--mode sft` (train/sft.py): the loss is the NLL of the response tokens only (against a
plain forward pass over prompt and response), the examples are the problems with a
solution that fits, a resumed run equals one never stopped, a dataset file's solutions
are read by `task.solution_field`, and an SFT run's weights start an RL run."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import assert_float32_close, forward

from configs import grpo
from explore_rl import config as config_lib
from explore_rl import testing
from explore_rl.data import lab, tasks
from explore_rl.train import loop, sft, steps

pytestmark = pytest.mark.usefixtures("highest_precision")


def lab_config(steps: int = 2, train_size: int = 64):
    """The tiny lab model on 3-number Countdown: a few steps of 8 examples."""
    c = grpo.get_config("smoke")
    c.model.path, c.model.random_init = lab.FOLDER, "tiny-llama"
    c.task.name, c.reward.name = "countdown", "countdown"
    c.task.countdown = tasks.defaults("countdown")
    c.task.countdown.inputs = 3
    c.task.train_size, c.task.test_size = train_size, 8
    c.task.instruction, c.task.raw_prompt = "", "{question}\n"
    c.rollout.max_new_tokens, c.rollout.max_prompt_len = 24, 24
    c.sft.batch_size, c.optim.lr, c.optim.micro_batches = 8, 1e-2, 2
    c.train.steps, c.train.checkpoint_every, c.train.eval_every = steps, 2, 0
    return c


def nll_by_hand(params, cfg, tok, problems, prompt_format) -> tuple[float, float]:
    """Mean -log p of the response tokens (solution and EOS) of each example, through the
    plain forward pass of every row at once, right-padded (causal: a row's logits do not
    see its padding; the SFT step left-pads prompts in micro-batches); and of every token
    after the first (a plain language-model loss), from the same pass."""
    rows = []
    for p in problems:
        prompt = tok.encode(prompt_format.text(tok, p.question, p.messages))
        rows.append((prompt + tok.encode(p.solution) + [tok.eos_id], len(prompt)))
    width = max(len(ids) for ids, _ in rows)
    ids = jnp.asarray([r + [0] * (width - len(r)) for r, _ in rows])
    mask = jnp.asarray([[i < len(r) for i in range(width)] for r, _ in rows])
    positions = jnp.broadcast_to(jnp.arange(width), ids.shape)
    logits = forward(params, cfg, ids, positions, mask).logits
    logp = np.asarray(jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1), np.float64)
    totals, counts = [0.0, 0.0], [0, 0]
    for row, (r, prompt_len) in zip(logp, rows):
        for i, first in enumerate((prompt_len, 1)):
            totals[i] -= sum(row[t - 1, r[t]] for t in range(first, len(r)))
            counts[i] += len(r) - first
    return totals[0] / counts[0], totals[1] / counts[1]


def test_the_loss_is_the_nll_of_the_response_tokens_only(tmp_path):
    c = lab_config(steps=1)
    run, progress, ckpt = testing.start(config_lib.spec(c, "sft"), str(tmp_path), None)
    ckpt.close()
    spec, ex = run.spec, sft.examples(run)
    params = jax.tree.map(jnp.copy, progress.state.params)  # the update donates its state
    _, metrics, _ = sft.sft_step(run, ex, progress)
    drawn = steps.stream(list(range(len(ex.problems))), spec.seed, 0, spec.sft.batch_size)
    problems = [ex.problems[i] for i in drawn]
    expected, everything = nll_by_hand(params, run.cfg, run.tok, problems, spec.prompt)
    # two computations of other shapes (two padded micro-batches vs a row at a time):
    # their float32 sums agree to rounding of the size of the loss
    assert_float32_close(metrics["train/loss"], expected, scale=expected)
    # and not the loss over the prompt tokens too, which a plain language-model loss takes:
    # that one is further from it than ten times the bound the two computations meet
    assert abs(everything - metrics["train/loss"]) > 10 * 256 * 2**-23 * expected


def test_examples_are_the_problems_with_a_solution_that_fits(tmp_path):
    c = lab_config()
    c.rollout.max_new_tokens = 16  # "a-b=c\nc*d=e" and EOS: some three-number solutions are longer
    run, _, ckpt = testing.start(config_lib.spec(c, "sft"), str(tmp_path), None)
    ckpt.close()
    ex = sft.examples(run)
    fits = [p for p in run.train_set if p.solution and len(p.solution) + 1 <= 16]
    assert ex.problems == fits and 0 < len(fits) < len(run.train_set)
    assert all(r[-1] == run.tok.eos_id and run.tok.decode(r) == p.solution
               for p, r in zip(ex.problems, ex.responses))  # fmt: skip
    c.rollout.max_new_tokens = 2
    run, _, ckpt = testing.start(config_lib.spec(c, "sft"), str(tmp_path / "b"), None)
    ckpt.close()
    with pytest.raises(
        ValueError, match="none of the 64 training problems has a solution of at most"
    ):
        sft.examples(run)


@pytest.mark.slow
def test_a_resumed_sft_run_equals_one_never_stopped(tmp_path):
    c = lab_config(steps=4)
    straight = sft.train_sft(config_lib.spec(c, "sft"), str(tmp_path / "straight"))
    c.train.steps = 2
    sft.train_sft(config_lib.spec(c, "sft"), str(tmp_path / "resumed"))
    c.train.steps = 4
    resumed = sft.train_sft(config_lib.spec(c, "sft"), str(tmp_path / "resumed"))
    # exact: the same programs on the same shapes, the data position checkpointed
    for x, y in zip(jax.tree.leaves(straight.state.params), jax.tree.leaves(resumed.state.params)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    assert int(resumed.data_position) == 4 * 8
    rows = [json.loads(line) for line in open(tmp_path / "resumed" / "metrics.jsonl")]
    assert [r["step"] for r in rows] == [1, 2, 3, 4] and rows[-1]["train/loss"] < rows[0][
        "train/loss"
    ]


def test_a_files_solutions_by_solution_field(tmp_path):
    path = tmp_path / "train.jsonl"
    rows = [
        {"q": "2 3 -> 5", "a": "5", "worked": "2+3=5"},
        {"q": "2 3 -> 6", "a": "6", "worked": "2*3=6"},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    c = config_lib.load("configs/base.py")
    c.task.train_path, c.task.question_field, c.task.answer_field = str(path), "q", "a"
    c.task.solution_field = "worked"
    train, _ = config_lib.spec(c).problems()
    assert [p.solution for p in train] == ["2+3=5", "2*3=6"]
    c.task.solution_field = "steps"
    with pytest.raises(ValueError, match="line 1: no field 'steps'"):
        config_lib.spec(c).problems()


@pytest.mark.slow
def test_an_sft_runs_weights_start_an_rl_run(tmp_path):
    from explore_rl.modes.export import run_export

    c = lab_config(steps=2)
    trained = sft.train_sft(config_lib.spec(c, "sft"), str(tmp_path / "sft"))
    c.eval.checkpoint = str(tmp_path / "sft")
    run_export(config_lib.spec(c, "export"), str(tmp_path / "hf"))  # the SFT config as it is
    rl = lab_config(steps=1)
    rl.model.path, rl.model.random_init = str(tmp_path / "hf"), ""
    rl.optim.micro_batches = 1  # RL's batch: 2 prompts, 2 minibatches of one
    start, _, _ = config_lib.resolve(rl).model.load(0)
    for x, y in zip(jax.tree.leaves(trained.state.params), jax.tree.leaves(start)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))  # exact: float32 written as is
    rl.reward.fn = testing.PARITY  # mixed groups, so the step updates
    progress = loop.train(config_lib.spec(rl), str(tmp_path / "rl"))
    assert int(progress.state.step) > 0


def test_a_task_without_worked_solutions_is_named_as_such(tmp_path):
    """The default task (arithmetic) makes no solutions: the error says so, not the length."""
    c = grpo.get_config("smoke")
    c.train.steps = 1
    run, _, ckpt = testing.start(config_lib.spec(c, "sft"), str(tmp_path), None)
    ckpt.close()
    with pytest.raises(ValueError, match="task 'arithmetic' has no worked solutions to imitate"):
        sft.examples(run)


def test_an_sft_step_logs_no_ratio_metrics(tmp_path):
    """SFT has no pi_old and no sampling policy: no clip fractions, ratio or KL to pi_old
    (the RL metrics would be numbers of nothing), the loss and entropy only."""
    c = lab_config(steps=1)
    run, progress, ckpt = testing.start(config_lib.spec(c, "sft"), str(tmp_path), None)
    ckpt.close()
    _, metrics, _ = sft.sft_step(run, sft.examples(run), progress)
    assert "train/loss" in metrics and "policy/entropy" in metrics
    assert not [k for k in metrics if "clip_frac" in k or "ratio" in k or "kl" in k]


def test_rl_from_an_sft_run_folder_says_to_export_it_first(tmp_path):
    """`model.path=<an SFT run>`: its Orbax checkpoints are not a model folder's weights;
    the run is refused with the export command, before anything loads."""
    (tmp_path / "sft" / "checkpoints").mkdir(parents=True)
    c = grpo.get_config("smoke")
    c.model.path, c.model.random_init = str(tmp_path / "sft"), ""
    with pytest.raises(
        ValueError,
        match=r"is a run directory, not a model folder: export .* "
        rf"--workdir {tmp_path}/sft-hf\) and give model.path={tmp_path}/sft-hf",
    ):
        config_lib.spec(c)
