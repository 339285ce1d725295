"""A run of two real processes joined by `jax.distributed` on localhost: the same params as
the one-process run, one writer of the logs, and a resume of its checkpoint. The run is the
smoke config with ASE on: GRPO's whole step, each process reading its shard of the data,
and an explorer whose state (a vector bank) hosts read back and a checkpoint carries."""

import os
import socket
import subprocess
import sys

import jax
import numpy as np
import pytest
from helpers import run_main, subprocess_env

from configs import ase
from explore_rl import config as config_lib
from explore_rl import testing
from explore_rl.logs import read_metrics

pytestmark = pytest.mark.slow

# smoke scale, with a reward that gives mixed groups, so each step really updates
SMOKE = ["--config=configs/ase.py:smoke", "--config.train.eval_every=0",
         f"--config.reward.fn={testing.PARITY}"]  # fmt: skip


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(workdir, steps: int, processes: int = 2) -> list[str]:
    """The smoke run as `processes` CPU processes of one device each; their stderr."""
    port = _free_port()
    env = subprocess_env()  # one device per process
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "explore_rl.main",
                *SMOKE,
                f"--workdir={workdir}",
                f"--config.train.steps={steps}",
                f"--coordinator=127.0.0.1:{port}",
                f"--num_processes={processes}",
                f"--process_id={i}",
            ],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        for i in range(processes)
    ]
    errs = []
    for p in procs:
        try:
            _, err = p.communicate(timeout=600)
        finally:
            for q in procs:
                if q.poll() is None and p.returncode is None:
                    q.kill()
        errs.append(err)
        assert p.returncode == 0, err[-3000:]
    return errs


def final_state(workdir):
    """The newest checkpoint of `workdir` restored in this (one-device) process."""
    c = ase.get_config("smoke")
    c.train.eval_every, c.reward.fn = 0, testing.PARITY
    _, progress, ckpt = testing.start(c, str(workdir), None)
    ckpt.close()
    return progress


def test_two_processes_train_like_one_and_resume(tmp_path):
    two = tmp_path / "two"
    launch(two, steps=1)
    # one writer: one line a step, one TensorBoard file, and one holder of the directory's
    # lock (process 1 taking it too would have stopped with "in use"), released at the end
    assert [r["step"] for r in read_metrics(str(two))] == [1]
    assert (two / ".lock").read_text() == ""
    assert len([n for n in os.listdir(two) if n.startswith("events.out")]) == 1
    launch(two, steps=2)  # the same two processes resume step 1's checkpoint
    # the reference: one process holding the same mesh of two devices (fake CPU ones)
    one = tmp_path / "one"
    out = run_main(*SMOKE, f"--workdir={one}", "--config.train.steps=2",
                   devices=2)  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    a, b = final_state(one), final_state(two)
    assert int(b.state.step) == int(a.state.step) > 0
    # exact: the same programs, mesh and shapes whether two processes hold the devices or one
    for x, y in zip(jax.tree.leaves(a.state.params), jax.tree.leaves(b.state.params)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    banks = [(np.asarray(x), np.asarray(y)) for x, y in
             zip(jax.tree.leaves(a.explorers), jax.tree.leaves(b.explorers))]  # fmt: skip
    assert banks and all(x.shape == y.shape and np.array_equal(x, y) for x, y in banks)
    start = jax.tree.leaves(config_lib.resolve(ase.get_config("smoke")).model.load(0)[0])
    moved = [not np.array_equal(x, y) for x, y in zip(jax.tree.leaves(a.state.params), start)]
    assert any(moved)  # two real updates, not a comparison of untouched weights
    rows, ref = read_metrics(str(two)), read_metrics(str(one))
    assert [r["step"] for r in rows] == [1, 2]
    timing = lambda k: k.startswith(("time/", "perf/")) or k.endswith("_s")  # noqa: E731
    for r, s in zip(rows, ref):
        assert {k: v for k, v in r.items() if not timing(k)} == {
            k: v for k, v in s.items() if not timing(k)
        }
