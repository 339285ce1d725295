"""Reliability: kills at any moment and preemption lose nothing, bad input is refused with
an error that names it before anything is changed, runtime faults are counted or stop the
run with a reason."""

import hashlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import textwrap
import time

import jax
import numpy as np
import pytest
from helpers import run_main, snapshot, subprocess_env, without_timing

from configs import grpo
from explore_rl import checkpoint as checkpoint_lib
from explore_rl import config as config_lib
from explore_rl import testing
from explore_rl.data import tasks
from explore_rl.logs import read_metrics
from explore_rl.modes import eval as eval_mode
from explore_rl.modes import sample as sample_mode
from explore_rl.train import build, loop

pytestmark = pytest.mark.slow

ARGS = [
    "--config", "configs/grpo.py:smoke", f"--config.reward.fn={testing.PARITY}",
    "--config.train.eval_every=0", "--config.train.checkpoint_every=1",
    "--config.train.keep_checkpoints=2", "--config.reward.workers=1",
]  # fmt: skip

# Runs the CLI, first arranging to SIGKILL itself at one precise point: just after the
# checkpoint of step N is started (Orbax writes it in a background thread, so the kill
# lands inside the write), or in the middle of writing step N's metrics line; or to find
# the disk full from the checkpoint of step N on (a 1 MiB cap on the size of any file
# written: the write fails with the OS's error, as on a full disk).
DRIVER = textwrap.dedent(
    """
    import os, resource, signal, sys
    from absl import app
    from explore_rl import checkpoint, config, logs, main
    where, at = sys.argv[1], int(sys.argv[2])
    if where == "full":
        save = checkpoint.Checkpointer.save
        def full_save(self, step, state, force=False, best=None):
            if step == at:  # full once the earlier write is done (it may still run)
                self.manager.wait_until_finished()
                signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
                resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))
            save(self, step, state, force, best)
        checkpoint.Checkpointer.save = full_save
    if where == "checkpoint":
        save = checkpoint.Checkpointer.save
        def dying_save(self, step, state, force=False, best=None):
            save(self, step, state, force, best)
            if step == at:
                os.kill(os.getpid(), signal.SIGKILL)
        checkpoint.Checkpointer.save = dying_save
    if where == "metrics":
        log = logs.RunLogger.log
        def dying_log(self, step, metrics, samples=None):
            if step == at:
                with open(self.path, "a") as f:
                    f.write('{"step": %d, "reward/me' % step)
                os.kill(os.getpid(), signal.SIGKILL)
            log(self, step, metrics, samples)
        logs.RunLogger.log = dying_log
    app.run(main.main, argv=config.config_argv(["main", *sys.argv[3:]]))
    """
)


