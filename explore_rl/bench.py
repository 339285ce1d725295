"""Benchmarks, each reported as a fraction of a limit measured in the same run.

    python -m explore_rl.bench forward [--batch 64] [--length 128] [--dtype float32]
    python -m explore_rl.bench sample [--no-peer]
    python -m explore_rl.bench step
    python -m explore_rl.bench startup
    python -m explore_rl.bench memory [--config configs/grpo.py:demo] [--steps 2]

`forward`, `sample` and `step` take `--model` (a folder, .gguf or "embedded") and
`--random-init PRESET` (random weights of a preset's shape, `--model`'s tokenizer: e.g.
`--random-init qwen2.5-math-7b` times a 7B shape with no checkpoint on disk).

`forward`: tokens/s of the jitted forward (logits included) of the embedded model at
batch x length tokens, and its achieved FLOP/s as a fraction of the FLOP/s of a large
jitted matmul in the same dtype (the machine's compute limit). FLOPs are counted as
2 x matmul params x tokens (the LM head included, an untied input embedding not) plus
causal attention (4 x layers x heads x head_dim x T^2 / 2 per row).

`sample`: the peer workload (the one TRL's and Tunix's GRPO were timed on for
BENCHMARKS.md: 8 chat prompts "What is A + B? Answer with just the number." x 8 rollouts,
32 new tokens forced, temperature 1): generated tokens/s, prefill and decode seconds,
FLOP/s as a fraction of the matmul peak, and the same work through transformers'
`generate` on PyTorch CPU (needs the dev extras) in the same run.

`step`: one GRPO step on the same workload (rollout, rewards, advantages, pi_old, one
AdamW update at lr 1e-6, float32), split into rollout / pi_old / update seconds, with
tokens/s, the update's FLOP/s as a fraction of the matmul peak, and the process's peak
RSS. BENCHMARKS.md ("One GRPO step on the peer workload") has TRL's GRPOTrainer timed on
the same workload and machine: compare ratios, not seconds, across machines.

`scale`: random-weight Qwen2.5-0.5B- and 1.5B-shaped models (no checkpoint), bfloat16, at
an RL batch (64 prompts x 8 rollouts, 512-token prompts, 1024 new tokens forced): sampler
tokens/s, one update's tokens/s and MFU (3 x forward FLOPs against the matmul peak of the
same dtype, measured in the same run), peak device memory. Sized for one GPU in about five
minutes; `--presets tiny-qwen2 --prompts 2 ...` runs it on a CPU.

`engine`: the rollout engine on a long-tailed workload: the embedded model answers GSM8K
test questions with a chain-of-thought instruction (`--questions arithmetic`: the demo's
one-digit sums), 16 prompts x 8 rollouts, up to 256 new tokens, stop at EOS, temperature
1. For each slot count (0: the one pass) in a fresh
process of its own (so each peak RSS is its own): useful tokens/s (tokens up to each
row's stop), slot occupancy, prefill / decode seconds, refills, the KV cache's bytes, the
process's peak RSS, and the share of rows whose tokens equal the first run's; the second
of two identical calls is timed (the first compiles).

`memory`: the memory per device a config's run estimates at start (`rl/footprint.py`)
against what its steps (`--steps`, at least 2) measure: the device's peak memory in use,
or on a CPU the process's peak RSS during the last step (the first compiles: the compiler's
heap is host memory, not the run's) less its RSS before the run (`--random-init PRESET`
keeps a model file from being mapped into memory).

`startup`: seconds from command to first rollout (`--mode sample`, 2 prompts x 2 samples x
8 tokens of the embedded model) in fresh processes sharing a new, empty cache folder: the
first converts the GGUF and compiles, the second reads both from the cache (`caching`).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import random
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np

from explore_rl import memory, parallel
from explore_rl.models import transformer, weights
from explore_rl.sampling import sampler


def _time(fn, *args, reps: int) -> float:
    """Median seconds of `fn(*args)` after one warm-up (compile) call."""
    jax.block_until_ready(fn(*args))  # torch tensors pass through unchanged
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def matmul_peak(dtype: str, n: int = 2048, reps: int = 7) -> float:
    """FLOP/s of an n x n x n jitted matmul, best of `reps`: the compute limit the other
    numbers divide by (the best, since a limit should not move with a noisy neighbour)."""
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


def matmul_params(cfg) -> int:
    # An untied input embedding is a gather, not a matmul: leave it out.
    return cfg.num_params() - (0 if cfg.tie_embeddings else cfg.vocab_size * cfg.d_model)


def forward_flops(cfg, batch: int, length: int) -> float:
    attention = 4 * cfg.n_layers * cfg.n_heads * cfg.head_dim * length**2 / 2
    return batch * (2 * matmul_params(cfg) * length + attention)


def _load(args, **dtypes):
    """The benchmarked model: `--model`'s weights, or `--random-init`'s random weights of a
    preset shape with `--model`'s tokenizer (a shape timed without its checkpoint)."""
    return weights.load(args.model, args.random_init or "", **dtypes)


