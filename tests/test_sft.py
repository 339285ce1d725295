"""`--mode sft` (train/sft.py): the loss is the NLL of the response tokens only (against a
plain forward pass over prompt and response), the examples are the problems with a
solution that fits, a resumed run equals one never stopped, a dataset file's solutions
are read by `task.solution_field`, and an SFT run's directory, given as `model.path`,
starts a run from its weights (modes/export.py: `resolve`), or is refused with the reason."""

import dataclasses
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import assert_float32_close, forward

from configs import grpo
from explore_rl import checkpoint, testing
from explore_rl import config as config_lib
from explore_rl.data import lab, tasks
from explore_rl.models import lora
from explore_rl.modes import export
from explore_rl.train import build, loop, sft, steps

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


def rl_from(run: str, steps: int = 1):
    """The lab's RL config at `steps`, its model the run directory `run` (its config as
    given: a random-init preset, which the run's own config.json replaces)."""
    rl = lab_config(steps=steps)
    rl.model.path = run
    rl.optim.micro_batches = 1  # RL's batch: 2 prompts, 2 minibatches of one
    return rl


@pytest.fixture
def exports(tmp_path, monkeypatch):
    """The folders the exports of run directories write, counted; in a cache of the test's."""
    monkeypatch.setenv("EXPLORE_RL_CACHE_DIR", str(tmp_path / "cache"))
    written, write = [], export.write

    def counting(spec, folder):
        written.append(folder)
        return write(spec, folder)

    monkeypatch.setattr(export, "write", counting)
    return written


def test_an_sft_run_directory_as_model_path_starts_from_its_newest_weights(tmp_path, exports):
    c = lab_config(steps=2)
    c.train.checkpoint_every = 1
    trained = sft.train_sft(config_lib.spec(c, "sft"), str(tmp_path / "sft"))
    rl = rl_from(str(tmp_path / "sft"))
    first, again = export.resolve(rl), export.resolve(rl_from(str(tmp_path / "sft")))
    assert len(exports) == 1 and first.model.path == again.model.path  # exported once
    assert first.model.path.startswith(str(tmp_path / "cache")) and not first.model.random_init
    assert rl.model.path == str(tmp_path / "sft")  # the caller's config is not changed
    spec = config_lib.spec(first)
    start, _, _ = spec.model.load(0)
    for x, y in zip(jax.tree.leaves(trained.state.params), jax.tree.leaves(start)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))  # float32 written as is
    assert spec.record["model"]["origin"] == f"{tmp_path}/sft step 2"
    run, _, ckpt = testing.start(spec, str(tmp_path / "rl"), None)
    ckpt.close()
    said = build.what_runs(run, str(tmp_path / "rl"), 0, run.train_set[0]).splitlines()[0]
    assert said.startswith(f"model: {tmp_path}/sft step 2 (exported to {first.model.path}; ")
    older = export.resolve(rl_from(str(tmp_path / "sft" / "checkpoints" / "1")))  # a step named
    assert len(exports) == 2 and config_lib.spec(older).model.origin == f"{tmp_path}/sft step 1"


def test_a_damaged_newest_step_is_passed_over_and_a_damaged_step_named_refused(
    tmp_path, exports, capsys
):
    c = lab_config(steps=2)
    c.train.checkpoint_every = 1
    sft.train_sft(config_lib.spec(c, "sft"), str(tmp_path / "sft"))
    step2 = tmp_path / "sft" / "checkpoints" / "2"
    damaged = max((p for p in step2.rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)
    damaged.write_bytes(damaged.read_bytes()[:-1])  # cut short, as a full disk leaves it
    start = export.resolve(rl_from(str(tmp_path / "sft")))
    assert config_lib.spec(start).model.origin == f"{tmp_path}/sft step 1"
    assert "checkpoint 2 is damaged" in capsys.readouterr().err
    with pytest.raises(ValueError, match=rf"^model.path={step2}: checkpoint 2 is damaged \("):
        export.resolve(rl_from(str(step2)))
    assert len(exports) == 1 and step2.exists()  # the run's own folder is left as it was


def test_a_lora_sft_run_starts_from_its_adapters_merged_into_its_base(tmp_path, exports):
    c = lab_config(steps=2)
    c.model.lora.rank = 4
    sft_spec = config_lib.spec(c, "sft")
    trained = sft.train_sft(sft_spec, str(tmp_path / "sft"))
    cfg, _ = sft_spec.model.config()
    merged = lora.merged(trained.state.params, cfg)
    base = lora.split(trained.state.params)[1]
    start, _, _ = config_lib.spec(export.resolve(rl_from(str(tmp_path / "sft")))).model.load(0)
    assert jax.tree.structure(start) == jax.tree.structure(merged)
    for x, y in zip(jax.tree.leaves(merged), jax.tree.leaves(start)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))  # float32 written as is
    q = start["layers"][0]["q"]
    assert not np.array_equal(np.asarray(q), np.asarray(base["layers"][0]["q"]))  # adapted


