"""`long`: the update's and the prefill's peak memory and speed against the sequence length,
dense against the long-sequence modes (`LONG_MODES`).

Tokens and FLOPs count each row as its prompt + response (what the fused layout computes,
and what verl's rows are): the shared layout computes the prompt once, so its MFU counts
the (rows - 1) prompt copies it does not run, and tokens/s compares the two on one count.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from explore_rl import memory
from explore_rl.bench.common import (
    device_peak_bytes,
    forward_flops,
    matmul_peak,
    reset_peak_rss,
    rss_bytes,
)
from explore_rl.models import attention, transformer
from explore_rl.sampling import sampler

HELP = "update and prefill memory and speed against length"


def add_arguments(p) -> None:
    p.add_argument("--preset", default="smollm2-135m")
    p.add_argument("--layers", type=int, default=2, help="the preset's first layers; 0: all")
    p.add_argument("--prompt-len", type=int, default=64)
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    p.add_argument("--rows", type=int, default=1, help="rows continuing the prompt")
    p.add_argument("--lengths", default="512,1024,2048,4096,8192")
    p.add_argument("--modes", default="dense,long", help=f"of {', '.join(LONG_MODES)}")
    p.add_argument("--dense-max", type=int, default=4096, help="longest dense length run")
    p.add_argument("--reps", type=int, default=2)
    p.add_argument(
        "--no-xla-peak", action="store_true", help="skip XLA's memory analysis (a compile more)"
    )
    p.add_argument("--only", default="", help=argparse.SUPPRESS)


LONG_MODES = {
    "dense": dict(attention="dense", remat="none", logits_chunk=1 << 20),
    "long": dict(attention="auto", remat="block", logits_chunk=128),  # BENCHMARKS.md's runs
    "scan": dict(attention="auto", remat="block", logits_chunk=128, scan_layers=True),  # paper's
}
# The paper's settings with the attention named: the fused kernel (cuDNN on a GPU, each
# row one prompt + response sequence) against the portable blockwise path.
LONG_MODES["scan-fused"] = dict(LONG_MODES["scan"], attention="fused")
LONG_MODES["scan-blockwise"] = dict(LONG_MODES["scan"], attention="blockwise")


def check(args) -> str | None:
    unknown = set(args.modes.split(",")) - set(LONG_MODES)
    return (
        f"--modes: {', '.join(sorted(unknown))} not in {', '.join(LONG_MODES)}" if unknown else None
    )


def _long_setup(args, mode: str, length: int):
    from explore_rl.models import presets
    from explore_rl.rl.train_step import Batch

    settings = dict(LONG_MODES[mode], dtype=args.dtype)
    if args.layers:
        settings["n_layers"] = args.layers
    cfg = presets.get_preset(args.preset, **settings)
    g = args.rows
    rng = jax.random.split(jax.random.key(0), 3)
    prompt = jax.random.randint(rng[0], (1, args.prompt_len), 0, cfg.vocab_size)
    tokens = jax.random.randint(rng[1], (g, length), 0, cfg.vocab_size)
    logp = -jnp.ones((g, length))
    batch = Batch(
        prompts=prompt, prompt_mask=jnp.ones_like(prompt, bool), tokens=tokens,
        mask=jnp.ones_like(tokens, bool), advantages=jax.random.normal(rng[2], (g,)),
        behaviour_logp=logp, old_logp=logp, weights=jnp.ones((g,)),
    )  # fmt: skip
    return cfg, batch


def _transient(fn, *args) -> tuple[int, float]:
    """(peak bytes above those in use before the call, seconds) of one call of a compiled
    `fn`: the device's (GPU / TPU: its peak so far, so call the largest program last) or
    this process's RSS (CPU)."""
    stats = jax.devices()[0].memory_stats()
    memory.trim()
    reset_peak_rss()
    before = stats["bytes_in_use"] if stats else rss_bytes()
    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    seconds = time.perf_counter() - start
    peak = device_peak_bytes() if stats else rss_bytes("VmHWM")
    return peak - before, seconds