def bench_forward(args) -> dict:
    params, cfg, _ = _load(args, param_dtype=args.dtype, dtype=args.dtype)
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


def bench_sample(args) -> dict:
    params, cfg, tok = _load(args)
    rows = [tok.encode_chat([{"role": "user", "content": q}]) for q in peer_questions()]
    tokens, mask = sampler.left_pad(rows, tok.pad_id)
    b = PEER_PROMPTS * PEER_GROUP
    tau = jnp.ones((b, PEER_NEW))
    sc = sampler.SamplingConfig(PEER_NEW)  # no stop ids: 32 tokens forced, as the peers
    keys = iter(jax.random.split(jax.random.key(0), 100))
    run = lambda: sampler.sample(params, cfg, tokens, mask, next(keys), tau, sc).tokens  # noqa: E731
    pre = jax.jit(lambda p, t, m: sampler.prefill(p, cfg, t, m, None, b, PEER_NEW)[1])
    each = jnp.repeat(tokens, PEER_GROUP, axis=0), jnp.repeat(mask, PEER_GROUP, axis=0)
    peak = matmul_peak("float32")
    total = _time(run, reps=args.reps)
    prefill_s = _time(pre, params, tokens, mask, reps=args.reps)
    unshared_s = _time(pre, params, *each, reps=args.reps)  # one prefill per row
    flops = sample_flops(cfg, int(mask.sum()), b, tokens.shape[1], PEER_NEW)
    result = {
        "bench": "sample",
        "model": args.model,
        "random_init": args.random_init,
        "rows": b,
        "prompt_len": tokens.shape[1],
        "new_tokens": PEER_NEW,
        "seconds": round(total, 3),
        "prefill_s": round(prefill_s, 3),
        "decode_s": round(total - prefill_s, 3),
        "prefill_unshared_s": round(unshared_s, 3),
        "tokens_per_s": round(b * PEER_NEW / total, 1),
        "fraction_of_peak": round(flops / total / peak, 3),
        "matmul_peak_gflops": round(peak / 1e9, 1),
    }
    if not args.no_peer:
        result.update(peer_generate(tok, args.reps))
        result["speedup_vs_peer"] = round(result["tokens_per_s"] / result["peer_tokens_per_s"], 2)
    return result


def peer_generate(tok, reps: int) -> dict:
    """The same work through transformers' generate (PyTorch CPU, float32)."""
    import torch
    from transformers import AutoModelForCausalLM

    folder, name = os.path.split(weights.embedded_model_path())
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    model.eval()
    rows = [tok.encode_chat([{"role": "user", "content": q}]) for q in peer_questions()]
    rows = [r for r in rows for _ in range(PEER_GROUP)]
    width = max(map(len, rows))
    ids = torch.tensor([[tok.pad_id] * (width - len(r)) + r for r in rows])
    attn = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
    kw = dict(
        do_sample=True,
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        max_new_tokens=PEER_NEW,
        min_new_tokens=PEER_NEW,
        pad_token_id=tok.pad_id,
    )

    def gen():
        with torch.no_grad():
            return model.generate(input_ids=ids, attention_mask=attn, **kw)

    seconds = _time(gen, reps=reps)
    return {
        "peer": f"transformers {__import__('transformers').__version__} generate, "
        f"torch {torch.__version__}",
        "peer_seconds": round(seconds, 3),
        "peer_tokens_per_s": round(len(rows) * PEER_NEW / seconds, 1),
    }


