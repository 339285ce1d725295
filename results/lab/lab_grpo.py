"""Plain GRPO in the lab: held-out Pass@1 from the base model over 300 steps, 5 seeds.

    python results/lab/lab_grpo.py [--runs runs/lab-grpo] [--out results/lab]

Trains `configs/lab.py:demo` (its base model first, once: `model.base`) for seeds 0-4, each
in `<runs>/s<seed>` (an interrupted run resumes; a finished one is read), then writes
`<out>/grpo_curve.md` (held-out Pass@1 and Pass@8 per evaluation, each seed
and the mean with its range) and `<out>/grpo_curve.png`. Step 0 is the base model
(`train.eval_before`). Every number in the table comes from the runs' metrics.jsonl.
"""

from __future__ import annotations

import argparse
import os

SEEDS = (0, 1, 2, 3, 4)
KEYS = ("eval/average/pass@1", "eval/average/pass@8")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", default="runs/lab-grpo")
    p.add_argument("--out", default="results/lab")
    args = p.parse_args(argv)

    from explore_rl import analysis, caching
    from explore_rl import config as config_lib
    from explore_rl.train import base_model, loop

    caching.enable_compilation_cache()
    paths = []
    for seed in SEEDS:
        c = config_lib.load("configs/lab.py:demo")
        c.seed = seed
        path = os.path.join(args.runs, f"s{seed}")
        loop.train(config_lib.spec(base_model.resolve(c)), path)
        paths.append(path)
    runs = analysis.load(paths)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "grpo_curve.md"), "w") as f:
        f.write(table(runs) + "\n")
    analysis.plot_curves(runs, KEYS).savefig(os.path.join(args.out, "grpo_curve.png"))


def table(runs) -> str:
    """Per evaluation step: each seed's value, the mean and the range, per key; then each
    seed's change from the base (step 0) to the last evaluation."""
    lines = []
    for key in KEYS:
        frame = {r.seed: r.metrics[key].dropna() for r in runs}
        steps = sorted({int(s) for v in frame.values() for s in v.index})
        lines += [f"\n{key}\n", "| step | " + " | ".join(f"seed {s}" for s in frame)
                  + " | mean | min | max |", "|---|" + "---|" * (len(frame) + 3)]  # fmt: skip
        for step in steps:
            values = [v.get(step) for v in frame.values()]
            shown = [v for v in values if v is not None]
            lines.append(
                f"| {step} | " + " | ".join("" if v is None else f"{v:.3f}" for v in values)
                + f" | {sum(shown) / len(shown):.3f} | {min(shown):.3f} | {max(shown):.3f} |"
            )  # fmt: skip
        gains = {s: v.iloc[-1] - v.iloc[0] for s, v in frame.items()}
        lines.append(
            f"\n{key}, last evaluation minus the base, per seed: "
            + ", ".join(f"seed {s} {g:+.3f}" for s, g in gains.items())
            + f"; improved on {sum(g > 0 for g in gains.values())} of {len(gains)} seeds"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
