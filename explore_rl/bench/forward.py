"""`forward`, `sample` and `step` take `--model` (a folder, .gguf or "embedded") and
`--random-init PRESET` (random weights of a preset's shape, `--model`'s tokenizer: e.g.
`--random-init qwen2.5-math-7b` times a 7B shape with no checkpoint on disk).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from explore_rl.bench.common import (
    benchmarked_model,
    forward_flops,
    matmul_peak,
    timed,
)
from explore_rl.models import transformer, weights

HELP = "jitted forward throughput vs the matmul peak"


def add_arguments(p) -> None:
    p.add_argument("--model", default=weights.EMBEDDED)
    p.add_argument("--random-init", default="", help="a preset: random weights of its shape")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--length", type=int, default=128)
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    p.add_argument("--reps", type=int, default=5)


def run(args) -> dict:
    params, cfg, _ = benchmarked_model(args, param_dtype=args.dtype, dtype=args.dtype)
    tokens = jax.random.randint(jax.random.key(0), (args.batch, args.length), 0, cfg.vocab_size)
    mask = jnp.ones_like(tokens, bool)
    positions = transformer.positions_from_mask(mask)
    fwd = jax.jit(lambda p, t: transformer.forward(p, cfg, t, positions, mask).logits)
    peak = matmul_peak(args.dtype)
    seconds = timed(fwd, params, tokens, reps=args.reps)
    flops = forward_flops(cfg, args.batch, args.length)
    return {
        "bench": "forward",
        "model": args.model,
        "random_init": args.random_init,
        "dtype": args.dtype,
        "batch": args.batch,
        "length": args.length,
        "seconds": round(seconds, 4),
        "tokens_per_s": round(args.batch * args.length / seconds, 1),
        "achieved_gflops": round(flops / seconds / 1e9, 1),
        "matmul_peak_gflops": round(peak / 1e9, 1),
        "fraction_of_peak": round(flops / seconds / peak, 3),
    }
