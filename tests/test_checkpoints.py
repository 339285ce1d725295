"""Checkpoint integrity: each step's digest, a damaged newest step set aside for the newest
intact one, old steps deleted only once a newer one is digested, and a resume that would
delete checkpoints refused unless asked."""

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import snapshot, without_timing

from explore_rl import checkpoint as checkpoint_lib
from explore_rl import config as config_lib
from explore_rl import testing
from explore_rl.logs import read_metrics
from explore_rl.train import loop


def _config(steps: int, keep: int = 3):
    c = testing.smoke(steps=steps, checkpoint_every=1)
    c.reward.workers, c.train.keep_checkpoints = 1, keep
    return c


def test_a_step_is_deleted_only_once_a_newer_one_is_digested(tmp_path):
    ckpt = checkpoint_lib.Checkpointer(str(tmp_path), keep=1)
    ckpt.save(1, {"x": jnp.arange(4.0)})
    ckpt.close()
    folder = ckpt.folder
    assert checkpoint_lib.digested(folder) == [1]
    assert checkpoint_lib.check_digest(folder, 1) is None
    ckpt = checkpoint_lib.Checkpointer(str(tmp_path), keep=1)
    ckpt.save(2, {"x": jnp.arange(4.0) + 1})
    # step 2 may be written already, but is not digested: step 1 stays (Orbax's own
    # max_to_keep deleted it as soon as step 2 was written)
    assert 1 in checkpoint_lib.steps(folder)
    ckpt.close()
    assert checkpoint_lib.steps(folder) == checkpoint_lib.digested(folder) == [2]