def bench_step(args) -> dict:
    from configs import grpo
    from explore_rl import config as config_lib
    from explore_rl.data.tasks import Problem
    from explore_rl.rewards.math import Verifier
    from explore_rl.rl.train_step import init_state, make_optimizer
    from explore_rl.train import build, steps

    c = grpo.get_config("demo")
    c.rollout.prompts, c.rollout.group_size = PEER_PROMPTS, PEER_GROUP
    c.rollout.max_new_tokens, c.task.instruction = PEER_NEW, ""
    c.optim.lr, c.optim.weight_decay = 1e-6, 0.0
    c.reward.extractors = "last_number"
    c.optim.micro_batches = args.micro_batches
    c.rl.minibatches = 1  # the peers' workload: one optimizer step per rollout batch
    params, cfg, tok = _load(args)
    tok.stop_ids = ()  # 32 tokens forced, as the peers
    problems = [
        Problem(q, str(sum(map(int, q.split("?")[0].split()[2::2])))) for q in peer_questions()
    ]
    spec = config_lib.spec(c)
    optimizer = make_optimizer(spec.optim)
    memory.trim_after_compiles()
    progress = build.Progress(init_state(params, optimizer), jnp.zeros((), jnp.int32))
    peak = matmul_peak("float32")
    times = []
    with Verifier(2, 5.0) as verifier:
        run = build.Run(
            spec=spec,
            cfg=cfg,
            tok=tok,
            train_set=problems,
            test_sets={},
            optimizer=optimizer,
            verifier=verifier,
            key=jax.random.key(0),
            eval_key=jax.random.key(1),
            settings=spec.rollout_settings(tok),
        )
        for step in range(args.steps + 1):  # the first step compiles
            progress, m, _ = steps.train_one_step(run, progress, step)
            times.append(m)
    rows = PEER_PROMPTS * PEER_GROUP
    med = lambda k: statistics.median(t[k] for t in times[1:])  # noqa: E731
    # Update = forward + backward (3x forward FLOPs) over the shared prompts and responses.
    fwd = sample_flops(cfg, PEER_PROMPTS * 46, 0, 48, 0) + forward_flops(cfg, rows, PEER_NEW)
    step_s = med("time/rollout_s") + med("time/pi_old_s") + med("time/update_s")
    return {
        "bench": "step",
        "model": args.model,
        "random_init": args.random_init,
        "rows": rows,
        "new_tokens": PEER_NEW,
        "step_s": round(step_s, 2),
        "rollout_s": round(med("time/rollout_s"), 2),
        "pi_old_s": round(med("time/pi_old_s"), 2),
        "update_s": round(med("time/update_s"), 2),
        "tokens_per_s": round(rows * PEER_NEW / step_s, 1),
        "update_fraction_of_peak": round(3 * fwd / med("time/update_s") / peak, 3),
        "peak_rss_gib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2),
    }


def _device_peak_bytes() -> int | None:
    """The device's peak memory in use so far (GPU / TPU); None on CPU."""
    return (jax.devices()[0].memory_stats() or {}).get("peak_bytes_in_use")


def _peak_memory_gib() -> float:
    """The device's peak memory in use (GPU / TPU), else this process's peak RSS (CPU):
    the process's peak so far, so `scale` runs its presets smallest first."""
    peak = _device_peak_bytes()
    if peak is not None:
        return round(peak / 2**30, 2)
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2)


def bench_scale_one(preset: str, args, peak: float) -> dict:
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
    sample_s = _time(lambda: run().tokens, reps=args.reps)
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

    update_s = _time(update, reps=args.reps)
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
        "peak_memory_gib_so_far": _peak_memory_gib(),
    }


