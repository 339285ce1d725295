"""Compare training runs: one markdown row per configuration, averaged over its seeds.

    python -m explore_rl.evaluation.report runs/cmp/*            # run dirs named <label>-s<seed>
    python -m explore_rl.evaluation.report runs/cmp/* --curve reward/mean   # per step

Runs whose directory names differ only in a trailing `-s<seed>` are one configuration.
Per run: reward and zero-advantage group fraction over the first and the last `window`
steps, token entropy of the last window, the ratio-clip fractions over all steps, and the
held-out metrics of the last evaluation; each cell is the mean over seeds, +- their sample
standard deviation, with the per-seed values after it.
"""

from __future__ import annotations

import argparse
import os
import re
from collections import defaultdict

import numpy as np

from explore_rl.logs import read_metrics

COLUMNS = [
    ("reward first", "reward/mean", "first"),
    ("reward last", "reward/mean", "last"),
    ("zero-adv first", "groups/zero_adv_frac", "first"),
    ("zero-adv last", "groups/zero_adv_frac", "last"),
    ("entropy last", "rollout/entropy", "last"),
    ("clip low", "policy/clip_frac_low", "all"),
    ("clip high", "policy/clip_frac_high", "all"),
    ("Pass@1", "eval/average/pass@1", "eval"),
    ("Pass@8", "eval/average/pass@8", "eval"),
]


def summarise(rows: list[dict], window: int) -> dict[str, float]:
    """One run's cells (NaN where the run did not log the metric)."""
    evals = [r for r in rows if any(k.startswith("eval/") for k in r)]
    out = {}
    for name, key, where in COLUMNS:
        part = {"first": rows[:window], "last": rows[-window:], "all": rows, "eval": evals[-1:]}[
            where
        ]
        values = [r[key] for r in part if key in r]
        out[name] = float(np.mean(values)) if values else float("nan")
    return out


def label(path: str) -> str:
    return re.sub(r"-s\d+$", "", os.path.basename(os.path.normpath(path)))


def by_label(paths: list[str], fn) -> dict[str, list]:
    """{configuration: [fn(metrics rows) for each of its seeds]}."""
    runs = defaultdict(list)
    for path in sorted(paths):
        runs[label(path)].append(fn(read_metrics(path)))
    return runs


def table(paths: list[str], window: int = 3) -> str:
    runs = by_label(paths, lambda rows: summarise(rows, window))
    head = ["run", "seeds", *(name for name, _, _ in COLUMNS)]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, cells in runs.items():
        row = [name, str(len(cells))]
        for col, _, _ in COLUMNS:
            values = [c[col] for c in cells]
            each = "/".join(f"{v:.2f}" for v in values)
            spread = f" ±{np.std(values, ddof=1):.3f}" if len(values) > 1 else ""
            row.append(f"{np.mean(values):.3f}{spread} ({each})")
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def curve(paths: list[str], key: str) -> str:
    """Per-step mean over seeds of `key`, one markdown row per configuration."""
    runs = by_label(paths, lambda rows: [r.get(key, np.nan) for r in rows])
    steps = max(len(v) for vs in runs.values() for v in vs)
    lines = [f"| {key} \\ step | " + " | ".join(map(str, range(1, steps + 1))) + " |"]
    lines.append("|" + "---|" * (steps + 1))
    for name, values in runs.items():
        padded = np.full((len(values), steps), np.nan)
        for i, v in enumerate(values):
            padded[i, : len(v)] = v
        seen = np.sum(~np.isnan(padded), axis=0)
        means = np.where(seen, np.nansum(padded, axis=0) / np.maximum(seen, 1), np.nan)
        lines.append(f"| {name} | " + " | ".join(f"{m:.2f}" for m in means) + " |")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("runs", nargs="+", help="run directories (with metrics.jsonl)")
    parser.add_argument("--window", type=int, default=3, help="steps averaged at each end")
    parser.add_argument("--curve", help="print this metric per step instead of the table")
    args = parser.parse_args(argv)
    print(curve(args.runs, args.curve) if args.curve else table(args.runs, args.window))


if __name__ == "__main__":
    main()