def _xla_peak(fn, *args) -> int:
    """The bytes XLA's buffer assignment gives a jitted `fn` on `args`: its arguments,
    outputs and temporaries (compile-time, exact for the program; no runtime slack)."""
    m = fn.lower(*args).compile().memory_analysis()
    return (
        m.argument_size_in_bytes
        + m.output_size_in_bytes
        + m.temp_size_in_bytes
        - m.alias_size_in_bytes
    )


def _gradient_pass(params, batch, cfg, lc):
    """The update's gradient program on the whole batch (one micro-batch) and its
    arguments; its arguments are the params and the batch (the moments are not)."""
    from explore_rl.rl.train_step import _loss, _normaliser

    n = _normaliser(batch, jnp.zeros(4), lc)
    fn = jax.jit(jax.value_and_grad(lambda p, b: _loss(p, cfg, lc, b, n), has_aux=True))
    return fn, params, batch


def _nbytes(tree) -> int:
    return sum(x.nbytes for x in jax.tree.leaves(tree))


def run_one(args) -> dict:
    """One (mode, length): the update's and the prefill's peak memory, measured (arrays
    held before the call, exactly, plus the RSS the call adds at its peak) and estimated
    (`rl/footprint.py`), and the update's seconds."""
    from explore_rl.rl import footprint, losses
    from explore_rl.rl.train_step import OptimConfig, init_state, make_optimizer, train_step

    mode, length = args.only.split(":")
    length = int(length)
    cfg, batch = _long_setup(args, mode, length)
    oc = OptimConfig()
    optimizer = make_optimizer(oc)
    params = jax.jit(lambda k: transformer.init_params(cfg, k))(jax.random.key(1))
    state = init_state(params, optimizer)
    lc = losses.LossConfig()
    prefill = jax.jit(
        lambda p, t, m: sampler.prefill_prompts(p, cfg, t, m, None, jnp.zeros(1, jnp.int32))
    )
    p_args = (state.params, batch.tokens[:1], batch.mask[:1])
    jax.block_until_ready(prefill(*p_args))  # compiles
    p_peak, _ = _transient(prefill, *p_args)
    p_xla = _xla_peak(prefill, *p_args)
    holder = {"state": state}

    def update():
        holder["state"], m = train_step(holder["state"], batch, cfg, lc, oc, optimizer)
        return m["train/loss"]

    start = time.perf_counter()
    jax.block_until_ready(update())  # compiles
    first_s = time.perf_counter() - start
    times, peaks = [], []
    for _ in range(args.reps):
        held = _nbytes(holder["state"]) + _nbytes(batch)
        peak, seconds = _transient(update)
        peaks.append(held + peak)
        times.append(seconds)
    u_xla = None
    if not args.no_xla_peak:
        u_xla = _xla_peak(*_gradient_pass(holder["state"].params, batch, cfg, lc))
    g = batch.tokens.shape[0]
    shape = footprint.StepSizes(
        prompts=1, decode_rows=1, prompt_len=length, new_tokens=0, update_prompts=1,
        update_rows=g, update_length=length,
    )  # fmt: skip
    est = footprint.estimate(cfg, {}, optimizer, shape, False)
    up = footprint.StepSizes(
        prompts=1, decode_rows=g, prompt_len=args.prompt_len, new_tokens=length,
        update_prompts=1, update_rows=g,
    )  # fmt: skip
    est_update = footprint.estimate(cfg, {}, optimizer, up, False)
    params, resident = _nbytes(holder["state"].params), _nbytes(holder["state"])
    measured_update = max(peaks)
    estimated_update = est_update.resident + est_update.update
    measured_prefill = params + p_peak
    estimated_prefill = params + sum(
        est.terms[k] for k in ("KV cache", "prefill workspace", "stacked layers")
    )
    tokens = g * (args.prompt_len + length)
    seconds = statistics.median(times)
    flops = 3 * forward_flops(cfg, g, args.prompt_len + length)  # forward + backward
    return {
        "mode": mode,
        "length": length,
        "attention": attention.describe(
            cfg.attention, cfg.jnp_dtype, cfg.head_dim, cfg.attention_block
        ),
        "update_first_call_s": round(first_s, 1),  # its compile, mostly
        "resident_gib": round(resident / 2**30, 3),
        "params_gib": round(params / 2**30, 3),
        "update_measured_gib": round(measured_update / 2**30, 3),
        "update_estimate_gib": round(estimated_update / 2**30, 3),
        "update_estimate_over_measured": round(estimated_update / measured_update, 3),
        "prefill_measured_gib": round(measured_prefill / 2**30, 3),
        "prefill_estimate_gib": round(estimated_prefill / 2**30, 3),
        "prefill_estimate_over_measured": round(estimated_prefill / measured_prefill, 3),
        "update_xla_gib": u_xla and round((resident - params + u_xla) / 2**30, 3),
        "update_estimate_over_xla": u_xla
        and round(estimated_update / (resident - params + u_xla), 3),
        "prefill_xla_gib": round(p_xla / 2**30, 3),
        "prefill_estimate_over_xla": round(estimated_prefill / p_xla, 3),
        # what the exponents fit, unrounded: a tiny model's parts round to 0.0 GiB
        "update_above_resident_bytes": measured_update - resident,
        "prefill_above_params_bytes": measured_prefill - params,
        "update_s": round(seconds, 3),
        "update_tokens_per_s": round(tokens / seconds, 1),
        "update_mfu": round(flops / seconds / matmul_peak(args.dtype), 3),
    }


