"""`fit`: each paper config's memory per device on one node of `--devices` x
`--capacity-gb`, by the start-up estimate (shapes only), against the share of each device
JAX may use (`XLA_PYTHON_CLIENT_MEM_FRACTION`, 0.75 by default; `--fraction` or the
variable changes it); a config that does not fit is given the settings that would fit it.

    python -m explore_rl.bench fit
    XLA_PYTHON_CLIENT_MEM_FRACTION=0.95 python -m explore_rl.bench fit --devices 8
"""

from __future__ import annotations

import os

HELP = "each paper config's memory per device on one node"


def add_arguments(p) -> None:
    p.add_argument("--devices", type=int, default=8)
    p.add_argument("--capacity-gb", type=float, default=80.0)
    p.add_argument(
        "--fraction", type=float, default=None,
        help="share of each device JAX may use (default: XLA_PYTHON_CLIENT_MEM_FRACTION or 0.75)",
    )  # fmt: skip
    p.add_argument("--lora-rank", type=int, default=0, help="LoRA adapters of this rank")
    p.add_argument("--model", default="", help="another preset's shape (qwen2.5-math-7b)")
    p.add_argument("--param-dtype", default="", help="the weights' dtype; default: the config's")


PAPER_CONFIGS = ("grpo", "eden", "ead", "ase", "extra")


def paper_fit(
    spec: str, devices: int = 8, capacity_gb: float = 80.0, fraction=None, lora_rank: int = 0,
    model: str = "", param_dtype: str = "",
):  # fmt: skip
    """A config's start-up estimate on one node of `devices` x `capacity_gb`, of which
    `fraction` is usable (default `footprint.usable_fraction()`), mesh fsdp = devices, from
    shapes only: the model is the preset its `model.path` names (or `model`; its weights in
    `param_dtype`, default the config's), with LoRA adapters of `lora_rank` on every linear
    layer (0: none), the prompts as long as `rollout.max_prompt_len`. Returns (the run spec
    as sized: its slots a count, the Footprint, the settings that would make it fit: []
    where it fits)."""
    from explore_rl import config as config_lib
    from explore_rl.exploration import base as exploration
    from explore_rl.models import presets
    from explore_rl.rl import footprint
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
    share = footprint.usable_fraction() if fraction is None else fraction
    capacity = (int(share * capacity_gb * 1e9), f"{share:g} of {capacity_gb:g} GB")
    longest, explorers = s.rollout.max_prompt_len, exploration.build(s)
    sized, est = sizing.size(s, cfg, sizes, optimizer, longest, explorers, capacity)
    fixes = [] if est.fits else sizing.fixes(s, cfg, sizes, optimizer, longest, explorers, capacity)
    return sized, est, fixes


def run(args) -> dict:
    """Every paper config's memory per device on one node, by the start-up estimate."""
    from explore_rl.rl import footprint

    rows = []
    for name in PAPER_CONFIGS:
        c, est, fixes = paper_fit(
            f"configs/{name}.py:paper", args.devices, args.capacity_gb, args.fraction,
            args.lora_rank, args.model, args.param_dtype,
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
            "usable_gib": round(est.capacity / 2**30, 1),
            "fits": est.fits,
            **({} if est.fits else {"would_fit_with": fixes or "nothing tried fits"}),
        })  # fmt: skip
    share = footprint.usable_fraction() if args.fraction is None else args.fraction
    node = f"{args.devices} x {args.capacity_gb:g} GB, {share:g} of each usable"
    return {"bench": "fit", "node": node, "lora_rank": args.lora_rank,
            "param_dtype": args.param_dtype or "the config's", "rows": rows}  # fmt: skip
