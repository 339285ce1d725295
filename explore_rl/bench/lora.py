"""`lora`: a config's GRPO step with LoRA adapters of each rank (`--ranks`, on every linear
layer) against full fine-tuning's, their steps interleaved in one process (full, rank 1,
rank 8, ..., then again), so a shared machine's load falls on each alike. Per setting, the
median over `--steps` steps (after one that compiles) of the rollout's, pi_old's and the
update's seconds and the rollout's tokens, the step's ratio to full fine-tuning's, and what
trains: the trainable parameters and the optimizer's state (its arrays' elements).
Every run starts from the same weights and seed, so the settings sample alike until their
updates part them. Peak memory is a process's own: `bench memory --set model.lora.rank=R`.
"""

from __future__ import annotations

import contextlib
import statistics
import tempfile

from explore_rl import parallel

HELP = "a step's time with LoRA of each rank against full fine-tuning, interleaved"
PHASES = ("time/rollout_s", "time/pi_old_s", "time/update_s")


def add_arguments(p) -> None:
    p.add_argument("--config", default="configs/grpo.py:demo")
    p.add_argument("--ranks", type=int, nargs="+", default=[1, 8, 32])
    p.add_argument("--steps", type=int, default=4, help="timed steps a setting")


def check(args) -> str | None:
    if args.steps < 1 or any(r < 1 for r in args.ranks):
        return f"--steps {args.steps}, --ranks {args.ranks}: need at least 1 step, ranks >= 1"
    return None


def run(args) -> dict:
    from explore_rl import config as config_lib
    from explore_rl.exploration import base as exploration
    from explore_rl.models import lora
    from explore_rl.train import build, steps

    ranks = [0, *args.ranks]
    specs = {}
    for rank in ranks:
        c = config_lib.load(args.config)
        c.model.lora.rank, c.train.eval_every = rank, 0
        specs[rank] = config_lib.spec(c)
    times = {r: {k: [] for k in (*PHASES, "tokens")} for r in ranks}
    with contextlib.ExitStack() as stack:
        mesh = specs[0].mesh.make()
        stack.enter_context(parallel.use(mesh))
        state, sizes = {}, {}
        for rank, spec in specs.items():
            workdir = stack.enter_context(tempfile.TemporaryDirectory())
            verifier = stack.enter_context(spec.reward.verifier())
            run_, progress, _ = build.start(spec, exploration.build(spec), workdir, verifier, mesh)
            state[rank] = [run_, progress]
            sizes[rank] = {
                "trainable_params": _elements(lora.split(progress.state.params)[0]),
                "optimizer_state": _elements(progress.state.opt_state),
            }
        for step in range(args.steps + 1):  # step 0 compiles each setting's programs
            for rank in ranks:
                run_, progress = state[rank]
                progress, metrics, ro = steps.train_one_step(run_, progress, step)
                state[rank][1] = progress
                if step:
                    for k in PHASES:
                        times[rank][k].append(metrics[k])
                    times[rank]["tokens"].append(int(ro.out.mask.sum()))
    medians = {r: {k: statistics.median(v) for k, v in t.items()} for r, t in times.items()}
    step_s = {r: sum(m[k] for k in PHASES) for r, m in medians.items()}
    return {
        "bench": "lora",
        "config": args.config,
        "steps": args.steps,
        "settings": {
            "full" if r == 0 else f"rank {r}": {
                "step_s": round(step_s[r], 3),
                **{k.removeprefix("time/"): round(medians[r][k], 3) for k in PHASES},
                "tokens": medians[r]["tokens"],
                "step_over_full": round(step_s[r] / step_s[0], 3),
                **sizes[r],
            }
            for r in ranks
        },
    }


def _elements(tree) -> int:
    """The elements of a pytree's arrays (an optimizer's scalar step counts included)."""
    import jax

    return sum(int(x.size) for x in jax.tree.leaves(tree))
