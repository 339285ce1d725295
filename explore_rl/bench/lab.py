"""`lab`: the exploration lab's regime on this machine (configs/lab.py).

    python -m explore_rl.bench lab [--config configs/lab.py] [--set task.countdown.inputs=3]

The base model's build (supervised fine-tuning once per recipe, `train.base_model`; 0 s
when it is cached), then the base model on the whole held-out test set, `--samples` samples
a question at the evaluation's temperature: Pass@1, Pass@k for k up to `--samples`, and the
share of groups of `--group` samples whose rewards are all equal (zero advantage under
GRPO: no gradient), over all questions and over those with and without a solution of the
kind SFT saw (`Problem.solution`: Countdown's division-free chains). Last, `--rl-steps`
GRPO steps from the base, each timed whole and split into rollout (with rewards), pi_old,
update and the rest (host work: advantages, batching, metrics); the first step compiles
and is not counted.
"""

from __future__ import annotations

import ast
import statistics
import tempfile
import time

import jax
import numpy as np

HELP = "the lab's base model: build time, Pass@1 / Pass@k, zero-advantage groups, RL steps"


def add_arguments(p) -> None:
    p.add_argument("--config", default="configs/lab.py")
    p.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE",
        help="a config override, as --config.KEY=VALUE (repeatable)",
    )  # fmt: skip
    p.add_argument("--samples", type=int, default=64, help="samples per test question")
    p.add_argument("--group", type=int, default=8, help="GRPO's group size")
    p.add_argument("--rl-steps", type=int, default=6, help="RL steps timed (+1 compiling)")


def check(args) -> str | None:
    if args.samples % args.group:
        return f"--samples {args.samples}: not a multiple of --group {args.group}"
    if args.rl_steps < 1:
        return f"--rl-steps {args.rl_steps}: at least 1 (the first step compiles, not counted)"
    bad = [s for s in args.set if "=" not in s]
    return f"--set {bad[0]}: give KEY=VALUE" if bad else None


def run(args) -> dict:
    from explore_rl import config as config_lib
    from explore_rl.train import base_model

    c = config_lib.load(args.config)
    for item in args.set:
        key, value = item.split("=", 1)
        _assign(c, key, value)
    t0 = time.perf_counter()
    c = base_model.resolve(c)
    out = {"config": args.config, "overrides": args.set, "base_build_s": time.perf_counter() - t0}
    out.update(_base_model_quality(c, args.samples, args.group))
    out.update(_rl_steps(c, args.rl_steps))
    return out


def _assign(c, key: str, value: str) -> None:
    *parents, last = key.split(".")
    for p in parents:
        c = c[p]
    try:
        parsed = ast.literal_eval(value)
    except (ValueError, SyntaxError):
        parsed = value  # a string
    c[last] = type(c[last])(parsed)


def _base_model_quality(c, samples: int, group: int) -> dict:
    from explore_rl import config as config_lib
    from explore_rl.evaluation.evaluate import evaluate
    from explore_rl.spec import replace

    spec = replace(config_lib.spec(c), **{"eval.samples": samples})
    params, cfg, tok = spec.model.load(spec.seed)
    spec = spec.with_stop_ids(tok.stop_ids)  # generations end at EOS, as a run's evaluation
    _, tests = spec.problems()
    records: list[dict] = []
    t0 = time.perf_counter()
    with spec.reward.verifier() as v:
        evaluate(params, cfg, tok, tests, spec, v, jax.random.key(spec.seed), records=records)
    seconds = time.perf_counter() - t0
    correct = np.array([r["correct"] for r in records], float).reshape(-1, samples)
    solved = {p.question: bool(p.solution) for ps in tests.values() for p in ps}
    seen = np.array([solved[r["question"]] for r in records[::samples]])  # those evaluated
    out = {"test_questions": len(correct), "samples": samples, "eval_s": seconds}
    for part, rows in (("all", slice(None)), ("seen", seen), ("unseen", ~seen)):
        if not correct[rows].size:
            continue
        groups = correct[rows].reshape(-1, group)
        out[part] = {
            "questions": len(correct[rows]),
            "pass@1": float(correct[rows].mean()),
            f"pass@{samples}": float(correct[rows].any(axis=1).mean()),
            "zero_advantage_groups": float((groups.min(axis=1) == groups.max(axis=1)).mean()),
        }
    return out


def _rl_steps(c, steps: int) -> dict:
    from explore_rl import config as config_lib
    from explore_rl import testing
    from explore_rl.train import steps as steps_lib

    spec = config_lib.spec(c)
    with tempfile.TemporaryDirectory() as workdir, spec.reward.verifier() as v:
        run, progress = testing.start(spec, workdir, v)[:2]
        timed = ("rollout_s", "pi_old_s", "update_s")
        parts = {k: [] for k in ("step_s", *timed, "host_s")}
        for step in range(steps + 1):
            t0 = time.perf_counter()
            progress, metrics, _ = steps_lib.train_one_step(run, progress, step)
            if step:  # the first compiles
                parts["step_s"].append(time.perf_counter() - t0)
                for k in timed:
                    parts[k].append(metrics[f"time/{k}"])
                rest = parts["step_s"][-1] - sum(metrics[f"time/{k}"] for k in timed)
                parts["host_s"].append(rest)
    med = {k: statistics.median(v) for k, v in parts.items()}
    shares = {k: med[k] / med["step_s"] for k in (*timed, "host_s")}
    r = spec.rollout
    return {
        "rl_step": f"{r.prompts} prompts x {r.group_size} rollouts x <= "
        f"{r.sampling.max_new_tokens} tokens",
        "rl_step_s_median": med["step_s"],
        "rl_step_share": shares,
    }
