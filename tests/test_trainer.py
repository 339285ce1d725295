"""The trainer end to end: the smoke CLI, exact resume, config validation."""

import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from configs import grpo
from explore_rl import config as config_lib
from explore_rl.logs import read_metrics
from explore_rl.rl import trainer

pytestmark = pytest.mark.slow


def test_smoke_cli_writes_the_run_directory_and_reruns(tmp_path):
    cmd = [
        sys.executable,
        "-m",
        "explore_rl.main",
        "--config",
        "configs/grpo.py:smoke",
        "--workdir",
        str(tmp_path),
    ]
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    names = set(os.listdir(tmp_path))
    assert {"config.json", "metrics.jsonl", "checkpoints", "samples"} <= names
    assert any(n.startswith("events.out.tfevents") for n in names)
    assert sorted(os.listdir(tmp_path / "checkpoints")) == ["2", "3"]
    rows = read_metrics(str(tmp_path))
    assert [r["step"] for r in rows] == [1, 2, 3]
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
    again = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0 and len(read_metrics(str(tmp_path))) == 3  # resumed at the end


def _demo_config(steps):
    c = grpo.get_config("demo")
    c.rollout.prompts, c.rollout.group_size, c.rollout.max_new_tokens = 2, 4, 12
    c.train.steps, c.train.checkpoint_every, c.train.eval_every = steps, 2, 0
    c.reward.workers = 1
    return c


def test_resume_continues_exactly(tmp_path):
    straight = trainer.train(_demo_config(4), str(tmp_path / "a"))
    trainer.train(_demo_config(2), str(tmp_path / "b"))  # "killed" after step 2
    resumed = trainer.train(_demo_config(4), str(tmp_path / "b"))
    a, b = read_metrics(str(tmp_path / "a")), read_metrics(str(tmp_path / "b"))
    assert [r["step"] for r in b] == [1, 2, 3, 4]
    drop = ("time/", "perf/")
    for ra, rb in zip(a, b):
        assert {k: v for k, v in ra.items() if not k.startswith(drop)} == {
            k: v for k, v in rb.items() if not k.startswith(drop)
        }
    assert any(r["groups/zero_adv_frac"] < 1 for r in a)  # real updates happened
    for x, y in zip(jax.tree.leaves(straight.state), jax.tree.leaves(resumed.state)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    assert int(straight.data_position) == int(resumed.data_position) == 8


def test_config_validation_messages():
    c = grpo.get_config("smoke")
    c.rollout.group_size = 1
    with pytest.raises(ValueError, match="group_size=1"):
        config_lib.validate(c)
    c = grpo.get_config("smoke")
    c.rl.aggregation = "mean"
    with pytest.raises(ValueError, match="aggregation='mean'"):
        config_lib.validate(c)
    c = grpo.get_config("smoke")
    c.optim.micro_batches = 3
    with pytest.raises(ValueError, match="micro_batches=3 must divide"):
        config_lib.validate(c)
    with pytest.raises(ValueError, match="allowed smoke, demo, paper"):
        grpo.get_config("huge")