def bench_scale(args) -> dict:
    """Random-weight model shapes at an RL batch: sampler tokens/s, update tokens/s and
    MFU against the matmul peak measured in the same run, peak memory."""
    peak = matmul_peak(args.dtype)
    return {
        "bench": "scale",
        "dtype": args.dtype,
        "batch": f"{args.prompts} prompts x {args.group} rollouts, {args.prompt_len}-token "
        f"prompts, {args.new_tokens} new tokens, {args.micro_batches} micro-batches",
        "matmul_peak_tflops": round(peak / 1e12, 2),
        "results": [bench_scale_one(p.strip(), args, peak) for p in args.presets.split(",")],
    }


_LOADED = re.compile(r"^loaded .* in ([0-9.]+)s$", re.M)


COT = " Please reason step by step, and put your final answer within \\boxed{}."


def kv_bytes(cfg, token_slots: int) -> int:
    """Keys and values of `token_slots` positions over every layer."""
    per_slot = 2 * cfg.n_layers * cfg.n_kv_heads * cfg.head_dim * jnp.dtype(cfg.jnp_dtype).itemsize
    return per_slot * token_slots


def bench_engine_one(args) -> dict:
    from explore_rl.data import tasks
    from explore_rl.models.tokenizer import PromptFormat
    from explore_rl.sampling import engine

    params, cfg, tok = _load(args)
    if args.questions == "gsm8k":
        spec = tasks.JSONL_PRESETS["gsm8k"]
        problems = tasks.read_problems(tasks.preset_paths("gsm8k")[1], spec)[: args.prompts]
        fmt = PromptFormat(instruction=COT)
    else:  # the demo task's questions: mostly short answers, a few that ramble
        problems = tasks.make_arithmetic(args.prompts, split="test")
        fmt = PromptFormat(instruction=" Put the final answer in \\boxed{}.")
    tokens, mask = sampler.left_pad(
        [tok.encode(fmt.text(tok, p.question)) for p in problems], tok.pad_id
    )
    b = args.prompts * args.group
    tau = jnp.ones((b, args.new_tokens))
    sc = sampler.SamplingConfig(args.new_tokens, stop_ids=tok.stop_ids)
    ec = engine.EngineConfig(args.only, args.chunk)
    call = lambda: engine.generate(params, cfg, tokens, mask, jax.random.key(0), tau, sc, ec)  # noqa: E731
    call()  # compiles
    start = time.perf_counter()
    out, stats = call()
    seconds = time.perf_counter() - start
    slotted = stats.slots < b  # slots copy their row's prompt; the one pass shares it
    token_slots = tokens.size + stats.slots * (args.new_tokens + tokens.shape[1] * slotted)
    lengths = out.lengths
    return {
        "slots": args.only,
        "chunk": args.chunk if slotted else None,
        "seconds": round(seconds, 2),
        "useful_tokens": stats.useful_tokens,
        "useful_tokens_per_s": round(stats.useful_tokens / seconds, 1),
        "occupancy": round(stats.occupancy, 3),
        "prefill_s": round(stats.prefill_s, 4),
        "decode_s": round(stats.decode_s, 4),
        "steps": stats.steps,
        "refills": stats.refills,
        "length_mean": round(float(lengths.mean()), 1),
        "length_max": int(lengths.max()),
        "finished_frac": round(float(out.finished.mean()), 3),
        "kv_cache_gib": round(kv_bytes(cfg, token_slots) / 2**30, 3),
        "kv_cache_bytes": kv_bytes(cfg, token_slots),
        "peak_rss_gib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2),
        # each row's tokens, to compare the runs row by row
        "rows": [
            hash(tuple(t[m].tolist())) for t, m in zip(np.asarray(out.tokens), np.asarray(out.mask))
        ],
    }


