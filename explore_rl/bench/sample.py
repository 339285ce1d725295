"""`sample`: the peer workload (the one TRL's and Tunix's GRPO were timed on for
BENCHMARKS.md: 8 chat prompts "What is A + B? Answer with just the number." x 8 rollouts,
32 new tokens forced, temperature 1): generated tokens/s, prefill and decode seconds,
FLOP/s as a fraction of the matmul peak, and the same work through transformers'
`generate` on PyTorch CPU (needs the dev extras) in the same run. And the decode's
tokens/s against its memory-bandwidth bound (`common.decode_bound_s`: the weights once a
step plus the KV slots holding tokens, at the bandwidth of a large copy measured in the
same run).

`--prompt-len P --new-tokens N --rows B [--prompts Q]`: instead, Q random P-token prompts
each continued by B / Q rows for N forced tokens, the decode's context growing to P + N
(e.g. a long decode: `--random-init lab-1m --prompt-len 64 --new-tokens 4096 --rows 16
--no-peer`); with `--model ""` the preset keeps its own vocabulary (no tokenizer read).

`--windows 0,256`: the decode attending every response slot and attending a window from
256 up (`rollout.decode_window`, `sampler.decode`'s segments), from the same first
tokens, the calls alternating in one process (`--reps` each, the median kept) so the two
see the same load; the whole call and the top-level decode numbers are the first
window's, `windows` has each window's decode and whether its tokens equal the first's.
"""

from __future__ import annotations

import os
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

from explore_rl.bench.common import (
    PEER_GROUP,
    PEER_NEW,
    PEER_PROMPTS,
    benchmarked_model,
    decode_bound_s,
    matmul_peak,
    memory_bandwidth,
    peer_questions,
    sample_flops,
    timed,
)
from explore_rl.models import lora, presets, transformer, weights
from explore_rl.sampling import sampler, shapes

HELP = "rollout throughput on the peer workload"


def add_arguments(p) -> None:
    p.add_argument("--model", default=weights.EMBEDDED)
    p.add_argument("--random-init", default="", help="a preset: random weights of its shape")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--no-peer", action="store_true", help="skip transformers' generate")
    p.add_argument("--prompt-len", type=int, default=0, help="a random prompt (0: the peers')")
    p.add_argument("--new-tokens", type=int, default=PEER_NEW)
    p.add_argument("--rows", type=int, default=PEER_PROMPTS * PEER_GROUP)
    p.add_argument("--prompts", type=int, default=1, help="random prompts the rows continue")
    p.add_argument("--dtype", default="", choices=("", "float32", "bfloat16"))
    p.add_argument(
        "--windows",
        default="256",
        help="decode attention windows W0, comma-separated (0: every slot)",
    )
    p.add_argument("--lora-rank", type=int, default=0,
                   help="LoRA adapters of this rank on every linear layer, applied unmerged; "
                   "also times the merge once and sampling the merged weights")  # fmt: skip


def check(args) -> str | None:
    if (args.random_init or args.prompt_len) and not args.no_peer:
        return "--random-init / --prompt-len: the peer runs the peer workload; add --no-peer"
    peer = (args.new_tokens, args.rows) == (PEER_NEW, PEER_PROMPTS * PEER_GROUP)
    if not args.prompt_len and not peer:
        return "--new-tokens / --rows change a random prompt's workload: add --prompt-len"
    if min(args.new_tokens, args.rows, args.prompts) < 1 or args.prompt_len < 0:
        return "--prompt-len, --new-tokens, --rows and --prompts: positive counts"
    if args.rows % args.prompts:
        return f"--rows {args.rows}: not a whole number of groups of --prompts {args.prompts}"
    if not args.model and not (args.random_init and args.prompt_len):
        return '--model "": random weights of a preset (--random-init) on random prompts only'
    if not all(w.isdigit() for w in args.windows.split(",")):
        return f"--windows {args.windows!r}: comma-separated counts >= 0 (0: every slot)"
    return None


def _prompts(args, tok, vocab: int):
    """(tokens, mask, rows a prompt): the peer prompts, or Q random prompts of P tokens."""
    if not args.prompt_len:
        rows = [tok.encode_chat([{"role": "user", "content": q}]) for q in peer_questions()]
        return *shapes.left_pad(rows, tok.pad_id), PEER_GROUP
    tokens = jax.random.randint(jax.random.key(1), (args.prompts, args.prompt_len), 1, vocab)
    return tokens, jnp.ones(tokens.shape, bool), args.rows // args.prompts


def _model(args, **dtypes):
    """(params, cfg, tokenizer or None): `--model ""` draws the preset with its own
    vocabulary and reads no tokenizer, its prefill scanned (as the paper configs')."""
    if args.model:
        return benchmarked_model(args, **dtypes)
    cfg = presets.get_preset(args.random_init, scan_layers=True, **dtypes)  # the paper's
    return jax.jit(lambda k: transformer.init_params(cfg, k))(jax.random.key(0)), cfg, None