def _cli(*args, driver=None):
    command = [sys.executable, "-c", DRIVER, *driver] if driver else [
        sys.executable, "-m", "explore_rl.main"
    ]  # fmt: skip
    return subprocess.Popen(
        [*command, *args],
        env=subprocess_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _final_params(workdir, step):
    c = grpo.get_config("smoke")
    params, _, _ = config_lib.resolve(c).model.load(c.seed)
    folder, step = checkpoint_lib.locate(workdir, step)
    return checkpoint_lib.restore_subset(folder, step, {"state": {"params": params}})


def test_kills_at_any_moment_resume_to_the_uninterrupted_run(tmp_path):
    """SIGKILL at random moments, inside a checkpoint write and inside a metrics write;
    each time the same command resumes; the end equals a run never interrupted."""
    steps = ["--config.train.steps=10"]
    straight = _cli(*ARGS, *steps, "--workdir", str(tmp_path / "a"))
    assert straight.wait(timeout=600) == 0, straight.stderr.read()[-3000:]
    run = ["--workdir", str(tmp_path / "b"), *ARGS, *steps]
    metrics = tmp_path / "b" / "metrics.jsonl"
    logged = lambda: metrics.read_text().count("\n") if metrics.exists() else 0  # noqa: E731
    rng, faults = random.Random(0), 0
    for _ in range(2):  # from outside, at a random moment of a step once training runs
        p, before = _cli(*run), logged()
        while logged() == before and p.poll() is None:
            time.sleep(0.05)
        time.sleep(rng.uniform(0.0, 0.5))
        faults += p.poll() is None
        p.send_signal(signal.SIGKILL)
        p.wait(timeout=600)
    for where in ("checkpoint", "metrics"):  # the next step's write, wherever the run is
        at = (checkpoint_lib.Checkpointer(str(tmp_path / "b")).latest_step() or 0) + 1
        assert at <= 10, "the run finished before the kills inside its writes"
        p = _cli(*run, driver=[where, str(at)])
        assert p.wait(timeout=600) == -signal.SIGKILL, p.stderr.read()[-3000:]
        faults += 1
    last = _cli(*run)
    assert last.wait(timeout=600) == 0, last.stderr.read()[-3000:]
    assert faults == 4
    lines = (tmp_path / "b" / "metrics.jsonl").read_text().splitlines()
    assert all(json.loads(line) for line in lines)  # no torn line left
    a, b = read_metrics(str(tmp_path / "a")), read_metrics(str(tmp_path / "b"))
    assert [r["step"] for r in b] == list(range(1, 11))  # no step twice, none missing
    # exact: each resume runs the same programs on the same shapes and restored state
    assert without_timing(a) == without_timing(b)
    pa, pb = _final_params(str(tmp_path / "a"), 10), _final_params(str(tmp_path / "b"), 10)
    leaves = zip(jax.tree.leaves(pa), jax.tree.leaves(pb), strict=True)
    assert all(np.array_equal(np.asarray(x), np.asarray(y)) for x, y in leaves)


def group_terminating_parity(response, problem):
    """Parity of length, as a reward (`reward.fn`); the first item scored after the test
    creates the flag file sends SIGTERM to the run's whole process group, as a terminal or
    SLURM signals every process of a run: it lands on the verifier workers mid-scoring."""
    try:
        os.remove(os.environ["TEST_SIGTERM_FLAG"])
    except FileNotFoundError:
        pass
    else:
        os.killpg(os.getpgrp(), signal.SIGTERM)
    return float(len(response) % 2)


def test_sigterm_to_every_process_checkpoints_the_step_and_says_how_to_resume(tmp_path):
    flag = tmp_path / "sigterm"
    run = [*ARGS, "--config.train.checkpoint_every=1000", "--workdir", str(tmp_path / "run")]
    run += ["--config.reward.fn=test_reliability:group_terminating_parity"]
    env = subprocess_env(TEST_SIGTERM_FLAG=str(flag))
    p = subprocess.Popen(  # its own process group: the signal reaches the run alone
        [sys.executable, "-m", "explore_rl.main", *run, "--config.train.steps=1000"],
        env=env, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    metrics = tmp_path / "run" / "metrics.jsonl"
    deadline = time.monotonic() + 300
    while not (metrics.exists() and metrics.read_text().count("\n") >= 2):
        assert p.poll() is None and time.monotonic() < deadline, p.stderr.read()[-3000:]
        time.sleep(0.2)
    flag.touch()
    assert p.wait(timeout=300) != 0
    err = p.stderr.read()
    rows = read_metrics(str(tmp_path / "run"))
    step = len(rows)
    assert f"stopped by SIGTERM after step {step}, checkpoint saved: rerun the same" in err
    assert not flag.exists()  # the signal was sent during a step's scoring
    # the workers finished that step's items: none lost to a killed worker
    assert [r["rollout/verifier_timeouts"] for r in rows] == [0] * step
    assert checkpoint_lib.Checkpointer(str(tmp_path / "run")).latest_step() == step
    again = subprocess.Popen(
        [sys.executable, "-m", "explore_rl.main", *run, f"--config.train.steps={step + 1}"],
        env=env, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert again.wait(timeout=600) == 0, again.stderr.read()[-3000:]
    assert [r["step"] for r in read_metrics(str(tmp_path / "run"))] == list(range(1, step + 2))


def eval_terminating_parity(response, problem):
    """Parity of length; the first held-out question scored while the flag file exists
    sends SIGTERM to the run's process group: it lands inside an evaluation."""
    expression = problem.question.removeprefix("What is ").removesuffix("?")
    if tasks.split_of(expression) == "test":  # how the task splits its questions
        return group_terminating_parity(response, problem)
    return float(len(response) % 2)


def test_sigterm_during_an_evaluation_stops_it_at_the_next_batch(tmp_path):
    """The evaluation after step 1 (4 batches of one question) is stopped before its second
    batch, step 1 is checkpointed without a partial evaluation logged, and the message says
    how to evaluate it; the rerun resumes."""
    flag = tmp_path / "sigterm"
    flag.touch()
    run = [*ARGS, "--config.train.eval_every=1", "--config.eval.batch_prompts=1"]
    run += ["--config.reward.fn=test_reliability:eval_terminating_parity"]
    run += ["--workdir", str(tmp_path / "run")]
    env = subprocess_env(TEST_SIGTERM_FLAG=str(flag))
    p = subprocess.Popen(  # its own process group: the signal reaches the run alone
        [sys.executable, "-m", "explore_rl.main", *run, "--config.train.steps=1000"],
        env=env, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    assert p.wait(timeout=600) != 0
    err = p.stderr.read()
    assert not flag.exists(), err[-3000:]  # sent while scoring a held-out question
    assert (
        "stopped by SIGTERM after step 1 (its evaluation cut short, not logged: --mode eval "
        f"--config.eval.checkpoint={tmp_path / 'run'} --config.eval.step=1 runs it), "
        "checkpoint saved: rerun the same command to resume"
    ) in err, err[-3000:]
    rows = read_metrics(str(tmp_path / "run"))
    assert [r["step"] for r in rows] == [1]
    assert not [k for k in rows[0] if k.startswith("eval/")]
    assert checkpoint_lib.Checkpointer(str(tmp_path / "run")).latest_step() == 1
    again = subprocess.Popen(
        [sys.executable, "-m", "explore_rl.main", *run, "--config.train.steps=2"],
        env=env, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert again.wait(timeout=600) == 0, again.stderr.read()[-3000:]
    rows = read_metrics(str(tmp_path / "run"))
    assert [r["step"] for r in rows] == [1, 2]
    assert "eval/average/mean@2" in rows[1]


def test_a_full_disk_keeps_the_previous_checkpoint_and_says_so(tmp_path):
    run = [*ARGS, "--workdir", str(tmp_path), "--config.train.steps=2"]
    p = _cli(*run, driver=["full", "2"])
    _, err = p.communicate(timeout=600)
    assert p.returncode == 2, err[-3000:]
    # the storage layer's late completions (63 "Event loop is closed" tracebacks) are not
    # shown: the one line says it all
    assert "Traceback" not in err and "Event loop is closed" not in err, err[-3000:]
    last = err.strip().splitlines()[-1]
    assert last.startswith("error: checkpoint 2 was not written to"), last
    assert "(File too large); the newest complete checkpoint, step 1, is intact" in last
    assert checkpoint_lib.Checkpointer(str(tmp_path)).latest_step() == 1
    kept = snapshot(tmp_path / "checkpoints" / "1")
    again = _cli(*run)
    assert again.wait(timeout=600) == 0, again.stderr.read()[-3000:]
    assert [r["step"] for r in read_metrics(str(tmp_path))] == [1, 2]
    assert snapshot(tmp_path / "checkpoints" / "1") == kept  # the resume read it, intact


def nan_reward(response, problem):
    return float("nan")


def test_non_finite_updates_stop_the_run_with_a_reason(tmp_path):
    c = grpo.get_config("smoke")
    c.reward.fn, c.train.max_skipped_updates = "test_reliability:nan_reward", 4
    c.train.steps, c.train.eval_every = 10, 0
    with pytest.raises(RuntimeError, match=r"4 updates in a row skipped .*\(through step 2"):
        loop.train(config_lib.spec(c), str(tmp_path))


@pytest.fixture(scope="module")
def existing_run(tmp_path_factory):
    """A finished smoke run: every bad input below is pointed at it and must leave it as
    it was."""
    folder = tmp_path_factory.mktemp("existing")
    c = grpo.get_config("smoke")
    c.train.steps, c.train.eval_every = 1, 0
    loop.train(config_lib.spec(c), str(folder))
    return folder


def test_a_run_on_a_cached_base_model_resumes_after_its_folder_is_renamed(tmp_path):
    """The base model's cache folder is named by a digest of its recipe's whole config, so a
    setting added to the code renames it; the run is its recipe (model.base, the task), and
    a resume reads its checkpoint, not model.path. Another recipe is still refused."""
    c = grpo.get_config("smoke")
    c.model.base, c.model.path = "configs/lab.py:sft", "/cache/base/f89034def5b12451968d"
    (tmp_path / "config.json").write_text(json.dumps(config_lib.resolve(c).record))
    c.model.path = "/cache/base/a8bfbaa2b9ef46bb8042"
    build.check_same_run(config_lib.resolve(c), str(tmp_path))
    c.model.base = "configs/lab.py:sft,smoke"
    with pytest.raises(ValueError, match=r"another config \(model.base: 'configs/lab.py:sft'"):
        build.check_same_run(config_lib.resolve(c), str(tmp_path))
    c.model.base = ""  # a model named by its folder: the folder is the model
    (tmp_path / "config.json").write_text(json.dumps(config_lib.resolve(c).record))
    c.model.path = "/cache/base/f89034def5b12451968d"
    with pytest.raises(ValueError, match=r"another config \(model.path"):
        build.check_same_run(config_lib.resolve(c), str(tmp_path))


def test_work_directories_and_checkpoints_of_another_run_are_refused(existing_run, tmp_path):
    before = snapshot(existing_run)
    c = grpo.get_config("smoke")
    c.rl.eps_high = 0.4
    with pytest.raises(ValueError, match=r"holds a run of another config \(rl.eps_high: 0.28"):
        loop.train(config_lib.spec(c), str(existing_run))
    c = grpo.get_config("smoke")
    c.rollout.slots, c.rollout.decode_chunk = 3, 2  # how rollouts are scheduled: resumable
    build.check_same_run(config_lib.spec(c), str(existing_run))
    c = grpo.get_config("smoke")
    c.model.random_init = "tiny-qwen2"
    c.eval.checkpoint = str(existing_run)
    with pytest.raises(ValueError, match="k_bias in the checkpoint .a run of another model"):
        eval_mode.run_eval(config_lib.spec(c), None)
    (tmp_path / "file").write_text("not a folder")
    with pytest.raises(ValueError, match="a file, not a folder"):
        loop.train(config_lib.spec(grpo.get_config("smoke")), str(tmp_path / "file"))
    with pytest.raises(ValueError, match="a file, not a folder"):  # before it evaluates
        eval_mode.run_eval(config_lib.spec(grpo.get_config("smoke")), str(tmp_path / "file"))
    assert snapshot(existing_run) == before


def test_a_user_error_on_the_cli_is_one_line_and_exit_2(tmp_path):
    from helpers import run_main

    out = run_main(
        "--config", "configs/grpo.py:smoke", "--workdir", str(tmp_path),
        "--config.rollout.top_p=1.5",
    )  # fmt: skip
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert (
        out.stderr.strip().splitlines()[-1].startswith("error: config: rollout.top_p=1.5: must be")
    )
    out = run_main("--config", "configs/grpo.py:smoke", "--config.rollout.tempreature=1")
    assert out.returncode == 2 and out.stderr.strip() == (
        "error: --config.rollout.tempreature: no such config field "
        "(did you mean rollout.temperature?)"
    )
    out = run_main("--config", "configs/grpo.py:smoke", "--config.train.prune_checkpoints=maybe")
    assert out.returncode == 2 and out.stderr.strip() == (  # was absl's, exit status 1
        "error: --config.train.prune_checkpoints=maybe: not a boolean (True or False)"
    )


def test_a_run_that_predates_a_new_config_field_resumes(existing_run, tmp_path):
    old = tmp_path / "old"
    shutil.copytree(existing_run, old)
    config = json.loads((old / "config.json").read_text())
    del config["task"]["long_prompts"]  # written before the field existed
    (old / "config.json").write_text(json.dumps(config))
    c = grpo.get_config("smoke")
    c.train.steps, c.train.eval_every = 2, 0
    loop.train(config_lib.spec(c), str(old))
    assert [r["step"] for r in read_metrics(str(old))] == [1, 2]


HOLD = textwrap.dedent("""
    import sys, time
    from explore_rl.checkpoint import only_writer
    with only_writer(sys.argv[1]):
        print("held", flush=True)
        time.sleep(600)
""")


def test_one_run_per_work_directory_and_a_killed_holder_leaves_no_lock(existing_run, tmp_path):
    """A second process on a run directory in use stops with one line naming the holder
    and changes nothing; once the holder is killed (-9: no chance to clean up), the
    directory is free again; a run ends with the lock file empty (its bytes do not depend
    on who ran it)."""
    before = snapshot(existing_run)
    assert before[".lock"] == hashlib.sha256(b"").hexdigest()
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(existing_run)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        out = run_main(*ARGS, "--config.train.steps=2", "--workdir", str(existing_run))
        last = out.stderr.strip().splitlines()[-1]
        assert out.returncode == 2, out.stderr[-3000:]
        assert last.startswith(f"error: --workdir {existing_run} is in use by pid {holder.pid} on ")
        # evaluation and sampling write their folder too: refused there before any model
        # is read (a sample's folder may not be a run's at all: its config.json is the run's)
        c = testing.smoke()
        with pytest.raises(ValueError, match=f"in use by pid {holder.pid} on "):
            eval_mode.run_eval(config_lib.spec(c), str(existing_run))
        out = run_main("--mode", "sample", *ARGS, "--workdir", str(existing_run))
        assert out.returncode == 2 and out.stderr.strip().splitlines()[-1].startswith(
            f"error: --workdir {existing_run}: inside the run directory {existing_run}; "
            "sample elsewhere"
        )
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=60)
    finally:
        holder.kill()
    assert snapshot(existing_run) != before  # the dead holder's name is still in the file
    with checkpoint_lib.only_writer(str(existing_run)):
        with pytest.raises(ValueError, match="is in use by pid"):  # one writer per process too
            with checkpoint_lib.only_writer(str(existing_run)):
                pass
    samples = str(tmp_path / "samples")  # a sampling folder in use: refused before the model
    with checkpoint_lib.only_writer(samples):
        with pytest.raises(ValueError, match=f"--workdir {samples} is in use by pid"):
            sample_mode.run_sample(config_lib.spec(testing.smoke()), samples)
    assert snapshot(existing_run) == before


def test_a_runs_best_checkpoint_is_a_path_the_config_takes(tmp_path):
    """`eval.checkpoint=<run>/checkpoints/best` names the run's best step, which
    `checkpoint.locate` resolves (`--mode eval` and `--mode export` alike): no file of that
    name exists, and the path check must not refuse it; beside no checkpoints folder it
    names nothing."""
    (tmp_path / "run" / "checkpoints").mkdir(parents=True)
    c = grpo.get_config("smoke")
    c.eval.checkpoint = str(tmp_path / "run" / "checkpoints" / "best")
    assert config_lib.spec(c).eval.checkpoint == c.eval.checkpoint
    c.eval.checkpoint = str(tmp_path / "other" / "checkpoints" / "best")
    with pytest.raises(ValueError, match=r"^config: eval.checkpoint=.*: no such file or folder"):
        config_lib.spec(c)