def bench_engine(args) -> dict:
    if args.only is not None:  # one slot count, in the process the parent started
        return {"bench": "engine", "runs": [bench_engine_one(args)]}
    runs = []
    for slots in (int(x) for x in args.slots.split(",")):
        command = [
            sys.executable, "-m", "explore_rl.bench", "engine", "--only", str(slots),
            "--model", args.model, "--random-init", args.random_init, "--prompts",
            str(args.prompts), "--group", str(args.group), "--new-tokens",
            str(args.new_tokens), "--chunk", str(args.chunk), "--questions", args.questions,
        ]  # fmt: skip
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode:
            raise RuntimeError(f"{' '.join(command)} failed:\n{done.stderr[-2000:]}")
        runs.append(json.loads(done.stdout.strip().splitlines()[-1])["runs"][0])
        shown = {k: v for k, v in runs[-1].items() if k != "rows"}
        print(json.dumps(shown), file=sys.stderr)  # a long bench shows each as it ends
    one = next((r for r in runs if r["slots"] == 0), runs[0])
    for r in runs:  # rows whose tokens equal the first run's (float rounding can part them)
        r["same_rows"] = sum(a == b for a, b in zip(r["rows"], one["rows"])) / len(r["rows"])
    for r in runs:
        del r["rows"]
        r["speedup"] = round(r["useful_tokens_per_s"] / one["useful_tokens_per_s"], 2)
        r["peak_rss_ratio"] = round(r["peak_rss_gib"] / one["peak_rss_gib"], 2)
        r["kv_cache_ratio"] = round(r["kv_cache_bytes"] / one["kv_cache_bytes"], 2)
    return {
        "bench": "engine",
        "questions": args.questions,
        "model": args.model,
        "random_init": args.random_init,
        "rows": args.prompts * args.group,
        "new_tokens": args.new_tokens,
        "runs": runs,
    }


def _rss_bytes(field: str = "VmRSS") -> int:
    """This process's resident memory now (VmRSS) or its peak since the last
    `_reset_peak_rss` (VmHWM), on Linux; 0 where /proc is absent."""
    try:
        with open("/proc/self/status") as f:
            line = next(x for x in f if x.startswith(field + ":"))
        return int(line.split()[1]) * 1024
    except (OSError, StopIteration):
        return 0


def _reset_peak_rss() -> None:
    """Start VmHWM afresh from the current RSS (Linux >= 4.0)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def bench_memory(args) -> dict:
    """The start-up memory estimate against the measured peak of a config's first steps."""
    from explore_rl import config as config_lib
    from explore_rl.exploration import base as exploration
    from explore_rl.train import build, steps

    c = config_lib.load(args.config)
    c.model.random_init = args.random_init or c.model.random_init
    c.train.eval_every = 0
    for item in args.set:  # KEY=VALUE, the value in the field's own type
        key, value = item.split("=", 1)
        *path, name = key.split(".")
        section = functools.reduce(getattr, path, c)
        old = getattr(section, name)
        setattr(section, name, value if isinstance(old, str) else type(old)(json.loads(value)))
    spec = config_lib.spec(c)
    before = 0 if _device_peak_bytes() is not None else _rss_bytes()
    with (
        tempfile.TemporaryDirectory() as workdir,
        config_lib.verifier(spec.reward) as verifier,
        parallel.use(mesh := config_lib.mesh(spec.mesh)),
    ):
        run, progress, _ = build.start(spec, exploration.build(spec), workdir, verifier, mesh)
        for step in range(args.steps):
            if step == args.steps - 1 and before:  # the compiler's heap is not the run's
                memory.trim()
                _reset_peak_rss()
            progress, _, _ = steps.train_one_step(run, progress, step)
        jax.block_until_ready(progress)
    estimate = run.memory_estimate
    measured = _rss_bytes("VmHWM") - before if before else _device_peak_bytes()
    return {
        "bench": "memory",
        "config": args.config,
        "random_init": c.model.random_init,
        "set": args.set,
        "steps": args.steps,
        "terms_gib": estimate.record()["terms_gib"],
        "estimate_gib": round(estimate.peak / 2**30, 3),
        "measured_gib": round(measured / 2**30, 3),
        "measured": "peak RSS of the last step - RSS before the run"
        if before
        else "peak device memory",
        "estimate_over_measured": round(estimate.peak / measured, 3),
    }