def exponents(runs: list[dict]) -> dict:
    """Per mode and phase, the exponent k of (peak - the length-free part: the params, and
    for the update their moments) ~ length^k, fitted by least squares on log-log axes over
    the mode's lengths; None where there is nothing to fit (one length, or a part measured
    at zero)."""
    out = {}
    for mode in sorted({r["mode"] for r in runs}):
        rs = [r for r in runs if r["mode"] == mode]
        xs = [r["length"] for r in rs]
        for phase, part in (("update", "above_resident"), ("prefill", "above_params")):
            ys = [r[f"{phase}_{part}_bytes"] for r in rs]
            if len(set(xs)) > 1 and min(ys) > 0:
                k = np.polyfit(np.log(xs), np.log(ys), 1)[0]
                out[f"{mode}/{phase}"] = round(float(k), 2)
            else:
                out[f"{mode}/{phase}"] = None
    return out


def run(args) -> dict:
    """The update's and the prefill's peak memory against the length, dense (every score,
    activation and logit kept: the model before its long-context settings) and long
    (blockwise attention, remat, chunked log-probs), each (mode, length) in a fresh
    process; the fitted exponent of the memory above the length-free part (params,
    moments) and the update's tokens/s."""
    if args.only:
        return run_one(args)
    runs = []
    for mode in args.modes.split(","):
        for length in map(int, args.lengths.split(",")):
            if mode == "dense" and length > args.dense_max:
                continue  # [T, T] scores of every layer do not fit this machine's memory
            command = [
                sys.executable, "-m", "explore_rl.bench", "long", "--only", f"{mode}:{length}",
                "--preset", args.preset, "--layers", str(args.layers), "--rows", str(args.rows),
                "--reps", str(args.reps), "--prompt-len", str(args.prompt_len),
                "--dtype", args.dtype, *(["--no-xla-peak"] if args.no_xla_peak else []),
            ]  # fmt: skip
            done = subprocess.run(command, capture_output=True, text=True)
            if done.returncode:
                raise RuntimeError(f"{' '.join(command)} failed:\n{done.stderr[-2000:]}")
            runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
    return {
        "bench": "long",
        "preset": f"{args.preset} ({args.layers or 'all'} layers, {args.dtype} activations), "
        f"1 prompt of {args.prompt_len} tokens + {args.rows} rows",
        "runs": runs,
        "exponents": exponents(runs),
    }
