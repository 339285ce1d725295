"""`depth`: the update's and the rollout's compile time, and the update's working memory,
against the model's depth, its layers unrolled in the program against scanned
(`model.scan_layers`), from abstract shapes: nothing is allocated or run, so a 28-layer
1.5B shape compiles on a laptop.

Per (mode, layers): the seconds XLA takes to compile the update's gradient program (the
paper configs' memory settings: blockwise attention, remat, chunked log-probs) and its
temporaries by XLA's buffer assignment, and the rollout's two programs' (the prefill,
scanned with the layers, and the decode loop, its step unrolled either way); with both
modes, per depth, the scanned update's compile time as a fraction of the unrolled one's,
and its extra temporaries against the start-up estimate's "stacked layers" term
(`rl/footprint.py`). `--modes scanned`: the paper configs' programs only.
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp

HELP = "update compile time and memory against depth, unrolled vs scanned layers"
GIB = 2**30


def add_arguments(p) -> None:
    p.add_argument("--preset", default="qwen2.5-math-1.5b")
    p.add_argument("--layers", default="4,28", help="depths to compile (the preset's first)")
    p.add_argument("--dtype", default="bfloat16", choices=("float32", "bfloat16"))
    p.add_argument("--prompt-len", type=int, default=64)
    p.add_argument("--length", type=int, default=256, help="response tokens of each row")
    p.add_argument("--rows", type=int, default=2)
    p.add_argument("--modes", default="unrolled,scanned", help="unrolled, scanned or both")


def check(args) -> str | None:
    from explore_rl.models import presets

    if args.preset not in presets.PRESETS:
        return f"--preset {args.preset!r}: not a preset ({', '.join(presets.PRESETS)})"
    depths = args.layers.split(",")
    if not all(d.isdigit() and int(d) > 0 for d in depths):
        return f"--layers {args.layers!r}: comma-separated positive depths"
    if not set(args.modes.split(",")) <= {"unrolled", "scanned"}:
        return f"--modes {args.modes!r}: unrolled, scanned or both, comma-separated"
    return None


def _rollout_compiles(cfg, args) -> tuple[float, float]:
    """Seconds to lower and compile the rollout's two programs, `args.rows` rows after one
    prompt: the prefill with the first token (`sampler.start`: the prompt's layers
    scanned when `scan_layers`) and the decode loop (`sampler.decode_segment` over all
    the response slots, as `rollout.decode_window=0` runs it: its step unrolled
    either way, each layer's attention a loop over the filled cache's tiles)."""
    from explore_rl.models import transformer
    from explore_rl.sampling import sampler

    abstract = jax.ShapeDtypeStruct
    params = jax.eval_shape(lambda: transformer.init_params(cfg, jax.random.key(0)))
    prompt = abstract((1, args.prompt_len), jnp.int32)
    mask = abstract(prompt.shape, bool)
    temps = abstract((args.rows, args.length), jnp.float32)
    config = sampler.SamplingConfig(args.length)
    key = jax.eval_shape(lambda: jax.random.key(0))
    inputs = (params, cfg, prompt, mask, key, temps, config, None, None)
    start = time.perf_counter()
    sampler.start.lower(*inputs).compile()
    prefill_s = time.perf_counter() - start
    state, uniforms = jax.eval_shape(
        lambda p, m, k, t: sampler.start(params, cfg, p, m, k, t, config, None, None),
        prompt, mask, key, temps,
    )  # fmt: skip
    start = time.perf_counter()
    segment = (params, cfg, state, temps, uniforms, config, None, args.length)
    sampler.decode_segment.lower(*segment).compile()
    return prefill_s, time.perf_counter() - start


def _compile(cfg, args) -> tuple[float, int]:
    """(seconds to lower and compile, temporaries in bytes) of the update's gradient."""
    from explore_rl.models import transformer
    from explore_rl.rl import losses
    from explore_rl.rl.train_step import Batch, _loss

    abstract = jax.ShapeDtypeStruct
    rows, t, p = args.rows, args.length, args.prompt_len
    params = jax.eval_shape(lambda: transformer.init_params(cfg, jax.random.key(0)))
    tokens, mask = abstract((rows, t), jnp.int32), abstract((rows, t), bool)
    logp, per_row = abstract((rows, t), jnp.float32), abstract((rows,), jnp.float32)
    batch = Batch(
        abstract((1, p), jnp.int32), abstract((1, p), bool), tokens, mask, per_row, logp, logp,
        per_row,
    )  # fmt: skip
    lc, n = losses.LossConfig(), jnp.float32(rows * t)
    grad = jax.jit(jax.grad(lambda w, b: _loss(w, cfg, lc, b, n)[0]))
    start = time.perf_counter()
    compiled = grad.lower(params, batch).compile()
    return time.perf_counter() - start, compiled.memory_analysis().temp_size_in_bytes


def run(args) -> dict:
    from explore_rl.bench.long import LONG_MODES
    from explore_rl.models import presets
    from explore_rl.rl import footprint
    from explore_rl.rl.train_step import OptimConfig, make_optimizer

    runs, by_depth = [], []
    for layers in map(int, args.layers.split(",")):
        seconds, temp = {}, {}
        for mode in args.modes.split(","):
            cfg = presets.get_preset(
                args.preset, n_layers=layers, dtype=args.dtype, param_dtype=args.dtype,
                scan_layers=mode == "scanned", **LONG_MODES["long"],
            )  # fmt: skip
            jax.clear_caches()  # each program compiled anew, none from the one before
            seconds[mode], temp[mode] = _compile(cfg, args)
            prefill_s, decode_s = _rollout_compiles(cfg, args)
            runs.append(
                {
                    "layers": layers,
                    "mode": mode,
                    "compile_s": round(seconds[mode], 2),
                    "temp_gib": round(temp[mode] / GIB, 3),
                    "prefill_compile_s": round(prefill_s, 2),
                    "decode_compile_s": round(decode_s, 2),
                }
            )
        if len(seconds) < 2:
            continue
        sizes = footprint.StepSizes(
            prompts=1, decode_rows=args.rows, prompt_len=args.prompt_len,
            new_tokens=args.length, update_prompts=1, update_rows=args.rows,
        )  # fmt: skip
        est = footprint.estimate(cfg, {}, make_optimizer(OptimConfig()), sizes, False)
        stacked = est.terms["stacked layers"]  # of the scanned cfg, the last compiled
        by_depth.append(
            {
                "layers": layers,
                "scanned_over_unrolled_compile": round(seconds["scanned"] / seconds["unrolled"], 3),
                "scanned_extra_temp_gib": round((temp["scanned"] - temp["unrolled"]) / GIB, 3),
                "estimate_stacked_layers_gib": round(stacked / GIB, 3),
            }
        )
    return {
        "bench": "depth",
        "preset": f"{args.preset}, {args.dtype}, 1 prompt of {args.prompt_len} tokens + "
        f"{args.rows} rows of {args.length}, the paper configs' memory settings",
        "runs": runs,
        "by_depth": by_depth,
    }
