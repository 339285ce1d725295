"""`sample`: the peer workload (the one TRL's and Tunix's GRPO were timed on for
BENCHMARKS.md: 8 chat prompts "What is A + B? Answer with just the number." x 8 rollouts,
32 new tokens forced, temperature 1): generated tokens/s, prefill and decode seconds,
FLOP/s as a fraction of the matmul peak, and the same work through transformers'
`generate` on PyTorch CPU (needs the dev extras) in the same run.
"""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp

from explore_rl.bench.common import (
    PEER_GROUP,
    PEER_NEW,
    PEER_PROMPTS,
    benchmarked_model,
    matmul_peak,
    peer_questions,
    sample_flops,
    timed,
)
from explore_rl.models import lora, weights
from explore_rl.sampling import sampler, shapes

HELP = "rollout throughput on the peer workload"


def add_arguments(p) -> None:
    p.add_argument("--model", default=weights.EMBEDDED)
    p.add_argument("--random-init", default="", help="a preset: random weights of its shape")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--no-peer", action="store_true", help="skip transformers' generate")
    p.add_argument("--lora-rank", type=int, default=0,
                   help="LoRA adapters of this rank on every linear layer, applied unmerged; "
                   "also times the merge once and sampling the merged weights")  # fmt: skip


def check(args) -> str | None:
    if args.random_init and not args.no_peer:
        return "--random-init: the peer runs the real model; add --no-peer"
    return None


def run(args) -> dict:
    params, cfg, tok = benchmarked_model(args)
    if args.lora_rank:  # B random, as a trained adapter's: the merge is not a no-op
        cfg = cfg.replace(lora=lora.LoraConfig(args.lora_rank, 2.0 * args.lora_rank))
        adapters = jax.tree.map(lambda x: x + 0.01, lora.init(cfg, jax.random.key(1)))
        params = lora.attach(params, adapters)
    rows = [tok.encode_chat([{"role": "user", "content": q}]) for q in peer_questions()]
    tokens, mask = shapes.left_pad(rows, tok.pad_id)
    b = PEER_PROMPTS * PEER_GROUP
    tau = jnp.ones((b, PEER_NEW))
    sc = sampler.SamplingConfig(PEER_NEW)  # no stop ids: 32 tokens forced, as the peers
    keys = iter(jax.random.split(jax.random.key(0), 100))
    run = lambda: sampler.sample(params, cfg, tokens, mask, next(keys), tau, sc).tokens  # noqa: E731
    pre = jax.jit(lambda p, t, m: sampler.prefill(p, cfg, t, m, None, b, PEER_NEW)[1])
    each = jnp.repeat(tokens, PEER_GROUP, axis=0), jnp.repeat(mask, PEER_GROUP, axis=0)
    peak = matmul_peak("float32")
    total = timed(run, reps=args.reps)
    prefill_s = timed(pre, params, tokens, mask, reps=args.reps)
    unshared_s = timed(pre, params, *each, reps=args.reps)  # one prefill per row
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
    if args.lora_rank:
        merge = jax.jit(lambda p: lora.merged(p, cfg))
        merged = merge(params)
        result["lora_rank"] = args.lora_rank
        result["merge_s"] = round(timed(merge, params, reps=args.reps), 3)
        plain = lambda: sampler.sample(merged, cfg, tokens, mask, next(keys), tau, sc).tokens  # noqa: E731
        result["merged_seconds"] = round(timed(plain, reps=args.reps), 3)
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

    seconds = timed(gen, reps=reps)
    return {
        "peer": f"transformers {__import__('transformers').__version__} generate, "
        f"torch {torch.__version__}",
        "peer_seconds": round(seconds, 3),
        "peer_tokens_per_s": round(len(rows) * PEER_NEW / seconds, 1),
    }
