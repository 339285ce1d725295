"""One pure-functional decoder for Llama, Qwen2 and Qwen3, with a KV cache and interventions.

Params are a nested dict (`init_params` shows the layout); layers are a list, so the
forward is a Python loop over layers: no per-step slicing of stacked weights in decode.

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

Dimension letters: B batch, T tokens, E appended slots, S cache slots, D model,
N query heads, K kv heads, G = N / K, H head dim, F feed-forward, V vocab, L layers.
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import struct
from jaxtyping import Array, Bool, Float, Int

from explore_rl import parallel
from explore_rl.models.presets import ModelConfig

# Finite, so a query with no valid key gives a finite (unused) output instead of NaN.
_MASKED = -1e30

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
    """Random params in the layout the loaders produce (for tests and benchmarks)."""
    d, n, k, h, f = cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.d_ff
    shapes = {
        "attn_norm": (d,),
        "q": (d, n, h),
        "k": (d, k, h),
        "v": (d, k, h),
        "o": (n, h, d),
        "mlp_norm": (d,),
        "gate": (d, f),
        "up": (d, f),
        "down": (f, d),
    }
    if cfg.qkv_bias:
        shapes.update(q_bias=(n, h), k_bias=(k, h), v_bias=(k, h))
    if cfg.qk_norm:
        shapes.update(q_norm=(h,), k_norm=(h,))
    dt = cfg.jnp_param_dtype

    def tensor(key, name, shape):
        if name.endswith("norm"):
            return (1.0 + scale * jax.random.normal(key, shape)).astype(dt)
        return (scale * jax.random.normal(key, shape)).astype(dt)

    keys = jax.random.split(key, cfg.n_layers + 2)
    layers = []
    for lk in keys[: cfg.n_layers]:
        sub = jax.random.split(lk, len(shapes))
        layers.append({nm: tensor(s, nm, sh) for s, (nm, sh) in zip(sub, shapes.items())})
    params = {
        "embed": tensor(keys[-2], "embed", (cfg.vocab_size, d)),
        "layers": layers,
        "final_norm": jnp.ones((d,), dt),
    }
    if not cfg.tie_embeddings:
        params["lm_head"] = tensor(keys[-1], "lm_head", (d, cfg.vocab_size))
    return params


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


def _project_qkv(lp: dict, cfg: ModelConfig, x: Float[Array, "B T D"], rope):
    q = jnp.einsum("btd,dnh->bnth", x, lp["q"].astype(x.dtype))
    k = jnp.einsum("btd,dkh->bkth", x, lp["k"].astype(x.dtype))
    v = jnp.einsum("btd,dkh->bkth", x, lp["v"].astype(x.dtype))
    if cfg.qkv_bias:
        q = q + lp["q_bias"].astype(x.dtype)[None, :, None, :]
        k = k + lp["k_bias"].astype(x.dtype)[None, :, None, :]
        v = v + lp["v_bias"].astype(x.dtype)[None, :, None, :]
    if cfg.qk_norm:
        q = rms_norm(q, lp["q_norm"], cfg.norm_eps)
        k = rms_norm(k, lp["k_norm"], cfg.norm_eps)
    q, k = apply_rope(q, rope), apply_rope(k, rope)
    return parallel.constrain(q, *_Q), parallel.constrain(k, *_KV), parallel.constrain(v, *_KV)


class _Keys(NamedTuple):
    """One set of keys a query attends to. `grouped`: k, v are [Q, K, S, H] shared by
    B / Q consecutive query rows, with mask [Q, S]; else [B, K, S, H] with mask [B, T, S]."""

    k: Array
    v: Array
    mask: Array
    grouped: bool = False


def _partial(q: Float[Array, "B K G T H"], keys: _Keys):
    """Unnormalised softmax attention: (sum_s p_s v_s, max score, sum_s p_s)."""
    scale = 1.0 / math.sqrt(q.shape[-1])
    if keys.grouped:
        b, n_kv, g, t, h = q.shape
        rows = keys.k.shape[0]
        qq = q.reshape(rows, b // rows, n_kv, g, t, h)
        s = jnp.einsum("qxkgth,qksh->qxkgts", qq, keys.k, preferred_element_type=jnp.float32)
        s = jnp.where(keys.mask[:, None, None, None, None], s * scale, _MASKED)
        m = jnp.max(s, axis=-1, keepdims=True)
        p = jnp.exp(s - m)
        acc = jnp.einsum(
            "qxkgts,qksh->qxkgth",
            p.astype(keys.v.dtype),
            keys.v,
            preferred_element_type=jnp.float32,
        )
        flat = lambda x: x.reshape(b, n_kv, g, t, x.shape[-1])  # noqa: E731
        return flat(acc), flat(m), flat(jnp.sum(p, axis=-1, keepdims=True))
    s = jnp.einsum("bkgth,bksh->bkgts", q, keys.k, preferred_element_type=jnp.float32)
    s = jnp.where(keys.mask[:, None, None], s * scale, _MASKED)
    m = jnp.max(s, axis=-1, keepdims=True)
    p = jnp.exp(s - m)
    acc = jnp.einsum(
        "bkgts,bksh->bkgth", p.astype(keys.v.dtype), keys.v, preferred_element_type=jnp.float32
    )
    return acc, m, jnp.sum(p, axis=-1, keepdims=True)


def _merge(partials):
    """Combine partial softmaxes over disjoint key sets exactly (log-sum-exp)."""
    if len(partials) == 1:
        acc, _, total = partials[0]
        return acc / total
    top = functools.reduce(jnp.maximum, [m for _, m, _ in partials])
    scales = [jnp.exp(m - top) for _, m, _ in partials]
    acc = sum(a * c for (a, _, _), c in zip(partials, scales))
    return acc / sum(t * c for (_, _, t), c in zip(partials, scales))


def attention(
    q: Float[Array, "B N T H"], keys: list[_Keys], optional: _Keys | None = None
) -> Float[Array, "B N T H"]:
    """Softmax attention over the union of `keys`, and of `optional` where it has a valid key.

    Queries with no valid `optional` key keep the result without it bit for bit (a masked
    appended slot is exactly the clean forward).
    """
    b, n, t, h = q.shape
    kv_heads = keys[0].k.shape[1]
    qg = q.reshape(b, kv_heads, n // kv_heads, t, h)
    partials = [_partial(qg, k) for k in keys]
    out = _merge(partials)
    if optional is not None:
        with_optional = _merge(partials + [_partial(qg, optional)])
        has = jnp.any(optional.mask, axis=-1)[:, None, None, :, None]
        out = jnp.where(has, with_optional, out)
    return out.reshape(b, n, t, h).astype(q.dtype)


def mlp(lp: dict, x: Float[Array, "B T D"]) -> Float[Array, "B T D"]:
    gate = jnp.einsum("btd,df->btf", x, lp["gate"].astype(x.dtype))
    up = jnp.einsum("btd,df->btf", x, lp["up"].astype(x.dtype))
    hidden = parallel.constrain(jax.nn.silu(gate) * up, "batch", None, "mlp")
    return jnp.einsum("btf,fd->btd", hidden, lp["down"].astype(x.dtype))


@struct.dataclass
class _Context:
    """Per-call masks and positions shared by every layer."""

    rope: tuple[Array, Array] | None  # cos, sin of the main stream's positions
    keys_valid: Bool[Array, "B S"]  # which key slots hold real tokens after this call
    key_mask: Bool[Array, "B T S"] | None  # main queries -> main keys
    extra_rope: tuple[Array, Array] | None = None
    extra_key_mask: Bool[Array, "B E S"] | None = None  # appended queries -> main keys
    extra_self_mask: Bool[Array, "B E E"] | None = None  # appended queries -> appended keys
    extra_seen_mask: Bool[Array, "B T E"] | None = None  # main queries -> cached appended keys
    index: Int[Array, ""] | None = None  # cache write slot


def _context(cfg, tokens_mask, positions, cache, iv) -> _Context:
    """Masks for this call. `tokens_mask` None: only appended slots run, against the cache."""
    if cache is None:
        t = tokens_mask.shape[1]
        keys_valid, slot, q_slot = tokens_mask, jnp.arange(t), jnp.arange(t)
    elif tokens_mask is None:
        keys_valid = cache.mask
    elif cache.index.ndim:  # per-row write slots (one token per row)
        keys_valid = cache.mask.at[jnp.arange(cache.mask.shape[0]), cache.index].set(
            tokens_mask[:, 0]
        )
        slot, q_slot = jnp.arange(keys_valid.shape[1]), cache.index[:, None]
    else:
        keys_valid = jax.lax.dynamic_update_slice(cache.mask, tokens_mask, (0, cache.index))
        slot = jnp.arange(keys_valid.shape[1])
        q_slot = cache.index + jnp.arange(tokens_mask.shape[1])
    key_mask = None
    if tokens_mask is not None:
        key_mask = keys_valid[:, None, :] & (slot[None, None, :] <= q_slot[..., None])
    inv_freq = rope_frequencies(cfg)
    rope = None if positions is None else rope_table(positions, inv_freq)
    ctx = _Context(rope, keys_valid, key_mask, index=None if cache is None else cache.index)
    b, s = keys_valid.shape
    if iv is not None and iv.extra_embeds is not None:
        em = iv.extra_mask.astype(bool)
        e = em.shape[1]
        # Appended slots follow the row's real tokens; a masked slot takes no position.
        base = jnp.sum(keys_valid, axis=1, keepdims=True)
        if cache is not None and cache.prefix_mask is not None:
            shared = jnp.sum(cache.prefix_mask, axis=1)
            base += jnp.repeat(shared, b // shared.shape[0])[:, None]
        return ctx.replace(
            extra_rope=rope_table(base + jnp.cumsum(em, axis=1) - 1, inv_freq),
            extra_key_mask=jnp.broadcast_to(keys_valid[:, None, :], (b, e, s)),
            extra_self_mask=em[:, None, :] & jnp.tril(jnp.ones((e, e), bool))[None],
        )
    if cache is not None and cache.extra_mask is not None and tokens_mask is not None:
        t, e = tokens_mask.shape[1], cache.extra_mask.shape[1]
        ctx = ctx.replace(extra_seen_mask=jnp.broadcast_to(cache.extra_mask[:, None], (b, t, e)))
    return ctx


def _block(lp, cfg, x, rope, attend):
    """Pre-norm attention + MLP on one stream.

    `attend(q, k, v) -> (out, k, v)` attends with this stream's new keys and returns the
    keys to keep (written into the cache, for the main stream).
    """
    h = rms_norm(x, lp["attn_norm"], cfg.norm_eps)
    q, k, v = _project_qkv(lp, cfg, h, rope)
    attn, k, v = attend(q, k, v)
    x = x + jnp.einsum("bnth,nhd->btd", attn, lp["o"].astype(x.dtype))
    x = x + mlp(lp, rms_norm(x, lp["mlp_norm"], cfg.norm_eps))
    return parallel.constrain(x, *_ACT), k, v


def _layer(lp, cfg, x, xe, ctx: _Context, kv, extra_kv, prefix_kv):
    """One layer on the main stream x and the appended stream xe (either may be None).

    kv / extra_kv / prefix_kv: this layer's cache sections (None when absent). Returns
    the new streams and the layer's main (k, v) and appended (k, v) for the cache.
    """
    shared = [] if prefix_kv is None else [_Keys(*prefix_kv, grouped=True)]

    def attend_main(q, k, v):
        if kv is not None and ctx.index.ndim:  # row b writes its token at slot index[b]
            rows = jnp.arange(k.shape[0])
            k = kv[0].at[rows, :, ctx.index].set(k[:, :, 0])
            v = kv[1].at[rows, :, ctx.index].set(v[:, :, 0])
        elif kv is not None:
            at = (0, 0, ctx.index, 0)
            k = jax.lax.dynamic_update_slice(kv[0], k, at)
            v = jax.lax.dynamic_update_slice(kv[1], v, at)
        seen = None if ctx.extra_seen_mask is None else _Keys(*extra_kv, ctx.extra_seen_mask)
        return attention(q, [_Keys(k, v, ctx.key_mask)] + shared, seen), k, v

    def attend_extra(q, k, v):
        # Appended slots see every real earlier key, and earlier appended slots.
        keys = [_Keys(*kv, ctx.extra_key_mask)] + shared + [_Keys(k, v, ctx.extra_self_mask)]
        return attention(q, keys), k, v

    if x is not None:
        x, k, v = _block(lp, cfg, x, ctx.rope, attend_main)
        kv = (k, v)
    if xe is not None:
        xe, ke, ve = _block(lp, cfg, xe, ctx.extra_rope, attend_extra)
        extra_kv = (ke, ve)
    return x, xe, kv, extra_kv


def _steer(x, iv, layer):
    if x is None or iv is None or iv.steer is None or iv.steer_layer != layer:
        return x
    return x + iv.steer[:, None, :].astype(x.dtype)


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
    new_k, new_v, new_ek, new_ev, readout = [], [], [], [], None
    for i, lp in enumerate(params["layers"]):
        kv = extra_kv = prefix_kv = None
        if cache is not None:
            kv = (cache.k[i], cache.v[i])
            if cache.extra_k is not None:
                extra_kv = (cache.extra_k[i], cache.extra_v[i])
            if cache.prefix_k is not None:
                prefix_kv = (cache.prefix_k[i], cache.prefix_v[i], cache.prefix_mask)
        x, xe, kv, extra_kv = _layer(lp, cfg, x, xe, ctx, kv, extra_kv, prefix_kv)
        x, xe = _steer(x, iv, i), _steer(xe, iv, i)
        if iv is not None and iv.readout_layer == i:
            readout = x
        new_k.append(kv[0]), new_v.append(kv[1])
        if extra_kv is not None:
            new_ek.append(extra_kv[0]), new_ev.append(extra_kv[1])
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


def lm_logits(params: dict, cfg: ModelConfig, hidden: Float[Array, "... D"]) -> Array:
    """float32 logits of final hidden states (tied or untied head), vocab over tensor."""
    if cfg.tie_embeddings:
        w = params["embed"].astype(hidden.dtype)
        logits = jnp.einsum("...d,vd->...v", hidden, w, preferred_element_type=jnp.float32)
    else:
        w = params["lm_head"].astype(hidden.dtype)
        logits = jnp.einsum("...d,dv->...v", hidden, w, preferred_element_type=jnp.float32)
    return parallel.constrain(logits, "batch", *[None] * (logits.ndim - 2), "vocab")


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