# The long-context benchmark's two ways of running the model: today's memory settings for
# the papers' lengths (`configs/base.paper_memory`), and the whole dense path (every score,
# activation and logit kept), which is what the model did before them.
LONG_MODES = {
    "dense": dict(attention="dense", remat="none", logits_chunk=1 << 20),
    "long": dict(attention="auto", remat="block", logits_chunk=128),  # BENCHMARKS.md's runs
}


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
    _reset_peak_rss()
    before = stats["bytes_in_use"] if stats else _rss_bytes()
    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    seconds = time.perf_counter() - start
    peak = _device_peak_bytes() if stats else _rss_bytes("VmHWM")
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


def bench_long_one(args) -> dict:
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

    jax.block_until_ready(update())  # compiles
    times, peaks = [], []
    for _ in range(args.reps):
        held = _nbytes(holder["state"]) + _nbytes(batch)
        peak, seconds = _transient(update)
        peaks.append(held + peak)
        times.append(seconds)
    u_xla = _xla_peak(*_gradient_pass(holder["state"].params, batch, cfg, lc))
    g = batch.tokens.shape[0]
    shape = footprint.StepShape(
        prompts=1, decode_rows=1, prompt_len=length, new_tokens=0, update_prompts=1,
        update_rows=g, update_length=length,
    )  # fmt: skip
    est = footprint.estimate(cfg, {}, optimizer, shape, False)
    up = footprint.StepShape(
        prompts=1, decode_rows=g, prompt_len=args.prompt_len, new_tokens=length,
        update_prompts=1, update_rows=g,
    )  # fmt: skip
    est_update = footprint.estimate(cfg, {}, optimizer, up, False)
    params, resident = _nbytes(holder["state"].params), _nbytes(holder["state"])
    measured_update = max(peaks)
    estimated_update = est_update.resident + est_update.update
    measured_prefill = params + p_peak
    estimated_prefill = params + est.terms["KV cache"] + est.terms["prefill workspace"]
    tokens = g * (args.prompt_len + length)
    seconds = statistics.median(times)
    flops = 3 * forward_flops(cfg, g, args.prompt_len + length)  # forward + backward
    return {
        "mode": mode,
        "length": length,
        "resident_gib": round(resident / 2**30, 3),
        "params_gib": round(params / 2**30, 3),
        "update_measured_gib": round(measured_update / 2**30, 3),
        "update_estimate_gib": round(estimated_update / 2**30, 3),
        "update_estimate_over_measured": round(estimated_update / measured_update, 3),
        "prefill_measured_gib": round(measured_prefill / 2**30, 3),
        "prefill_estimate_gib": round(estimated_prefill / 2**30, 3),
        "prefill_estimate_over_measured": round(estimated_prefill / measured_prefill, 3),
        "update_xla_gib": round((resident - params + u_xla) / 2**30, 3),
        "update_estimate_over_xla": round(estimated_update / (resident - params + u_xla), 3),
        "prefill_xla_gib": round(p_xla / 2**30, 3),
        "prefill_estimate_over_xla": round(estimated_prefill / p_xla, 3),
        "update_s": round(seconds, 3),
        "update_tokens_per_s": round(tokens / seconds, 1),
        "update_mfu": round(flops / seconds / matmul_peak(args.dtype), 3),
    }


def _slope(xs, ys) -> float:
    """The exponent of y ~ x^k fitted by least squares on log-log axes."""
    return float(np.polyfit(np.log(xs), np.log(ys), 1)[0])


