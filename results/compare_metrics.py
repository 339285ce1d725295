"""Two folders of run directories (results/behaviour.sh), compared key by key: each run's
metrics.jsonl values that differ, timing keys (seconds, tokens per second) aside.

    python results/compare_metrics.py runs/old runs/new
"""

import json
import os
import sys

TIMING = ("time/", "perf/")


def rows(run: str) -> list[dict]:
    with open(os.path.join(run, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


def main(a: str, b: str) -> None:
    for name in sorted(n for n in os.listdir(a) if os.path.isdir(os.path.join(a, n))):
        x, y = rows(os.path.join(a, name)), rows(os.path.join(b, name))
        steps = range(min(len(x), len(y)))
        keys = [(i, k) for i in steps for k in sorted(x[i].keys() | y[i].keys())]
        differ = [
            (i + 1, k) for i, k in keys
            if x[i].get(k) != y[i].get(k) and not k.startswith(TIMING) and not k.endswith("_s")
        ]  # fmt: skip
        print(f"{name}: steps {len(x)} / {len(y)}, values {len(keys)}, differ {len(differ)}"
              + (f" {differ[:5]}" if differ else ""))  # fmt: skip


if __name__ == "__main__":
    main(*sys.argv[1:3])
