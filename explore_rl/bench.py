"""Benchmarks, each reported as a fraction of a limit measured in the same run.

    python -m explore_rl.bench forward [--batch 64] [--length 128] [--dtype float32]

`forward`: tokens/s of the jitted forward (logits included) of the embedded model at
batch x length tokens, and its achieved FLOP/s as a fraction of the FLOP/s of a large
jitted matmul in the same dtype (the machine's compute limit). FLOPs are counted as
2 x matmul params x tokens (the LM head included, an untied input embedding not) plus
causal attention (4 x layers x heads x head_dim x T^2 / 2 per row).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

from explore_rl.models import transformer, weights


def _time(fn, *args, reps: int) -> float:
    """Median seconds of `fn(*args)` after one warm-up (compile) call."""
    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def matmul_peak(dtype: str, n: int = 2048, reps: int = 5) -> float:
    """FLOP/s of an n x n x n jitted matmul: the compute limit the other numbers divide by."""
    a = jax.random.normal(jax.random.key(0), (n, n), dtype)
    b = jax.random.normal(jax.random.key(1), (n, n), dtype)
    return 2 * n**3 / _time(jax.jit(jnp.matmul), a, b, reps=reps)


def forward_flops(cfg, batch: int, length: int) -> float:
    # An untied input embedding is a gather, not a matmul: leave it out.
    matmul_params = cfg.num_params() - (0 if cfg.tie_embeddings else cfg.vocab_size * cfg.d_model)
    attention = 4 * cfg.n_layers * cfg.n_heads * cfg.head_dim * length**2 / 2
    return batch * (2 * matmul_params * length + attention)


def bench_forward(args) -> dict:
    params, cfg, _ = weights.load_model(args.model, param_dtype=args.dtype, dtype=args.dtype)
    tokens = jax.random.randint(jax.random.key(0), (args.batch, args.length), 0, cfg.vocab_size)
    mask = jnp.ones_like(tokens, bool)
    positions = transformer.positions_from_mask(mask)
    fwd = jax.jit(lambda p, t: transformer.forward(p, cfg, t, positions, mask).logits)
    peak = matmul_peak(args.dtype)
    seconds = _time(fwd, params, tokens, reps=args.reps)
    flops = forward_flops(cfg, args.batch, args.length)
    return {
        "bench": "forward",
        "model": args.model,
        "dtype": args.dtype,
        "batch": args.batch,
        "length": args.length,
        "seconds": round(seconds, 4),
        "tokens_per_s": round(args.batch * args.length / seconds, 1),
        "achieved_gflops": round(flops / seconds / 1e9, 1),
        "matmul_peak_gflops": round(peak / 1e9, 1),
        "fraction_of_peak": round(flops / seconds / peak, 3),
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="bench", required=True)
    fwd = sub.add_parser("forward", help="jitted forward throughput vs the matmul peak")
    fwd.add_argument("--model", default=weights.EMBEDDED)
    fwd.add_argument("--batch", type=int, default=64)
    fwd.add_argument("--length", type=int, default=128)
    fwd.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    fwd.add_argument("--reps", type=int, default=5)
    args = parser.parse_args(argv)
    result = {"forward": bench_forward}[args.bench](args)
    result["machine"] = (
        f"{platform.processor() or platform.machine()}, "
        f"{jax.device_count()} x {jax.devices()[0].device_kind}, jax {jax.__version__}"
    )
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    np.set_printoptions(precision=4)
    main()