def bench_long(args) -> dict:
    """The update's and the prefill's peak memory against the length, dense (every score,
    activation and logit kept: the model before its long-context settings) and long
    (blockwise attention, remat, chunked log-probs), each (mode, length) in a fresh
    process; the fitted exponent of the memory above the length-free part (params,
    moments) and the update's tokens/s."""
    if args.only:
        return bench_long_one(args)
    runs = []
    for mode in args.modes.split(","):
        for length in map(int, args.lengths.split(",")):
            if mode == "dense" and length > args.dense_max:
                continue  # [T, T] scores of every layer do not fit this machine's memory
            command = [
                sys.executable, "-m", "explore_rl.bench", "long", "--only", f"{mode}:{length}",
                "--preset", args.preset, "--layers", str(args.layers), "--rows", str(args.rows),
                "--reps", str(args.reps), "--prompt-len", str(args.prompt_len),
                "--dtype", args.dtype,
            ]  # fmt: skip
            done = subprocess.run(command, capture_output=True, text=True)
            if done.returncode:
                raise RuntimeError(f"{' '.join(command)} failed:\n{done.stderr[-2000:]}")
            runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
    exponents = {}  # of the memory above the length-free part (params; their moments)
    for mode in sorted({r["mode"] for r in runs}):
        rs = [r for r in runs if r["mode"] == mode]
        xs = [r["length"] for r in rs]
        for phase, fixed in (("update", "resident_gib"), ("prefill", "params_gib")):
            ys = [r[f"{phase}_measured_gib"] - r[fixed] for r in rs]
            exponents[f"{mode}/{phase}"] = round(_slope(xs, ys), 2)
    return {
        "bench": "long",
        "preset": f"{args.preset} ({args.layers or 'all'} layers, {args.dtype} activations), "
        f"1 prompt of {args.prompt_len} tokens + {args.rows} rows",
        "runs": runs,
        "exponents": exponents,
    }


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
    model = config_lib.run_settings(s.model)
    cfg = presets.get_preset(os.path.basename(s.model.path).lower(), **model)
    sizes = {"data": 1, "fsdp": devices, "tensor": 1}
    optimizer = make_optimizer(s.optim)
    capacity = (int(capacity_gb * 1e9), f"{capacity_gb:g} GB")
    longest = s.rollout.max_prompt_len
    return sizing.size(s, cfg, sizes, optimizer, longest, exploration.build(s), capacity)


def bench_fit(args) -> dict:
    """Every paper config's memory per device on one node, by the start-up estimate."""
    from explore_rl.rl import footprint

    rows = []
    for name in PAPER_CONFIGS:
        c, est = paper_fit(f"configs/{name}.py:paper", args.devices, args.capacity_gb)
        t = est.terms
        rows.append({
            "config": f"configs/{name}.py:paper",
            "model": os.path.basename(c.model.path),
            "rows": c.rollout.prompts * c.rollout.group_size,
            "prompt + response": f"{c.rollout.max_prompt_len} + {c.rollout.max_new_tokens}",
            "decode_slots": c.rollout.slots or "all rows",
            "update_gib": round(sum(t[k] for k in footprint.UPDATE) / 2**30, 1),
            "kv_cache_gib": round(t["KV cache"] / 2**30, 1),
            "peak_gib": round(est.peak / 2**30, 1),
            "fits": est.fits,
        })  # fmt: skip
    return {"bench": "fit", "node": f"{args.devices} x {args.capacity_gb:g} GB", "rows": rows}


