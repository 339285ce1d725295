"""`memory`: the memory per device a config's run estimates at start (`rl/footprint.py`)
against what its steps (`--steps`, at least 2) measure: the device's peak memory in use,
or on a CPU the process's peak RSS during the last step (the first compiles: the compiler's
heap is host memory, not the run's) less its RSS before the run (`--random-init PRESET`
keeps a model file from being mapped into memory).
"""

from __future__ import annotations

import functools
import json
import tempfile
import time

import jax

from explore_rl import memory, parallel
from explore_rl.bench.common import (
    device_peak_bytes,
    reset_peak_rss,
    rss_bytes,
)

HELP = "the start-up memory estimate vs the measured peak"


def add_arguments(p) -> None:
    p.add_argument("--config", default="configs/grpo.py:demo")
    p.add_argument("--random-init", default="", help="a preset: random weights of its shape")
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--set", action="append", default=[], help="KEY=VALUE: a config field")


def run(args) -> dict:
    """The start-up memory estimate against the measured peak of a config's first steps."""
    from explore_rl import config as config_lib
    from explore_rl.exploration import base as exploration
    from explore_rl.train import build, steps

    c = config_lib.load(args.config)
    c.model.random_init = args.random_init or c.model.random_init
    c.train.eval_every = 0
    for item in args.set:  # KEY=VALUE, the value in the field's own type
        key, value = item.split("=", 1)
        *path, name = key.split(".")
        section = functools.reduce(getattr, path, c)
        old = getattr(section, name)
        setattr(section, name, value if isinstance(old, str) else type(old)(json.loads(value)))
    spec = config_lib.spec(c)
    before = 0 if device_peak_bytes() is not None else rss_bytes()
    with (
        tempfile.TemporaryDirectory() as workdir,
        spec.reward.verifier() as verifier,
        parallel.use(mesh := spec.mesh.make()),
    ):
        run, progress, _ = build.start(spec, exploration.build(spec), workdir, verifier, mesh)
        for step in range(args.steps):
            if step == args.steps - 1 and before:  # the compiler's heap is not the run's
                memory.trim()
                reset_peak_rss()
            t0 = time.perf_counter()
            progress, _, _ = steps.train_one_step(run, progress, step)
        jax.block_until_ready(progress)
        last_step = time.perf_counter() - t0
    estimate = run.memory_estimate
    measured = rss_bytes("VmHWM") - before if before else device_peak_bytes()
    return {
        "bench": "memory",
        "config": args.config,
        "random_init": c.model.random_init,
        "set": args.set,
        "steps": args.steps,
        "terms_gib": estimate.record()["terms_gib"],
        "estimate_gib": round(estimate.peak / 2**30, 3),
        "measured_gib": round(measured / 2**30, 3),
        "measured": "peak RSS of the last step - RSS before the run"
        if before
        else "peak device memory",
        "estimate_over_measured": round(estimate.peak / measured, 3),
        "last_step_s": round(last_step, 2),  # compiled: its rollout, scoring and update
    }


# The long-context benchmark's two ways of running the model: today's memory settings for
# the papers' lengths (`configs/base.paper_memory`), and the whole dense path (every score,
# activation and logit kept), which is what the model did before them.
