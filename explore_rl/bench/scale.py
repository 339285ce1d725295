"""`scale`: random-weight Qwen2.5-0.5B- and 1.5B-shaped models (no checkpoint), bfloat16, at
an RL batch (64 prompts x 8 rollouts, 512-token prompts, 1024 new tokens forced): sampler
tokens/s, one update's tokens/s and MFU (3 x forward FLOPs against the matmul peak of the
same dtype, measured in the same run), peak device memory. Sized for one GPU in about five
minutes; `--presets tiny-qwen2 --prompts 2 ...` runs it on a CPU.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from explore_rl.bench.common import (
    forward_flops,
    matmul_peak,
    peak_memory_gib,
    sample_flops,
    timed,
)
from explore_rl.models import transformer
from explore_rl.sampling import sampler

HELP = "random-weight shapes at an RL batch (for GPU / TPU)"


def add_arguments(p) -> None:
    p.add_argument("--presets", default="qwen2.5-0.5b,qwen2.5-math-1.5b")
    p.add_argument("--dtype", default="bfloat16", choices=("float32", "bfloat16"))
    p.add_argument("--prompts", type=int, default=64)
    p.add_argument("--group", type=int, default=8)
    p.add_argument("--prompt-len", type=int, default=512)
    p.add_argument("--new-tokens", type=int, default=1024)
    p.add_argument("--micro-batches", type=int, default=32)
    p.add_argument("--reps", type=int, default=1)


def run_one(preset: str, args, peak: float) -> dict:
    """Sampler and update throughput of a random-weight preset at an RL batch size."""
    from explore_rl.models import presets
    from explore_rl.rl import losses
    from explore_rl.rl.train_step import Batch, OptimConfig, init_state, make_optimizer
    from explore_rl.rl.train_step import train_step as step_fn

    cfg = presets.get_preset(preset, param_dtype=args.dtype, dtype=args.dtype)
    params = jax.jit(lambda k: transformer.init_params(cfg, k))(jax.random.key(0))
    p, g, n, length = args.prompts, args.group, args.new_tokens, args.prompt_len
    prompts = jax.random.randint(jax.random.key(1), (p, length), 0, cfg.vocab_size)
    prompt_mask = jnp.ones_like(prompts, bool)
    tau = jnp.ones((p * g, n))
    sc = sampler.SamplingConfig(n)  # no stop ids: every row generates n tokens
    keys = iter(jax.random.split(jax.random.key(2), 100))
    run = lambda: sampler.sample(params, cfg, prompts, prompt_mask, next(keys), tau, sc)  # noqa: E731
    sample_s = timed(lambda: run().tokens, reps=args.reps)
    out = run()
    optimizer = make_optimizer(OptimConfig(micro_batches=args.micro_batches))
    lc, oc = losses.LossConfig(), OptimConfig(micro_batches=args.micro_batches)
    batch = Batch(
        prompts=prompts,
        prompt_mask=prompt_mask,
        tokens=out.tokens,
        mask=out.mask,
        advantages=jax.random.normal(jax.random.key(3), (p * g,)),
        behaviour_logp=out.logprobs,
        old_logp=out.logprobs,
        weights=jnp.ones((p * g,)),
    )
    holder = {"state": init_state(params, optimizer)}
    params = None  # the state owns (and the update donates) them

    def update():
        holder["state"], m = step_fn(holder["state"], batch, cfg, lc, oc, optimizer)
        return m["train/loss"]

    update_s = timed(update, reps=args.reps)
    rows, total = p * g, length + n
    sample_flops_ = sample_flops(cfg, p * length, rows, length, n)
    update_flops = 3 * forward_flops(cfg, rows, total)  # forward + backward
    return {
        "preset": preset,
        "params_b": round(cfg.num_params() / 1e9, 3),
        "sample_s": round(sample_s, 3),
        "sample_tokens_per_s": round(rows * n / sample_s, 1),
        "sample_fraction_of_peak": round(sample_flops_ / sample_s / peak, 3),
        "update_s": round(update_s, 3),
        "update_tokens_per_s": round(rows * total / update_s, 1),
        "update_mfu": round(update_flops / update_s / peak, 3),
        "peak_memory_gib_so_far": peak_memory_gib(),
    }


def check(args) -> str | None:
    if args.prompts % args.micro_batches:
        return f"--micro-batches {args.micro_batches} must divide --prompts {args.prompts}"
    return None


def run(args) -> dict:
    """Random-weight model shapes at an RL batch: sampler tokens/s, update tokens/s and
    MFU against the matmul peak measured in the same run, peak memory."""
    peak = matmul_peak(args.dtype)
    return {
        "bench": "scale",
        "dtype": args.dtype,
        "batch": f"{args.prompts} prompts x {args.group} rollouts, {args.prompt_len}-token "
        f"prompts, {args.new_tokens} new tokens, {args.micro_batches} micro-batches",
        "matmul_peak_tflops": round(peak / 1e12, 2),
        "results": [run_one(p.strip(), args, peak) for p in args.presets.split(",")],
    }
