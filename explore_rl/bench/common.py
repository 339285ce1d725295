"""Helpers the benchmarks share: the machine's matmul peak, FLOP counts, the peer
workload, the benchmarked model, peak memory.
"""

from __future__ import annotations

import random
import resource
import statistics
import time

import jax
import jax.numpy as jnp

from explore_rl.models import weights


def timed(fn, *args, reps: int) -> float:
    """Median seconds of `fn(*args)` after one warm-up (compile) call."""
    jax.block_until_ready(fn(*args))  # torch tensors pass through unchanged
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def matmul_peak(dtype: str, n: int = 0, reps: int = 7) -> float:
    """FLOP/s of an n x n x n jitted matmul, best of `reps`: the compute limit the other
    numbers divide by (the best, since a limit should not move with a noisy neighbour).
    n: 2048 on a CPU; 8192 on a GPU / TPU, where a 2048^3 product is mostly launch and
    sync time (bfloat16 on an H200: 152 TFLOP/s at 2048, 642 at 8192; BENCHMARKS.md)."""
    n = n or (2048 if jax.default_backend() == "cpu" else 8192)
    a = jax.random.normal(jax.random.key(0), (n, n), dtype)
    b = jax.random.normal(jax.random.key(1), (n, n), dtype)
    mm = jax.jit(jnp.matmul)
    jax.block_until_ready(mm(a, b))
    best = float("inf")
    for _ in range(reps):
        start = time.perf_counter()
        jax.block_until_ready(mm(a, b))
        best = min(best, time.perf_counter() - start)
    return 2 * n**3 / best


def memory_bandwidth(mib: int = 512, reps: int = 5) -> float:
    """Bytes/s of a jitted elementwise pass over a `mib`-MiB float32 array (each byte read
    once and written once), in place, best of `reps`: the memory-bandwidth limit of decode
    (DRAM on a CPU, HBM on a GPU). In place (donated): a fresh output would time the
    kernel's first touch of new pages on a CPU (2.3 GB/s against 31.6 in place, epyc)."""
    x = jnp.ones((mib * 2**20 // 4,), jnp.float32)
    add = jax.jit(lambda x: x + 1, donate_argnums=0)
    x = jax.block_until_ready(add(x))
    best = float("inf")
    for _ in range(reps):
        start = time.perf_counter()
        x = jax.block_until_ready(add(x))
        best = min(best, time.perf_counter() - start)
    return 2 * x.nbytes / best


def kv_bytes(cfg, token_slots: int) -> int:
    """Keys and values of `token_slots` positions over every layer."""
    per_slot = 2 * cfg.n_layers * cfg.n_kv_heads * cfg.head_dim * jnp.dtype(cfg.jnp_dtype).itemsize
    return per_slot * token_slots


def decode_bound_s(cfg, steps: int, kv_slot_reads: int, bandwidth: float) -> float:
    """The least time `steps` decode steps can take at `bandwidth`: each reads the weights
    once and the KV slots its rows attend that hold tokens (`kv_slot_reads`, summed over
    the steps: a shared prompt's once a step, not its allocated length)."""
    weights = matmul_params(cfg) * jnp.dtype(cfg.jnp_param_dtype).itemsize
    return (steps * weights + kv_bytes(cfg, kv_slot_reads)) / bandwidth


def matmul_params(cfg) -> int:
    # An untied input embedding is a gather, not a matmul: leave it out.
    return cfg.num_params() - (0 if cfg.tie_embeddings else cfg.vocab_size * cfg.d_model)


def forward_flops(cfg, batch: int, length: int) -> float:
    attention = 4 * cfg.n_layers * cfg.n_heads * cfg.head_dim * length**2 / 2
    return batch * (2 * matmul_params(cfg) * length + attention)


def benchmarked_model(args, **dtypes):
    """The benchmarked model: `--model`'s weights, or `--random-init`'s random weights of a
    preset shape with `--model`'s tokenizer (a shape timed without its checkpoint)."""
    return weights.load(args.model, args.random_init or "", **dtypes)


# The peer workload (the one TRL's and Tunix's GRPO were timed on for BENCHMARKS.md): 8
# chat prompts "What is A + B? Answer with just the number." x 8 rollouts, 32 new tokens
# forced, temperature 1.
PEER_PROMPTS, PEER_GROUP, PEER_NEW = 8, 8, 32


def peer_questions(seed: int = 12345) -> list[str]:
    """The peer workload's prompts: two-digit sums from a seeded `random.Random`, the
    same questions the peers were timed on."""
    rng = random.Random(seed)
    out = []
    for _ in range(PEER_PROMPTS):
        a, b = rng.randint(10, 99), rng.randint(10, 99)
        out.append(f"What is {a} + {b}? Answer with just the number.")
    return out


def sample_flops(cfg, prompt_tokens: int, rows: int, prompt_len: int, new: int) -> float:
    """Prefill of the distinct prompts + decode of every row (attention over the cache)."""
    per_token = 2 * matmul_params(cfg)
    attn = 4 * cfg.n_layers * cfg.n_heads * cfg.head_dim
    prefill = prompt_tokens * per_token + attn * prompt_tokens * prompt_len / 2
    decode = rows * new * per_token + rows * attn * sum(prompt_len + t for t in range(new))
    return prefill + decode


def device_peak_bytes() -> int | None:
    """The device's peak memory in use so far (GPU / TPU); None on CPU."""
    return (jax.devices()[0].memory_stats() or {}).get("peak_bytes_in_use")


def peak_memory_gib() -> float:
    """The device's peak memory in use (GPU / TPU), else this process's peak RSS (CPU):
    the process's peak so far, so `scale` runs its presets smallest first."""
    peak = device_peak_bytes()
    if peak is not None:
        return round(peak / 2**30, 2)
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2)


def rss_bytes(field: str = "VmRSS") -> int:
    """This process's resident memory now (VmRSS) or its peak since the last
    `reset_peak_rss` (VmHWM), on Linux; 0 where /proc is absent."""
    try:
        with open("/proc/self/status") as f:
            line = next(x for x in f if x.startswith(field + ":"))
        return int(line.split()[1]) * 1024
    except (OSError, StopIteration):
        return 0


def reset_peak_rss() -> None:
    """Start VmHWM afresh from the current RSS (Linux >= 4.0)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass
