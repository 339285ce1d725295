"""`fit`: each paper config's memory per device on one node of `--devices` x
`--capacity-gb`, by the start-up estimate (shapes only).
"""

from __future__ import annotations

import os

HELP = "each paper config's memory per device on one node"


def add_arguments(p) -> None:
    p.add_argument("--devices", type=int, default=8)
    p.add_argument("--capacity-gb", type=float, default=80.0)


PAPER_CONFIGS = ("grpo", "eden", "ead", "ase", "extra")


def paper_fit(spec: str, devices: int = 8, capacity_gb: float = 80.0):
    """A config's start-up estimate on one node of `devices` x `capacity_gb` (mesh fsdp =
    devices), from shapes only: the model is the preset its `model.path` names, the
    prompts as long as `rollout.max_prompt_len`. Returns (the run spec as sized: its
    slots a count, the Footprint)."""
    from explore_rl import config as config_lib
    from explore_rl.exploration import base as exploration
    from explore_rl.models import presets
    from explore_rl.rl.train_step import make_optimizer
    from explore_rl.train import sizing

    s = config_lib.resolve(config_lib.load(spec))
    cfg = presets.get_preset(os.path.basename(s.model.path).lower(), **s.model.run_settings())
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
        c, est = paper_fit(f"configs/{name}.py:paper", args.devices, args.capacity_gb)
        t, r = est.terms, c.rollout
        rows.append({
            "config": f"configs/{name}.py:paper",
            "model": os.path.basename(c.model.path),
            "rows": c.rollout.prompts * c.rollout.group_size,
            "prompt + response": f"{r.max_prompt_len} + {r.sampling.max_new_tokens}",
            "decode_slots": r.engine.slots or "all rows",
            "update_gib": round(sum(t[k] for k in footprint.UPDATE) / 2**30, 1),
            "kv_cache_gib": round(t["KV cache"] / 2**30, 1),
            "peak_gib": round(est.peak / 2**30, 1),
            "fits": est.fits,
        })  # fmt: skip
    return {"bench": "fit", "node": f"{args.devices} x {args.capacity_gb:g} GB", "rows": rows}
