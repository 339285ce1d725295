"""`fit`: each paper config's memory per device on one node of `--devices` x
`--capacity-gb`, by the start-up estimate (shapes only).
"""

from __future__ import annotations

import os

HELP = "each paper config's memory per device on one node"


def add_arguments(p) -> None:
    p.add_argument("--devices", type=int, default=8)
    p.add_argument("--capacity-gb", type=float, default=80.0)
    p.add_argument("--lora-rank", type=int, default=0, help="LoRA adapters of this rank")
    p.add_argument("--model", default="", help="another preset's shape (qwen2.5-math-7b)")
    p.add_argument("--param-dtype", default="", help="the weights' dtype; default: the config's")


PAPER_CONFIGS = ("grpo", "eden", "ead", "ase", "extra")


def paper_fit(
    spec: str, devices: int = 8, capacity_gb: float = 80.0, lora_rank: int = 0, model: str = "",
    param_dtype: str = "",
):  # fmt: skip
    """A config's start-up estimate on one node of `devices` x `capacity_gb` (mesh fsdp =
    devices), from shapes only: the model is the preset its `model.path` names (or
    `model`; its weights in `param_dtype`, default the config's), with LoRA adapters of
    `lora_rank` on every linear layer (0: none), the prompts as long as
    `rollout.max_prompt_len`. Returns (the run spec as sized: its slots a count, the
    Footprint)."""
    from explore_rl import config as config_lib
    from explore_rl.exploration import base as exploration
    from explore_rl.models import presets
    from explore_rl.rl.train_step import make_optimizer
    from explore_rl.train import sizing

    c = config_lib.load(spec)
    c.model.lora.rank = lora_rank
    c.model.param_dtype = param_dtype or c.model.param_dtype
    s = config_lib.resolve(c)
    preset = model or os.path.basename(s.model.path).lower()
    cfg = presets.get_preset(preset, **s.model.run_settings())
    sizes = {"data": 1, "fsdp": devices, "tensor": 1}
    optimizer = make_optimizer(s.optim)
    capacity = (int(capacity_gb * 1e9), f"{capacity_gb:g} GB")
    longest = s.rollout.max_prompt_len
    return sizing.size(s, cfg, sizes, optimizer, longest, exploration.build(s), capacity)


def run(args) -> dict:
    """Every paper config's memory per device on one node, by the start-up estimate."""
    from explore_rl.rl import footprint

    rows = []
    for name in PAPER_CONFIGS:
        c, est = paper_fit(
            f"configs/{name}.py:paper", args.devices, args.capacity_gb, args.lora_rank, args.model,
            args.param_dtype,
        )  # fmt: skip
        t, r = est.terms, c.rollout
        rows.append({
            "config": f"configs/{name}.py:paper",
            "model": args.model or os.path.basename(c.model.path),
            "rows": c.rollout.prompts * c.rollout.group_size,
            "prompt + response": f"{r.max_prompt_len} + {r.sampling.max_new_tokens}",
            "decode_slots": r.engine.slots or "all rows",
            "update_gib": round(sum(t[k] for k in footprint.UPDATE) / 2**30, 1),
            "kv_cache_gib": round(t["KV cache"] / 2**30, 1),
            "peak_gib": round(est.peak / 2**30, 1),
            "fits": est.fits,
        })  # fmt: skip
    node = f"{args.devices} x {args.capacity_gb:g} GB"
    return {"bench": "fit", "node": node, "lora_rank": args.lora_rank,
            "param_dtype": args.param_dtype or "the config's", "rows": rows}  # fmt: skip