# one kind of damage in the fast tier: each is three training runs
@pytest.mark.parametrize(
    "damage",
    [
        pytest.param("bytes", marks=pytest.mark.slow),
        "metadata",
        pytest.param("undigested", marks=pytest.mark.slow),
    ],
)
def test_a_damaged_newest_step_is_set_aside_and_the_run_resumes_before_it(damage, tmp_path, capsys):
    """64 bytes overwritten in the newest step's largest file (found by its digest), its
    metadata file deleted (found by its digest), or the metadata file of a newest step
    whose digest was never written (a kill right after the write): found when Orbax cannot
    read it. Each time the resume sets the step aside with one line, resumes from the
    step before, and ends equal to a run never damaged."""
    loop.train(config_lib.spec(_config(3)), str(tmp_path / "a"))
    loop.train(config_lib.spec(_config(2)), str(tmp_path / "b"))
    folder = str(tmp_path / "b" / "checkpoints")
    step2 = os.path.join(folder, "2")
    if damage == "bytes":
        files = [os.path.join(d, n) for d, _, ns in os.walk(step2) for n in ns]
        largest = max(files, key=os.path.getsize)
        with open(largest, "r+b") as f:
            f.seek(os.path.getsize(largest) // 2)
            f.write(b"\xff" * 64)
    else:
        os.remove(os.path.join(step2, "state", "_METADATA"))
    if damage == "undigested":
        os.remove(os.path.join(folder, "2.sha256"))
    kept = snapshot(os.path.join(folder, "1"))
    capsys.readouterr()
    loop.train(config_lib.spec(_config(3)), str(tmp_path / "b"))
    err = capsys.readouterr().err
    said = [line for line in err.splitlines() if "is damaged" in line]
    assert len(said) == 1, err[-2000:]
    assert said[0].startswith(f"checkpoint 2 in {folder} is damaged (")
    assert "set aside as 2.damaged; resuming from the newest intact one" in said[0]
    if damage != "undigested":
        assert "differs from its digest" in said[0] or "is missing" in said[0]
    assert os.path.isdir(os.path.join(folder, "2.damaged"))  # kept for inspection
    assert snapshot(os.path.join(folder, "1")) == kept  # read, not rewritten
    a, b = read_metrics(str(tmp_path / "a")), read_metrics(str(tmp_path / "b"))
    assert [r["step"] for r in b] == [1, 2, 3]
    # exact: the resume from step 1 runs the same programs on the same restored state
    assert without_timing(a) == without_timing(b)
    assert checkpoint_lib.check_digest(folder, 3) is None


def test_eval_skips_a_damaged_newest_step_and_refuses_one_named(tmp_path, capsys):
    loop.train(config_lib.spec(_config(2)), str(tmp_path))
    folder = str(tmp_path / "checkpoints")
    os.remove(os.path.join(folder, "2", "state", "_METADATA"))
    assert checkpoint_lib.locate(str(tmp_path)) == (folder, 1)
    assert "checkpoint 2 is damaged (state/_METADATA is missing), skipped" in (
        capsys.readouterr().err
    )
    with pytest.raises(ValueError, match=r"checkpoint 2 is damaged \(state/_METADATA is missing"):
        checkpoint_lib.locate(os.path.join(folder, "2"))


def test_keeping_fewer_checkpoints_than_the_run_has_is_refused_unless_asked(tmp_path):
    loop.train(config_lib.spec(_config(2)), str(tmp_path))
    before = snapshot(tmp_path)
    with pytest.raises(
        ValueError,
        match=r"^train.keep_checkpoints=1 would delete 1 of the 2 checkpoints in .* at the "
        r"next save: keep 2, or --config.train.prune_checkpoints=True$",
    ):
        loop.train(config_lib.spec(_config(3, keep=1)), str(tmp_path))
    assert snapshot(tmp_path) == before
    c = _config(3, keep=1)
    c.train.prune_checkpoints = True
    progress = loop.train(config_lib.spec(c), str(tmp_path))
    folder = str(tmp_path / "checkpoints")
    assert checkpoint_lib.steps(folder) == checkpoint_lib.digested(folder) == [3]
    saved = checkpoint_lib.restore_subset(folder, 3, {"state": {"params": progress.state.params}})
    leaves = zip(jax.tree.leaves(saved), jax.tree.leaves(progress.state.params), strict=True)
    assert all(np.array_equal(np.asarray(x), np.asarray(y)) for x, y in leaves)


def test_the_best_step_is_kept_beside_the_newest_and_read_back_on_resume(tmp_path):
    metric = "eval/task/mean@8"
    ckpt = checkpoint_lib.Checkpointer(str(tmp_path), keep=1, best_metric=metric)
    for step, value in enumerate([0.2, 0.5, 0.3, 0.4], start=1):
        best = value if ckpt.improves({metric: value, "reward/mean": 1.0}) else None
        ckpt.save(step, {"x": jnp.full(4, float(step))}, best=best)
    ckpt.close()
    folder = ckpt.folder
    assert checkpoint_lib.steps(folder) == checkpoint_lib.digested(folder) == [2, 4]
    assert checkpoint_lib.read_best(folder) == {"metric": metric, "step": 2, "value": 0.5}
    assert checkpoint_lib.locate(os.path.join(folder, "best")) == (folder, 2)
    again = checkpoint_lib.Checkpointer(str(tmp_path), keep=1, best_metric=metric)
    assert not again.improves({metric: 0.45}) and again.improves({metric: 0.6})
    assert not again.improves({"reward/mean": 1.0})  # a step without an evaluation
    with pytest.raises(ValueError, match=r"best_metric='eval/task/mean@8' is not an evaluation"):
        again.improves({"eval/task/pass@1": 0.7})  # evaluated, but not what was named
    again.close()
    with pytest.raises(ValueError, match=r"best checkpoint is by 'eval/task/mean@8'"):
        checkpoint_lib.Checkpointer(str(tmp_path), keep=1, best_metric="eval/task/pass@1")


def test_a_run_checkpoints_its_best_evaluation_and_eval_reads_it(tmp_path):
    c = _config(3, keep=1)
    c.train.eval_every, c.train.best_metric = 1, "eval/arithmetic/pass@1"
    loop.train(config_lib.spec(c), str(tmp_path))
    values = [row[c.train.best_metric] for row in read_metrics(str(tmp_path))]
    best = 1 + int(np.argmax(values))  # the first of equal highs
    folder = str(tmp_path / "checkpoints")
    assert checkpoint_lib.steps(folder) == sorted({best, 3})
    assert checkpoint_lib.read_best(folder)["step"] == best
    assert checkpoint_lib.locate(str(tmp_path / "checkpoints" / "best")) == (folder, best)
    c.train.eval_every = 0
    with pytest.raises(ValueError, match=r"train.best_metric=.*with train.eval_every > 0"):
        loop.train(config_lib.spec(c), str(tmp_path / "other"))


def test_only_a_failed_writes_late_completions_are_kept_from_the_terminal(monkeypatch):
    """The storage layer's completions that arrive after Orbax closed its event loop are
    dropped; any other unraisable error still reaches the hook (checkpoint.py)."""
    import asyncio
    import sys
    import types

    seen = []
    monkeypatch.setattr(sys, "unraisablehook", seen.append)
    checkpoint_lib._drop_late_completions()
    installed = sys.unraisablehook
    checkpoint_lib._drop_late_completions()
    assert sys.unraisablehook is installed  # once a process: not wrapped twice

    def unraisable(fn):
        try:
            fn()
        except RuntimeError as e:
            sys.unraisablehook(types.SimpleNamespace(exc_value=e, exc_traceback=e.__traceback__))

    loop = asyncio.new_event_loop()
    loop.close()
    unraisable(lambda: loop.call_soon_threadsafe(print))  # a late completion: dropped
    assert seen == []
    unraisable(lambda: loop.call_soon(print))  # the same error from another call
    unraisable(lambda: loop.call_later(0, print))
    assert [str(u.exc_value) for u in seen] == ["Event loop is closed"] * 2
