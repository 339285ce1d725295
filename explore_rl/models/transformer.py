"""One pure-functional decoder for Llama, Qwen2 and Qwen3, with a KV cache and interventions.

Params are a nested dict (`init_params` shows the layout); layers are a list, so the
forward is a Python loop over layers: no per-step slicing of stacked weights in decode.
With `ModelConfig.scan_layers` a pass that fills its cache (a prefill, the update) scans
one compiled layer over the weights stacked for that pass instead.

`forward(params, cfg, tokens, positions, mask, cache=None, interventions=None)` runs the
decoder over `tokens` [B, T]. `mask` marks real tokens; positions are the RoPE positions
(callers derive them from the mask, so left padding is free). With a cache, the new keys
are written at `cache.index` and queries attend to every valid earlier slot.

Interventions (EDEN, ASE):
- appended embeddings `extra_embeds` [B, E, D] after the tokens, with `extra_mask` [B, E].
  They live in a cache section of their own and their attention is merged into each
  query's softmax by log-sum-exp; a row whose extras are all masked takes the plain
  attention output unchanged, so a masked slot is bit-for-bit the clean forward.
- a per-row steering vector [B, D] added to the output of block `steer_layer`;
- a readout of block `readout_layer`'s output.

Long sequences (`ModelConfig.attention`, `remat`, `logits_chunk`): attention is blockwise
past `attention_block` queries (`models/attention.py`: no [T, S] scores), each layer can be
rematerialised in the backward, and `token_logprobs` scores tokens a chunk of positions at
a time (no [T, V] logits). Each changes memory, not results (up to float rounding).

Dimension letters: B batch, T tokens, E appended slots, S cache slots, D model,
N query heads, K kv heads, G = N / K, H head dim, F feed-forward, V vocab, L layers.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from flax import struct
from jaxtyping import Array, Bool, Float, Int

from explore_rl import parallel
from explore_rl.models import attention, family, lora
from explore_rl.models.attention import Keys
from explore_rl.models.presets import ModelConfig

# Logical names of activation dimensions (`parallel.RULES` maps them to mesh axes).
_ACT = ("batch", None, None)  # [B, T, D]: rows sharded, the model dimension whole
_Q, _KV = ("batch", "heads", None, None), ("batch", "kv_heads", None, None)  # [B, N|K, T, H]


@struct.dataclass
class Interventions:
    """What a rollout changes about the forward pass. All arrays are traced."""

    extra_embeds: Float[Array, "B E D"] | None = None
    extra_mask: Bool[Array, "B E"] | None = None
    steer: Float[Array, "B D"] | None = None
    steer_layer: int = struct.field(pytree_node=False, default=0)
    readout_layer: int | None = struct.field(pytree_node=False, default=None)


@struct.dataclass
class KVCache:
    """Preallocated keys/values, [B, K, S, H] per layer, plus two optional sections.

    - prefix: keys of Q shared prompts [Q, K, L, H]; row b sees prefix b // (B / Q), so a
      group of rollouts reads its prompt's keys once, not once per row;
    - extra: appended slots per row [B, K, E, H] (EDEN), seen by every later token.
    """

    k: list[Float[Array, "B K S H"]]
    v: list[Float[Array, "B K S H"]]
    mask: Bool[Array, "B S"]
    # The slot the next token is written to: one for all rows, or one per row [B] for a
    # one-token decode whose rows are at different steps (the rollout engine's slots).
    index: Int[Array, ""] | Int[Array, " B"]
    extra_k: list[Float[Array, "B K E H"]] | None = None
    extra_v: list[Float[Array, "B K E H"]] | None = None
    extra_mask: Bool[Array, "B E"] | None = None
    prefix_k: list[Float[Array, "Q K L H"]] | None = None
    prefix_v: list[Float[Array, "Q K L H"]] | None = None
    prefix_mask: Bool[Array, "Q L"] | None = None


@struct.dataclass
class Output:
    logits: Float[Array, "B T V"] | None
    hidden: Float[Array, "B T D"] | None
    cache: KVCache | None = None
    readout: Float[Array, "B T D"] | None = None
    extra_logits: Float[Array, "B E V"] | None = None
    extra_hidden: Float[Array, "B E D"] | None = None


def init_cache(
    cfg: ModelConfig, batch: int, length: int, n_extra: int = 0, prefix: KVCache | None = None
) -> KVCache:
    """An empty cache of `length` slots per row; `prefix` (a filled cache of Q prompts,
    Q dividing batch) becomes the shared prompt section."""
    if prefix is not None and batch % prefix.mask.shape[0]:
        raise ValueError(f"batch {batch} is not a multiple of the {prefix.mask.shape[0]} prefixes")
    shape = (batch, cfg.n_kv_heads, length, cfg.head_dim)

    def zeros(s):  # rows over the batch axes, kv heads over tensor (as the keys computed)
        return [parallel.constrain(jnp.zeros(s, cfg.jnp_dtype), *_KV) for _ in range(cfg.n_layers)]

    extra_shape = (batch, cfg.n_kv_heads, n_extra, cfg.head_dim)
    return KVCache(
        k=zeros(shape),
        v=zeros(shape),
        mask=jnp.zeros((batch, length), bool),
        index=jnp.zeros((), jnp.int32),
        extra_k=zeros(extra_shape) if n_extra else None,
        extra_v=zeros(extra_shape) if n_extra else None,
        extra_mask=jnp.zeros((batch, n_extra), bool) if n_extra else None,
        prefix_k=None if prefix is None else prefix.k,
        prefix_v=None if prefix is None else prefix.v,
        prefix_mask=None if prefix is None else prefix.mask,
    )


def init_params(cfg: ModelConfig, key: jax.Array, scale: float = 0.02) -> dict:
    """Random params of every weight `cfg`'s family declares (`models/family.py`), in the
    layout the loaders produce (for tests, benchmarks and models trained from scratch)."""
    fam = family.get(cfg.family)
    dt = cfg.jnp_param_dtype

    def tensor(key, w):
        if w.init == "ones":
            return jnp.ones(w.dims(cfg), dt)
        x = scale * jax.random.normal(key, w.dims(cfg))
        return (1.0 + x if w.init == "norm" else x).astype(dt)

    drawn = [n for n, w in fam.top.items() if w.init != "ones"]
    keys = jax.random.split(key, cfg.n_layers + len(drawn))
    layers = []
    for lk in keys[: cfg.n_layers]:
        sub = jax.random.split(lk, len(fam.layer))
        layers.append({n: tensor(s, w) for s, (n, w) in zip(sub, fam.layer.items())})
    top_keys = dict(zip(drawn, keys[cfg.n_layers :]))
    top = {path[0]: w for path, w in fam.weights(cfg) if len(path) == 1}  # lm_head if untied
    return {**{n: tensor(top_keys.get(n), w) for n, w in top.items()}, "layers": layers}


def rms_norm(x: Array, w: Array, eps: float) -> Array:
    # Statistics in float32, the result cast back before the weight (as HF does).
    xf = x.astype(jnp.float32)
    y = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + eps)
    return w.astype(x.dtype) * y.astype(x.dtype)


def rope_frequencies(cfg: ModelConfig) -> Float[Array, " H2"]:
    """Inverse frequencies, with Llama-3.1 scaling when the config has it."""
    inv = 1.0 / (
        cfg.rope_theta ** (jnp.arange(0, cfg.head_dim, 2, dtype=jnp.float32) / cfg.head_dim)
    )
    if cfg.rope_llama3_scaling is None:
        return inv
    factor, low, high, original = cfg.rope_llama3_scaling
    wavelen = 2 * math.pi / inv
    scaled = jnp.where(wavelen > original / low, inv / factor, inv)
    smooth = (original / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= original / high) & (wavelen <= original / low)
    return jnp.where(medium, smoothed, scaled)


def rope_table(positions: Int[Array, "B T"], inv_freq) -> tuple[Array, Array]:
    """cos and sin [B, 1, T, H/2] of each position, computed once per forward for all layers."""
    angles = positions[:, None, :, None].astype(jnp.float32) * inv_freq
    return jnp.cos(angles), jnp.sin(angles)


def apply_rope(x: Float[Array, "B X T H"], rope: tuple[Array, Array]) -> Array:
    """Rotate-half RoPE (HF convention) for x laid out [B, heads, T, H]."""
    cos, sin = rope
    x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
    out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
    return out.astype(x.dtype)


def _linear(lp: dict, cfg: ModelConfig, name: str, eq: str, x: Array) -> Array:
    """x times weight `name` (einsum `eq`), plus its LoRA adapter's s (x A) B where the
    layer has one (`models/lora.py`), in the update and in rollouts alike: unmerged.
    Merging W + s A B once per step samples faster (on a CPU 0.81x the time, merge
    included: BENCHMARKS.md, `bench sample --lora-rank 8`) but rounds the update into
    the weights' dtype: on a bfloat16 base a young adapter's update is below the
    weights' resolution, so rollouts would not see it, and mu would no longer be the
    computation pi_old is. Params without adapters are the base model."""
    y = jnp.einsum(eq, x, lp[name].astype(x.dtype))
    if name + family.LORA_A not in lp:
        return y
    a, b = lp[name + family.LORA_A], lp[name + family.LORA_B]
    return y + lora.delta(eq, x, a, b, cfg.lora.scale)


def _project_qkv(lp: dict, cfg: ModelConfig, x: Float[Array, "B T D"], rope):
    q = _linear(lp, cfg, "q", "btd,dnh->bnth", x)
    k = _linear(lp, cfg, "k", "btd,dkh->bkth", x)
    v = _linear(lp, cfg, "v", "btd,dkh->bkth", x)
    if cfg.qkv_bias:
        q = q + lp["q_bias"].astype(x.dtype)[None, :, None, :]
        k = k + lp["k_bias"].astype(x.dtype)[None, :, None, :]
        v = v + lp["v_bias"].astype(x.dtype)[None, :, None, :]
    if cfg.qk_norm:
        q = rms_norm(q, lp["q_norm"], cfg.norm_eps)
        k = rms_norm(k, lp["k_norm"], cfg.norm_eps)
    q, k = apply_rope(q, rope), apply_rope(k, rope)
    return parallel.constrain(q, *_Q), parallel.constrain(k, *_KV), parallel.constrain(v, *_KV)


def mlp(lp: dict, cfg: ModelConfig, x: Float[Array, "B T D"]) -> Float[Array, "B T D"]:
    # On [B x T, D] rows, not [B, T, D]: XLA's CPU backward of the 3-D product writes the
    # [B x T, F] cotangent transposed for the weights' gradient, a strided copy that took a
    # fifth of the lab's update gradient; the 2-D product needs none (the gradient a
    # quarter faster: BENCHMARKS.md, `bench lab`).
    rows = x.reshape(-1, x.shape[-1])
    gate = _linear(lp, cfg, "gate", "md,df->mf", rows)
    up = _linear(lp, cfg, "up", "md,df->mf", rows)
    hidden = parallel.constrain(jax.nn.silu(gate) * up, "batch", "mlp")
    return _linear(lp, cfg, "down", "mf,fd->md", hidden).reshape(x.shape)


@struct.dataclass
class _Context:
    """Per-call positions and key masks shared by every layer. Masks are kept as which
    slots hold real tokens and the cache slot of each query (`attention.Keys`), never as
    [T, S] arrays: a tile's mask is built where attention uses it."""

    rope: tuple[Array, Array] | None  # cos, sin of the main stream's positions
    keys_valid: Bool[Array, "B S"]  # which key slots hold real tokens after this call
    q_slot: Int[Array, "_ T"] | None  # the cache slot of each main query (causal)
    extra_rope: tuple[Array, Array] | None = None
    extra_valid: Bool[Array, "B E"] | None = None  # appended slots that are real
    extra_seen: Bool[Array, "B E"] | None = None  # cached appended slots main queries see
    index: Int[Array, ""] | None = None  # cache write slot