def bench_startup(args) -> dict:
    command = [
        sys.executable, "-m", "explore_rl.main", "--mode", "sample", "--config", args.config,
        "--config.sample.num_prompts=2", "--config.sample.samples_per_prompt=2",
        "--config.sample.max_new_tokens=8",
    ]  # fmt: skip
    out = {"bench": "startup", "command": " ".join(command[1:])}
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, EXPLORE_RL_CACHE_DIR=cache, JAX_COMPILATION_CACHE_DIR="")
        for run in ("cold", "warm"):
            start = time.perf_counter()
            done = subprocess.run(command, env=env, capture_output=True, text=True)
            if done.returncode:
                raise RuntimeError(f"{' '.join(command)} failed:\n{done.stderr[-2000:]}")
            out[f"{run}_s"] = round(time.perf_counter() - start, 2)
            out[f"{run}_load_s"] = float(_LOADED.search(done.stdout).group(1))
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="bench", required=True)
    fwd = sub.add_parser("forward", help="jitted forward throughput vs the matmul peak")
    fwd.add_argument("--model", default=weights.EMBEDDED)
    fwd.add_argument("--batch", type=int, default=64)
    fwd.add_argument("--length", type=int, default=128)
    fwd.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    fwd.add_argument("--reps", type=int, default=5)
    smp = sub.add_parser("sample", help="rollout throughput on the peer workload")
    smp.add_argument("--model", default=weights.EMBEDDED)
    smp.add_argument("--reps", type=int, default=3)
    smp.add_argument("--no-peer", action="store_true", help="skip transformers' generate")
    stp = sub.add_parser("step", help="one GRPO step on the peer workload")
    stp.add_argument("--model", default=weights.EMBEDDED)
    stp.add_argument("--steps", type=int, default=3)
    stp.add_argument("--micro-batches", type=int, default=1, help="groups split for the update")
    for p in (fwd, smp, stp):
        p.add_argument("--random-init", default="", help="a preset: random weights of its shape")
    sc = sub.add_parser("scale", help="random-weight shapes at an RL batch (for GPU / TPU)")
    sc.add_argument("--presets", default="qwen2.5-0.5b,qwen2.5-math-1.5b")
    sc.add_argument("--dtype", default="bfloat16", choices=("float32", "bfloat16"))
    sc.add_argument("--prompts", type=int, default=64)
    sc.add_argument("--group", type=int, default=8)
    sc.add_argument("--prompt-len", type=int, default=512)
    sc.add_argument("--new-tokens", type=int, default=1024)
    sc.add_argument("--micro-batches", type=int, default=32)
    sc.add_argument("--reps", type=int, default=1)
    eng = sub.add_parser("engine", help="decode slots vs the one pass, long-tailed lengths")
    eng.add_argument("--model", default=weights.EMBEDDED)
    eng.add_argument("--random-init", default="", help="a preset: random weights of its shape")
    eng.add_argument("--slots", default="0,64,32,16", help="slot counts; 0: the one pass")
    eng.add_argument("--chunk", type=int, default=16)
    eng.add_argument("--prompts", type=int, default=16)
    eng.add_argument("--group", type=int, default=8)
    eng.add_argument("--new-tokens", type=int, default=256)
    eng.add_argument("--questions", default="gsm8k", choices=("gsm8k", "arithmetic"))
    eng.add_argument("--only", type=int, default=None, help=argparse.SUPPRESS)
    mem = sub.add_parser("memory", help="the start-up memory estimate vs the measured peak")
    mem.add_argument("--config", default="configs/grpo.py:demo")
    mem.add_argument("--random-init", default="", help="a preset: random weights of its shape")
    mem.add_argument("--steps", type=int, default=2)
    mem.add_argument("--set", action="append", default=[], help="KEY=VALUE: a config field")
    lg = sub.add_parser("long", help="update and prefill memory and speed against length")
    lg.add_argument("--preset", default="smollm2-135m")
    lg.add_argument("--layers", type=int, default=2, help="the preset's first layers; 0: all")
    lg.add_argument("--prompt-len", type=int, default=64)
    lg.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    lg.add_argument("--rows", type=int, default=1, help="rows continuing the prompt")
    lg.add_argument("--lengths", default="512,1024,2048,4096,8192")
    lg.add_argument("--modes", default="dense,long")
    lg.add_argument("--dense-max", type=int, default=4096, help="longest dense length run")
    lg.add_argument("--reps", type=int, default=2)
    lg.add_argument("--only", default="", help=argparse.SUPPRESS)
    fit = sub.add_parser("fit", help="each paper config's memory per device on one node")
    fit.add_argument("--devices", type=int, default=8)
    fit.add_argument("--capacity-gb", type=float, default=80.0)
    up = sub.add_parser("startup", help="command to first rollout, cold and warm cache")
    up.add_argument("--config", default="configs/base.py")
    args = parser.parse_args(argv)
    if args.bench == "scale" and args.prompts % args.micro_batches:
        parser.error(f"--micro-batches {args.micro_batches} must divide --prompts {args.prompts}")
    if args.bench == "sample" and args.random_init and not args.no_peer:
        parser.error("--random-init: the peer runs the real model; add --no-peer")
    benches = {
        "forward": bench_forward,
        "sample": bench_sample,
        "step": bench_step,
        "startup": bench_startup,
        "scale": bench_scale,
        "engine": bench_engine,
        "memory": bench_memory,
        "long": bench_long,
        "fit": bench_fit,
    }
    result = benches[args.bench](args)
    result["machine"] = (
        f"{platform.processor() or platform.machine()}, "
        f"{jax.device_count()} x {jax.devices()[0].device_kind}, jax {jax.__version__}"
    )
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
