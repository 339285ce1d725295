"""The measurements behind BENCHMARKS.md's `fit` and `long` sections, with one command:

    python results/long_context/long_context.py [--out results/long_context]

- `bench fit`: every paper config's memory per device on one node of 8 x 80 GB, by the
  start-up estimate (shapes only);
- `bench long`: the update's and the prefill's peak memory against the length (512 to
  8192 tokens on SmolLM2-135M's first two layers), dense (every score, activation and
  logit kept: the model before its long-context settings) and long (blockwise attention,
  remat, chunked log-probs), measured and estimated, with the fitted exponent and the
  update's tokens/s.

Writes each benchmark's JSON, a figure (`results/long_context/memory.png`) and
prints the Markdown tables BENCHMARKS.md carries. A finished benchmark's JSON is reused
(delete it to measure again).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run(name: str, args: list[str], out: str) -> dict:
    path = os.path.join(out, f"{name}.json")
    if not os.path.exists(path):
        done = subprocess.run(
            [sys.executable, "-m", "explore_rl.bench", *args],
            capture_output=True, text=True, check=True, cwd=ROOT,
        )  # fmt: skip
        with open(path, "w") as f:
            f.write(done.stdout.strip().splitlines()[-1] + "\n")
    with open(path) as f:
        return json.load(f)


def fit_table(result: dict) -> str:
    lines = [
        f"Node: {result['node']} (mesh fsdp = 8); {result['machine']}.",
        "",
        "| config | model | rows x (prompt + response) | decode slots | update / device "
        "| KV cache / device | peak / device | fits |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        lines.append(
            f"| `{r['config']}` | {r['model']} | {r['rows']} x ({r['prompt + response']}) "
            f"| {r['decode_slots']} | {r['update_gib']} GiB | {r['kv_cache_gib']} GiB "
            f"| {r['peak_gib']} GiB | {'yes' if r['fits'] else 'no'} |"
        )
    return "\n".join(lines)


def long_table(result: dict) -> str:
    lines = [
        f"{result['preset']}; {result['runs'][0]['machine']}.",
        "",
        "| mode | tokens | update peak, measured | estimate / measured | prefill peak, "
        "measured | estimate / measured | update tokens/s |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in result["runs"]:
        lines.append(
            f"| {r['mode']} | {r['length']} | {r['update_measured_gib']} GiB "
            f"| {r['update_estimate_over_measured']} | {r['prefill_measured_gib']} GiB "
            f"| {r['prefill_estimate_over_measured']} | {r['update_tokens_per_s']} |"
        )
    lines += ["", "Fitted exponent k of (peak - the length-free part) ~ tokens^k:", ""]
    lines += [f"- {k}: {'not fitted' if v is None else v}" for k, v in result["exponents"].items()]
    return "\n".join(lines)


def figure(result: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, phase in zip(axes, ("update", "prefill")):
        for mode, color in (("dense", "tab:red"), ("long", "tab:blue")):
            rs = [r for r in result["runs"] if r["mode"] == mode]
            xs = [r["length"] for r in rs]
            ax.plot(xs, [r[f"{phase}_measured_gib"] for r in rs], "o-", color=color,
                    label=f"{mode}, measured")  # fmt: skip
            ax.plot(xs, [r[f"{phase}_estimate_gib"] for r in rs], "x--", color=color,
                    label=f"{mode}, estimate")  # fmt: skip
        ax.set(xscale="log", yscale="log", xlabel="tokens", ylabel="peak GiB", title=phase)
        ax.legend()
    fig.suptitle(result["preset"], fontsize=9)
    fig.tight_layout()
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fig.savefig(path, dpi=120)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=os.path.join(ROOT, "results", "long_context"))
    args = parser.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    fit = run("fit", ["fit"], args.out)
    long = run("long", ["long"], args.out)
    figure(long, os.path.join(ROOT, "results", "long_context", "memory.png"))
    print(fit_table(fit), "\n")
    print(long_table(long))


if __name__ == "__main__":
    main()
