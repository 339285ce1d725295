"""`results/gpu.sh`'s JSON lines as the Markdown table BENCHMARKS.md keeps ("GPU"): one
row a result, its goal beside it (update MFU >= 0.40 on the 1.5B shape, decode >= 0.5 of
the HBM bound, the start-up estimate within 15% of the measured peak).

    python results/tools/gpu_table.py OUT_DIR/gpu.jsonl
"""

import json
import sys


def _device(r: dict) -> list[str]:
    v = r["versions"]
    return [
        f"| device | {r['device']} x {r['devices']}, JAX {v['jax']}, Python {r['python']}; "
        f"cuDNN attention: {r['fused_kernel']}, auto picks it: {r['auto_picks_fused']} | "
        f"bf16 matmul {r['bf16_matmul_tflops']} TFLOP/s, bandwidth {r['bandwidth_gbs']} GB/s | |"
    ]


def _long(r: dict) -> list[str]:
    rows = []
    for run in r["runs"]:
        rows.append(
            f"| update, {r['preset']}, {run['length']} response tokens, {run['mode']} "
            f"({run['attention']}) | {run['update_tokens_per_s']:,} tokens/s, "
            f"**MFU {run['update_mfu']}**, peak {run['update_measured_gib']} GiB, "
            f"estimate / measured **{run['update_estimate_over_measured']}**, first call "
            f"{run['update_first_call_s']} s | MFU >= 0.40; estimate within 15% |"
        )
    return rows


def _sample(r: dict) -> list[str]:
    return [
        f"| decode, {r['random_init']} {r['dtype']}, {r['rows']} rows, {r['prompt_len']}-token "
        f"prompts, {r['new_tokens']} new | {r['decode_tokens_per_s']:,} tokens/s, "
        f"**{r['fraction_of_bandwidth_bound']} of the bandwidth bound** "
        f"({r['bandwidth_gbs']} GB/s), prefill {r['prefill_s']} s | >= 0.5 of the bound |"
    ]


def _memory(r: dict) -> list[str]:
    dtype = next((s.split("=")[1] for s in r["set"] if s.startswith("model.dtype=")), "float32")
    return [
        f"| a GRPO step of {r['config']}, random {r['random_init']}, {dtype} | estimate "
        f"{r['estimate_gib']} GiB, measured {r['measured_gib']} GiB: "
        f"**{r['estimate_over_measured']}** | within 15% |"
    ]


def _script(r: dict) -> list[str]:
    return [
        f"| gpu.sh | {r['seconds']} s; failed or stopped: {', '.join(r['failed']) or 'none'} | |"
    ]


ROWS = {"device": _device, "long": _long, "sample": _sample, "memory": _memory, "gpu.sh": _script}


def table(lines: list[str]) -> str:
    out = ["| result | measured | goal |", "|---|---|---|"]
    for line in lines:
        if line.strip():
            r = json.loads(line)
            out += ROWS[r["bench"]](r)
    return "\n".join(out)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    with open(sys.argv[1]) as f:
        print(table(f.readlines()))