def run(args) -> dict:
    dtypes = {"dtype": args.dtype, "param_dtype": args.dtype} if args.dtype else {}
    params, cfg, tok = _model(args, **dtypes)
    if args.lora_rank:  # B random, as a trained adapter's: the merge is not a no-op
        cfg = cfg.replace(lora=lora.LoraConfig(args.lora_rank, 2.0 * args.lora_rank))
        adapters = jax.tree.map(lambda x: x + 0.01, lora.init(cfg, jax.random.key(1)))
        params = lora.attach(params, adapters)
    tokens, mask, group = _prompts(args, tok, cfg.vocab_size)
    b, new = tokens.shape[0] * group, args.new_tokens
    tau = jnp.ones((b, new))
    sc = sampler.SamplingConfig(new)  # no stop ids: every token forced, as the peers
    keys = iter(jax.random.split(jax.random.key(0), 100))
    windows = [int(w) for w in args.windows.split(",")]

    def call(params=params):
        return sampler.sample(
            params, cfg, tokens, mask, next(keys), tau, sc, window=windows[0]
        ).tokens

    pre = jax.jit(lambda p, t, m: sampler.prefill(p, cfg, t, m, None, b, new)[1])
    each = jnp.repeat(tokens, group, axis=0), jnp.repeat(mask, group, axis=0)
    peak, bandwidth = matmul_peak(cfg.dtype), memory_bandwidth()
    total = timed(call, reps=args.reps)
    state, u = sampler.start(params, cfg, tokens, mask, next(keys), tau, sc, None, None)
    # the loop alone: from the first token on (each call takes its own copy of the state:
    # a decode donates it; the copy, a few ms, is timed with it)

    def decode(window):
        fresh = jax.tree.map(jnp.copy, state)
        return sampler.decode(params, cfg, fresh, tau, u, sc, None, window)

    decodes = _decodes(windows, args.reps, decode)
    decode_s = decodes[0]["decode_s"]
    prefill_s = timed(pre, params, tokens, mask, reps=args.reps)
    # one prefill per row, against the group's shared one (the peer workload's question)
    unshared_s = None if args.prompt_len else timed(pre, params, *each, reps=args.reps)
    flops = sample_flops(cfg, int(mask.sum()), b, tokens.shape[1], new)
    # new - 1 steps (the first token is the prefill's); step t attends each prompt once
    # and t of each row's own slots
    reads = (new - 1) * int(mask.sum()) + b * new * (new - 1) // 2
    result = {
        "bench": "sample",
        "model": args.model,
        "random_init": args.random_init,
        "dtype": cfg.dtype,
        "rows": b,
        "prompt_len": tokens.shape[1],
        "new_tokens": new,
        "seconds": round(total, 3),
        "prefill_s": round(prefill_s, 3),
        "decode_s": round(decode_s, 3),
        "prefill_unshared_s": unshared_s and round(unshared_s, 3),
        "tokens_per_s": round(b * new / total, 1),
        "decode_tokens_per_s": round(b * (new - 1) / decode_s, 1),
        "fraction_of_peak": round(flops / total / peak, 3),
        "fraction_of_bandwidth_bound": round(
            decode_bound_s(cfg, new - 1, reads, bandwidth) / decode_s, 3
        ),
        "matmul_peak_gflops": round(peak / 1e9, 1),
        "bandwidth_gbs": round(bandwidth / 1e9, 1),
        "window": windows[0],
    }
    if len(windows) > 1:
        bound_s = decode_bound_s(cfg, new - 1, reads, bandwidth)
        result["windows"] = [
            {
                "window": d["window"],
                "decode_s": round(d["decode_s"], 3),
                "decode_tokens_per_s": round(b * (new - 1) / d["decode_s"], 1),
                "fraction_of_bandwidth_bound": round(bound_s / d["decode_s"], 3),
                "same_tokens": d["same_tokens"],
            }
            for d in decodes
        ]
    if args.lora_rank:
        merge = jax.jit(lambda p: lora.merged(p, cfg))
        merged = merge(params)
        result["lora_rank"] = args.lora_rank
        result["merge_s"] = round(timed(merge, params, reps=args.reps), 3)
        result["merged_seconds"] = round(timed(call, merged, reps=args.reps), 3)
    if not args.no_peer:
        result.update(peer_generate(tok, args.reps))
        result["speedup_vs_peer"] = round(result["tokens_per_s"] / result["peer_tokens_per_s"], 2)
    return result


def _decodes(windows: list[int], reps: int, decode) -> list[dict]:
    """Each window's decode (`decode(window)` -> Samples): one warm-up (compile) call each,
    then `reps` calls each, alternating (A B, B A, ...); the median seconds, and whether
    the tokens equal the first window's."""
    tokens = {w: np.asarray(jax.block_until_ready(decode(w)).tokens) for w in windows}
    times = {w: [] for w in windows}
    for rep in range(reps):
        for w in windows if rep % 2 == 0 else windows[::-1]:
            start = time.perf_counter()
            jax.block_until_ready(decode(w))
            times[w].append(time.perf_counter() - start)
    return [
        {
            "window": w,
            "decode_s": statistics.median(times[w]),
            "same_tokens": bool(np.array_equal(tokens[w], tokens[windows[0]])),
        }
        for w in windows
    ]


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

    seconds = timed(gen, reps=reps)
    return {
        "peer": f"transformers {__import__('transformers').__version__} generate, "
        f"torch {torch.__version__}",
        "peer_seconds": round(seconds, 3),
        "peer_tokens_per_s": round(len(rows) * PEER_NEW / seconds, 1),
    }