@pytest.mark.slow
def test_an_rl_run_from_an_sft_run_directory_trains_and_resumes(tmp_path, exports):
    c = lab_config(steps=2)
    sft.train_sft(config_lib.spec(c, "sft"), str(tmp_path / "sft"))
    rl = rl_from(str(tmp_path / "sft"))
    rl.reward.fn = testing.PARITY  # mixed groups, so the step updates
    loop.train(config_lib.spec(export.resolve(rl)), str(tmp_path / "rl"))
    rl.train.steps = 2  # resumed: the config is resolved again, to the same model folder
    loop.train(config_lib.spec(export.resolve(rl)), str(tmp_path / "rl"))
    rows = [json.loads(line) for line in open(tmp_path / "rl" / "metrics.jsonl")]
    assert [r["step"] for r in rows] == [1, 2] and len(exports) == 1


def test_a_run_directory_as_model_path_is_refused_with_the_reason(tmp_path, monkeypatch):
    """Before any work: a run with no checkpoint, no or a broken config.json, one still
    being written, one beside a `model.base`; and in a notebook, a config not resolved."""
    monkeypatch.setenv("EXPLORE_RL_CACHE_DIR", str(tmp_path / "cache"))
    run = tmp_path / "sft"
    (run / "checkpoints").mkdir(parents=True)
    rl = rl_from(str(run))
    with pytest.raises(ValueError, match=rf"^model.path={run}: no checkpoint"):
        export.resolve(rl)
    (run / "checkpoints" / "2").mkdir()
    with pytest.raises(ValueError, match=rf"{run}/config.json is missing, so the run's model"):
        export.resolve(rl)
    (run / "config.json").write_text("{")
    with pytest.raises(ValueError, match=rf"{run}/config.json is unreadable \(JSONDecodeError"):
        export.resolve(rl)
    with checkpoint.only_writer(str(run)):
        with pytest.raises(
            ValueError, match=rf"the run {run} is being written by pid {os.getpid()}"
        ):
            export.resolve(rl)
    rl.model.base = "configs/lab.py:sft,smoke"
    with pytest.raises(ValueError, match="and model.base=configs/lab.py:sft,smoke names a base"):
        export.resolve(rl)
    rl.model.base = ""
    with pytest.raises(
        ValueError, match=r"is a run directory, not a model folder: c = modes.export"
    ):
        config_lib.spec(rl)
    assert not (tmp_path / "cache").exists()  # nothing was exported


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


def test_a_share_of_examples_carry_one_neutral_token_between_prompt_and_response(tmp_path):
    """`sft.neutral_share` 0.25 of batches of 8: 2 rows a batch carry one of lab v2's
    neutral tokens right after the prompt's text and before the response (the prompt's
    last token, context only), the others are unchanged; the rows and tokens vary with the
    data position and repeat for the same one; a token that is not one is refused."""
    c = lab_config(steps=1)
    c.model.path = lab.V2_FOLDER
    c.sft.neutral_share, c.sft.neutral_tokens = 0.25, ",".join(lab.NEUTRAL)
    run, _, ckpt = testing.start(config_lib.spec(c, "sft"), str(tmp_path), None)
    ckpt.close()
    tok, ex = run.tok, sft.examples(run)
    neutral = set(ex.neutral)
    assert neutral == set(range(22, 32)) and neutral.isdisjoint(tok.encode(lab.ALPHABET))
    order, rows, tokens = list(range(8)), set(), set()
    for position in range(0, 160, 8):
        batch = sft.make_batch(run, ex, order, position)
        carried = 0
        for r, i in enumerate(order):
            prompt = np.asarray(batch.prompts[r])[np.asarray(batch.prompt_mask[r])].tolist()
            response = np.asarray(batch.tokens[r])[np.asarray(batch.mask[r])].tolist()
            text = tok.encode(run.spec.prompt.text(tok, ex.problems[i].question, ()))
            assert response == ex.responses[i]
            if prompt != text:
                assert prompt[:-1] == text and prompt[-1] in neutral
                carried, rows, tokens = carried + 1, rows | {r}, tokens | {prompt[-1]}
        assert carried == 2
    assert len(rows) >= 6 and len(tokens) >= 6  # 40 draws: not a fixed row or token
    again = sft.make_batch(run, ex, order, 8)
    np.testing.assert_array_equal(again.prompts, sft.make_batch(run, ex, order, 8).prompts)
    with pytest.raises(ValueError, match="sft.neutral_tokens: 'ab' is 2 tokens"):
        sft.neutral_ids(tok, 0.25, "a,ab")
    with pytest.raises(ValueError, match="sft.neutral_share=0.25 needs sft.neutral_tokens"):
        sft.neutral_ids(tok, 0.25, "")
    full = dataclasses.replace(run, longest_prompt=run.spec.rollout.max_prompt_len)
    with pytest.raises(ValueError, match="token after the longest prompt .* leaves none"):
        sft.examples(full)