def _context(cfg, tokens_mask, positions, cache, iv) -> _Context:
    """Masks for this call. `tokens_mask` None: only appended slots run, against the cache."""
    q_slot = None
    if cache is None:
        keys_valid, q_slot = tokens_mask, jnp.arange(tokens_mask.shape[1])[None]
    elif tokens_mask is None:
        keys_valid = cache.mask
    elif cache.index.ndim:  # per-row write slots (one token per row)
        keys_valid = cache.mask.at[jnp.arange(cache.mask.shape[0]), cache.index].set(
            tokens_mask[:, 0]
        )
        q_slot = cache.index[:, None]
    else:
        keys_valid = jax.lax.dynamic_update_slice(cache.mask, tokens_mask, (0, cache.index))
        q_slot = (cache.index + jnp.arange(tokens_mask.shape[1]))[None]
    inv_freq = rope_frequencies(cfg)
    rope = None if positions is None else rope_table(positions, inv_freq)
    ctx = _Context(rope, keys_valid, q_slot, index=None if cache is None else cache.index)
    b = keys_valid.shape[0]
    if iv is not None and iv.extra_embeds is not None:
        em = iv.extra_mask.astype(bool)
        # Appended slots follow the row's real tokens; a masked slot takes no position.
        base = jnp.sum(keys_valid, axis=1, keepdims=True)
        if cache is not None and cache.prefix_mask is not None:
            shared = jnp.sum(cache.prefix_mask, axis=1)
            base += jnp.repeat(shared, b // shared.shape[0])[:, None]
        return ctx.replace(
            extra_rope=rope_table(base + jnp.cumsum(em, axis=1) - 1, inv_freq), extra_valid=em
        )
    if cache is not None and cache.extra_mask is not None and tokens_mask is not None:
        ctx = ctx.replace(extra_seen=cache.extra_mask)
    return ctx


def _block(lp, cfg, x, rope, attend):
    """Pre-norm attention + MLP on one stream.

    `attend(q, k, v) -> (out, k, v)` attends with this stream's new keys and returns the
    keys to keep (written into the cache, for the main stream).
    """
    h = rms_norm(x, lp["attn_norm"], cfg.norm_eps)
    q, k, v = _project_qkv(lp, cfg, h, rope)
    attn, k, v = attend(q, k, v)
    x = x + _linear(lp, cfg, "o", "bnth,nhd->btd", attn)
    x = x + mlp(lp, cfg, rms_norm(x, lp["mlp_norm"], cfg.norm_eps))
    return parallel.constrain(x, *_ACT), k, v


def _layer(lp, cfg, x, xe, ctx: _Context, kv, extra_kv, prefix_kv):
    """One layer on the main stream x and the appended stream xe (either may be None).

    kv / extra_kv / prefix_kv: this layer's cache sections (None when absent). Returns
    the new streams and the layer's main (k, v) and appended (k, v) for the cache.
    """
    shared = [] if prefix_kv is None else [Keys(*prefix_kv)]
    attend = functools.partial(
        attention.attention, implementation=cfg.attention, block=cfg.attention_block
    )

    def attend_main(q, k, v):
        if kv is not None and ctx.index.ndim:  # row b writes its token at slot index[b]
            rows = jnp.arange(k.shape[0])
            k = kv[0].at[rows, :, ctx.index].set(k[:, :, 0])
            v = kv[1].at[rows, :, ctx.index].set(v[:, :, 0])
        elif kv is not None:
            at = (0, 0, ctx.index, 0)
            k = jax.lax.dynamic_update_slice(kv[0], k, at)
            v = jax.lax.dynamic_update_slice(kv[1], v, at)
        # cached appended slots come last: a row with none masked in gets the plain result
        seen = [] if ctx.extra_seen is None else [Keys(*extra_kv, ctx.extra_seen)]
        return attend(q, [Keys(k, v, ctx.keys_valid, ctx.q_slot)] + shared + seen), k, v

    def attend_extra(q, k, v):
        # Appended slots see every real earlier key, and earlier appended slots.
        causal = jnp.arange(k.shape[2])[None]
        keys = [Keys(*kv, ctx.keys_valid)] + shared + [Keys(k, v, ctx.extra_valid, causal)]
        return attend(q, keys), k, v

    if x is not None:
        x, k, v = _block(lp, cfg, x, ctx.rope, attend_main)
        kv = (k, v)
    if xe is not None:
        xe, ke, ve = _block(lp, cfg, xe, ctx.extra_rope, attend_extra)
        extra_kv = (ke, ve)
    return x, xe, kv, extra_kv


# What a rematerialised layer keeps for the backward (`ModelConfig.remat`): `block` only
# its inputs (the layer runs again in the backward), `dots` also its weight matmuls'
# outputs (the attention einsums carry batch dimensions, so their scores are not kept).
REMAT_POLICIES = {
    "block": jax.checkpoint_policies.nothing_saveable,
    "dots": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
}


def _layer_program(cfg: ModelConfig):
    if cfg.remat == "none":
        return _layer
    return jax.checkpoint(_layer, policy=REMAT_POLICIES[cfg.remat], static_argnums=(1,))


def _steer(x, iv, layer):
    if x is None or iv is None or iv.steer is None or iv.steer_layer != layer:
        return x
    return x + iv.steer[:, None, :].astype(x.dtype)


def _layer_caches(cache: KVCache | None, i: int | slice):
    """Layer i's (or a slice of layers') cache sections: (kv, extra_kv, prefix_kv), each
    None when absent; lists of layers where i is a slice."""
    if cache is None:
        return None, None, None
    kv = (cache.k[i], cache.v[i])
    extra_kv = None if cache.extra_k is None else (cache.extra_k[i], cache.extra_v[i])
    prefix_kv = None if cache.prefix_k is None else (cache.prefix_k[i], cache.prefix_v[i])
    return kv, extra_kv, prefix_kv


def _unrolled_layers(layers, cfg, x, xe, ctx, cache, iv):
    """Each layer its own code in the program: (x, xe, ([k], [v]), ([extra k], [extra v]),
    readout), the lists one entry a layer (unused without a cache)."""
    new_k, new_v, new_ek, new_ev, readout = [], [], [], [], None
    layer = _layer_program(cfg)
    for i, lp in enumerate(layers):
        kv, extra_kv, prefix_kv = _layer_caches(cache, i)
        if prefix_kv is not None:
            prefix_kv = (*prefix_kv, cache.prefix_mask)
        x, xe, kv, extra_kv = layer(lp, cfg, x, xe, ctx, kv, extra_kv, prefix_kv)
        x, xe = _steer(x, iv, i), _steer(xe, iv, i)
        if iv is not None and iv.readout_layer == i:
            readout = x
        new_k.append(kv[0]), new_v.append(kv[1])
        if extra_kv is not None:
            new_ek.append(extra_kv[0]), new_ev.append(extra_kv[1])
    return x, xe, (new_k, new_v), (new_ek, new_ev), readout


def _scanned_layers(layers, cfg, x, xe, ctx, cache, iv):
    """`_unrolled_layers` as one compiled layer scanned over the layers' weights stacked
    for this call (MaxText's `scan_layers`, `ModelConfig.scan_layers`): the 1.5B update at
    28 layers compiles in a third of the unrolled time (`bench depth`; what still grows
    with depth is the stacking and slicing, a few operations a layer), for one stacked copy
    of the layers' weights. Cut into scans at the steered and read-out layers, which act
    between them."""
    stack = lambda trees: jax.tree.map(lambda *a: jnp.stack(a), *trees)  # noqa: E731
    cuts = {0, len(layers)}
    if iv is not None and iv.steer is not None:
        cuts.add(iv.steer_layer + 1)
    if iv is not None and iv.readout_layer is not None:
        cuts.add(iv.readout_layer + 1)
    cuts = sorted(c for c in cuts if c <= len(layers))
    layer = _layer_program(cfg)
    prefix_mask = None if cache is None else cache.prefix_mask
    new_k, new_v, new_ek, new_ev, readout = [], [], [], [], None

    def body(streams, xs):
        lp, kv, extra_kv, prefix_kv = xs
        if prefix_kv is not None:
            prefix_kv = (*prefix_kv, prefix_mask)
        x, xe, kv, extra_kv = layer(lp, cfg, *streams, ctx, kv, extra_kv, prefix_kv)
        return (x, xe), None if cache is None else (kv, extra_kv)

    for a, b in zip(cuts, cuts[1:]):
        sections = [
            None if s is None else tuple(map(stack, s)) for s in _layer_caches(cache, slice(a, b))
        ]
        (x, xe), kept = jax.lax.scan(body, (x, xe), (stack(layers[a:b]), *sections))
        x, xe = _steer(x, iv, b - 1), _steer(xe, iv, b - 1)
        if iv is not None and iv.readout_layer == b - 1:
            readout = x
        if kept is not None:
            (k, v), extra_kv = kept
            new_k, new_v = new_k + list(k), new_v + list(v)
            if extra_kv is not None:
                new_ek, new_ev = new_ek + list(extra_kv[0]), new_ev + list(extra_kv[1])
    return x, xe, (new_k, new_v), (new_ek, new_ev), readout


def hidden_states(
    params: dict,
    cfg: ModelConfig,
    tokens: Int[Array, "B T"] | None,
    positions: Int[Array, "B T"] | None,
    mask: Bool[Array, "B T"] | None,
    cache: KVCache | None = None,
    interventions: Interventions | None = None,
) -> Output:
    """The decoder up to the final norm: hidden states, new cache, readout; no logits.

    With `tokens` None only the appended slots run, against the cache: the sampler
    prefills a prompt once per group and appends each row's slot afterwards.
    """
    iv = interventions
    mask = None if mask is None else mask.astype(bool)
    ctx = _context(cfg, mask, positions, cache, iv)
    x = None
    if tokens is not None:  # the table gathered over fsdp for the lookup, as any weight
        x = parallel.constrain(params["embed"], "vocab", None)[tokens].astype(cfg.jnp_dtype)
        x = parallel.constrain(x, *_ACT)
    xe = None if ctx.extra_rope is None else iv.extra_embeds.astype(cfg.jnp_dtype)
    if xe is not None and cache is not None and cache.extra_k is None:
        raise ValueError("appended embeddings need a cache made with n_extra > 0")
    # A call that fills its whole cache (a prefill, the update's passes) may scan; a decode
    # step writes one slot of a long cache, which a scan would copy whole every token.
    fills = cache is None or (tokens is not None and tokens.shape[1] == cache.mask.shape[1])
    run = _scanned_layers if cfg.scan_layers and fills else _unrolled_layers
    x, xe, new_kv, new_extra, readout = run(params["layers"], cfg, x, xe, ctx, cache, iv)
    new_k, new_v = new_kv
    new_ek, new_ev = new_extra
    new_cache = None
    if cache is not None:
        steps = 0 if tokens is None else tokens.shape[1]
        new_cache = cache.replace(k=new_k, v=new_v, mask=ctx.keys_valid, index=cache.index + steps)
        if xe is not None:
            new_cache = new_cache.replace(
                extra_k=new_ek, extra_v=new_ev, extra_mask=iv.extra_mask.astype(bool)
            )
    norm = lambda h: None if h is None else rms_norm(h, params["final_norm"], cfg.norm_eps)  # noqa: E731
    return Output(
        logits=None, hidden=norm(x), cache=new_cache, readout=readout, extra_hidden=norm(xe)
    )


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _head(spec: str, hidden: Array, w: Array) -> Array:
    """float32 logits of `hidden` and `w` (both the activation dtype): accumulated in
    float32, with a backward whose matmuls take the activation dtype too (the float32
    logits' cotangent rounded to it), as every other matmul of the model does: autodiff
    would run both of the head's backward matmuls, the largest of a small model, in
    float32 under bfloat16."""
    return jnp.einsum(spec, hidden, w, preferred_element_type=jnp.float32)


def _head_fwd(spec, hidden, w):
    return _head(spec, hidden, w), (hidden, w)


def _head_bwd(spec, residuals, ct):
    hidden, w = residuals
    _, vjp = jax.vjp(lambda h, w: jnp.einsum(spec, h, w), hidden, w)
    return vjp(ct.astype(hidden.dtype))


_head.defvjp(_head_fwd, _head_bwd)


def lm_logits(params: dict, cfg: ModelConfig, hidden: Float[Array, "... D"]) -> Array:
    """float32 logits of final hidden states (tied or untied head), vocab over tensor."""
    if cfg.tie_embeddings:
        logits = _head("...d,vd->...v", hidden, params["embed"].astype(hidden.dtype))
    else:
        logits = _head("...d,dv->...v", hidden, params["lm_head"].astype(hidden.dtype))
    return parallel.constrain(logits, "batch", *[None] * (logits.ndim - 2), "vocab")


def token_logprobs(
    params: dict,
    cfg: ModelConfig,
    hidden: Float[Array, "B T D"],
    tokens: Int[Array, "B T"],
    temperature: float = 1.0,
) -> tuple[Float[Array, "B T"], Float[Array, "B T"]]:
    """log pi(tokens[b, t]) and the entropy of pi at each position, pi = softmax(logits /
    temperature), from the final hidden states.

    C positions at a time (Tunix's `compute_per_token_logps`), C such that a device's rows
    times C is at most `cfg.logits_chunk` tokens (at least one position): each chunk's
    float32 [B, C, V] logits are made, reduced and dropped, and the backward makes them
    again (a rematerialised scan step), so neither pass holds [B, T, V] (a single chunk is
    kept instead: the backward starts with it). Cut by tokens, not positions, so a
    micro-batch of many short rows holds no more than one of few long ones. With the
    vocabulary over the tensor axis, the log-softmax reduces over its shards.
    """
    b, t, d = hidden.shape
    rows = max(b // parallel.batch_shards(), 1)  # a device's
    c = max(min(cfg.logits_chunk // rows, t), 1)
    n = -(-t // c)
    pad = n * c - t

    def chunks(x):  # [B, T, ...] -> [n, B, C, ...], padded to whole chunks
        padded = jnp.pad(x, [(0, 0), (0, pad)] + [(0, 0)] * (x.ndim - 2))
        return jnp.moveaxis(padded.reshape(b, n, c, *x.shape[2:]), 1, 0)

    def one(h, tok):
        logp_all = jax.nn.log_softmax(lm_logits(params, cfg, h) / temperature, axis=-1)
        logp = jnp.take_along_axis(logp_all, tok[..., None], axis=-1)[..., 0]
        return logp, -jnp.sum(jnp.exp(logp_all) * logp_all, axis=-1)

    # One chunk's residuals are used first thing in the backward: remaking them would cost
    # an LM-head matmul and save no memory.
    step = one if n == 1 else jax.checkpoint(one)
    logp, entropy = jax.lax.map(lambda x: step(*x), (chunks(hidden), chunks(tokens)))
    unchunk = lambda x: jnp.moveaxis(x, 0, 1).reshape(b, n * c)[:, :t]  # noqa: E731
    return unchunk(logp), unchunk(entropy)


def forward(
    params: dict,
    cfg: ModelConfig,
    tokens: Int[Array, "B T"],
    positions: Int[Array, "B T"],
    mask: Bool[Array, "B T"],
    cache: KVCache | None = None,
    interventions: Interventions | None = None,
) -> Output:
    """Logits [B, T, V] (float32), new cache, readout and appended-slot logits."""
    out = hidden_states(params, cfg, tokens, positions, mask, cache, interventions)
    logits = lambda h: None if h is None else lm_logits(params, cfg, h)  # noqa: E731
    return out.replace(logits=logits(out.hidden), extra_logits=logits(out.extra_hidden))


def positions_from_mask(mask: Bool[Array, "B T"]) -> Int[Array, "B T"]:
    """RoPE positions for left-padded rows: 0 at the first real token (pads get 0)."""
    return jnp.maximum(jnp.cumsum(mask.astype(jnp.int32), axis=1) - 1, 0)
