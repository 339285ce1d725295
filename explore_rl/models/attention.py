"""Softmax attention over several key sets: dense for short queries, blockwise for long ones.

A query attends to the union of its key sets (`Keys`): the row's own keys (causal by cache
slot), a prompt prefix shared by a group of rows, appended slots (EDEN). Masks are never
materialised whole: each set carries which of its slots hold real tokens (`valid`, [R, S])
and, when causal, the cache slot of each query (`q_slot`); a tile's mask is built from
them where it is used.

- `dense`: every set's scores at once, merged by log-sum-exp. [B, N, T, S] scores: the
  fastest for decode (T = 1) and short prompts.
- `blockwise`: FlashAttention-2 (Dao 2023, Alg. 1 and 2) in plain JAX: query blocks of
  `block` tokens, each folding key blocks into a running (max, sum, weighted values) with
  an online softmax; tiles wholly above the causal diagonal or wholly padding are
  skipped. A custom VJP keeps only the output and the log-sum-exp per query and recomputes
  each tile in the backward, so no [T, S] array exists in the forward or the backward:
  memory is linear in the length. Same results as `dense` up to float32 rounding of
  another summation order.
- `fused`: the platform's kernel through `jax.nn.dot_product_attention` (cuDNN's flash
  attention on a GPU; its XLA implementation on a CPU, which the tests check against
  `blockwise`). It takes one causal key set whose queries are its keys (a full-sequence
  pass: the update's forward and backward, scoring, a prompt's prefill), with key validity
  given as lengths: each row's real tokens are gathered to its front (one [B, T] gather of
  q, k, v and its inverse on the output), so left padding, holes and trailing padding all
  become cuDNN's right padding (`PADDING_CAUSAL`). Other calls (decode, EDEN's appended
  slots against a cache) take the portable path. Its residual (the log-sum-exp) carries
  no gradient in the pinned JAX (d lse / d q is exactly 0), so merging key sets by it
  would need a backward of its own: instead the group-shared prompt is laid out the
  kernel's way, each row as one contiguous prompt + response sequence
  (`rl/scoring.py`). That repeats the prompt's compute once per row (G-fold for the
  prompt's tokens); it pays on a GPU, where the kernel never writes scores to memory and
  skips the causal upper half, while the portable path's tiles are separate XLA ops whose
  scores go through HBM. `auto` picks `fused` on a GPU for bfloat16 / float16 and head
  dims cuDNN takes, `dense` / `blockwise` otherwise (`describe`).

A query with no valid key in a set gets exactly what it would get without that set (a
fully masked tile changes neither the running max, nor the sum, nor the values), so a
masked appended slot is bit for bit the clean forward in either implementation.

Dimension letters: B query rows, R key-set rows (B, or Q prompts shared by X = B / R
consecutive rows), K kv heads, G query heads per kv head, T queries, S key slots, H head
dim.
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Int

# Finite, so a query with no valid key gives a finite (unused) output instead of NaN.
MASKED = -1e30


class Keys(NamedTuple):
    """One set of keys. Row r of k / v serves query rows r * X .. (r + 1) * X - 1.

    valid: which key slots hold real tokens. q_slot: [B or 1, T] the cache slot of each
    query, when the set is causal (a query sees slots <= its own); None: every valid slot.
    """

    k: Float[Array, "R K S H"]
    v: Float[Array, "R K S H"]
    valid: Bool[Array, "R S"]
    q_slot: Int[Array, "_ T"] | None = None


def fused_kernel_available(dtype, head_dim: int) -> bool:
    """Whether cuDNN's flash attention takes this dtype and head dim on this backend."""
    half = jnp.dtype(dtype) in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))
    return jax.default_backend() == "gpu" and half and head_dim % 8 == 0 and head_dim <= 128


def uses_fused(implementation: str, dtype, head_dim: int) -> bool:
    """Whether full-sequence passes run the fused kernel (and so want one key set a row)."""
    return implementation == "fused" or (
        implementation == "auto" and fused_kernel_available(dtype, head_dim)
    )


def describe(implementation: str, dtype, head_dim: int, block: int) -> str:
    """What `implementation` runs on this backend, in words (printed at start-up)."""
    portable = f"dense up to {block} queries, blockwise above"
    if not uses_fused(implementation, dtype, head_dim):
        return {"dense": "dense", "blockwise": "blockwise"}.get(implementation, portable)
    kernel = "cuDNN" if fused_kernel_available(dtype, head_dim) else "XLA's"
    return f"fused ({kernel} dot_product_attention) for full sequences; decode {portable}"


def attention(
    q: Float[Array, "B N T H"], sets: list[Keys], implementation: str = "auto", block: int = 512
) -> Float[Array, "B N T H"]:
    """Softmax attention of q over the union of `sets` (in that order).

    `auto` is `fused` where `uses_fused` says so and the call fits the kernel (one causal
    set, queries = keys), else `dense` up to `block` queries and `blockwise` above: a long
    prefill or the update's scoring pass never holds a [T, S] score matrix. A one-query
    decode step is dense under either (its [1, S] scores are the keys' size; a query block
    would pad it `block`-fold).
    """
    b, n, t, h = q.shape
    if uses_fused(implementation, q.dtype, h) and _fits_kernel(q, sets):
        return _fused(q, sets[0])
    qg = q.reshape(b, sets[0].k.shape[1], n // sets[0].k.shape[1], t, h)
    if implementation == "dense" or t == 1 or (implementation == "auto" and t <= block):
        out = _dense(qg, sets)
    else:
        out = _blockwise(qg, tuple(sets), block)
    return out.reshape(b, n, t, h).astype(q.dtype)


def _fits_kernel(q, sets) -> bool:
    """One causal key set of the query rows whose slots are the queries' own (T = S: a
    call that fills its whole cache writes at slot 0, so query t is slot t)."""
    (keys,) = sets if len(sets) == 1 else (None,)
    if keys is None or keys.q_slot is None:
        return False
    return keys.k.shape[0] == q.shape[0] and keys.k.shape[2] == q.shape[2] > 1


def _fused(q: Float[Array, "B N T H"], keys: Keys) -> Float[Array, "B N T H"]:
    """`jax.nn.dot_product_attention` (cuDNN where it takes the dtype, else XLA's) over
    each row's real tokens, gathered to the front in their order: causal among real tokens
    is then causal in the gathered order, and the rest is right padding (lengths)."""
    kernel = "cudnn" if fused_kernel_available(q.dtype, q.shape[-1]) else "xla"
    order = jnp.argsort(~keys.valid, axis=1, stable=True)  # [B, T]: real slots first
    lengths = jnp.sum(keys.valid, axis=1, dtype=jnp.int32)

    def gather(x: Array, index) -> Array:  # [B, X, T, H] -> [B, T, X, H], rows reordered
        return jnp.take_along_axis(jnp.swapaxes(x, 1, 2), index[:, :, None, None], axis=1)

    out = jax.nn.dot_product_attention(
        gather(q, order),
        gather(keys.k.astype(q.dtype), order),
        gather(keys.v.astype(q.dtype), order),
        is_causal=True,
        query_seq_lengths=lengths,
        key_value_seq_lengths=lengths,
        implementation=kernel,
    )
    back = jnp.argsort(order, axis=1)
    return jnp.swapaxes(jnp.take_along_axis(out, back[:, :, None, None], axis=1), 1, 2)


def _by_key_row(x: Array, rows: int) -> Array:
    """[B, K, ...] -> [R, K, X, ...]: query rows by the key-set row they read, the batch
    dimensions of every product leading (XLA's CPU dot takes bfloat16 -> float32 only so)."""
    return jnp.moveaxis(x.reshape(rows, x.shape[0] // rows, *x.shape[1:]), 1, 2)


def _by_query_row(x: Array) -> Array:
    """[R, K, X, ...] -> [B, K, ...]."""
    return jnp.moveaxis(x, 2, 1).reshape(x.shape[0] * x.shape[2], x.shape[1], *x.shape[3:])


def _tile_mask(valid, q_slot, first_slot, b: int) -> Bool[Array, "R 1 X 1 T S"]:
    """Which (query, key) pairs of a tile attend: key slots first_slot.. of `valid` [R, S]
    and, when causal, the queries' slots `q_slot` [B or 1, T]."""
    r, s = valid.shape
    mask = valid[:, None, None, None, None, :]
    if q_slot is None:
        return mask
    causal = first_slot + jnp.arange(s) <= q_slot[..., None]  # [B or 1, T, S]
    if causal.shape[0] == b:
        return mask & causal.reshape(r, 1, b // r, 1, *causal.shape[1:])
    return mask & causal[None, None, :, None]


def _scores(qr, k, valid, q_slot, first_slot, scale):
    """Masked float32 scores [R, K, X, G, T, S] of queries qr [R, K, X, G, T, H]."""
    s = jnp.einsum("rkxgth,rksh->rkxgts", qr, k, preferred_element_type=jnp.float32)
    mask = _tile_mask(valid, q_slot, first_slot, qr.shape[0] * qr.shape[2])
    return jnp.where(mask, s * scale, MASKED)


def _values(p, v):
    """sum_s p_s v_s in float32: [R, K, X, G, T, H]."""
    return jnp.einsum(
        "rkxgts,rksh->rkxgth", p.astype(v.dtype), v, preferred_element_type=jnp.float32
    )


def _dense(qg: Float[Array, "B K G T H"], sets) -> Float[Array, "B K G T H"]:
    scale = 1.0 / math.sqrt(qg.shape[-1])
    partials = []
    for keys in sets:
        qr = _by_key_row(qg, keys.k.shape[0])
        s = _scores(qr, keys.k, keys.valid, keys.q_slot, 0, scale)
        m = jnp.max(s, axis=-1, keepdims=True)
        p = jnp.exp(s - m)
        total = jnp.sum(p, axis=-1, keepdims=True)
        partials.append(tuple(_by_query_row(x) for x in (_values(p, keys.v), m, total)))
    # Combine partial softmaxes over disjoint key sets exactly (log-sum-exp).
    top = functools.reduce(jnp.maximum, [m for _, m, _ in partials])
    scales = [jnp.exp(m - top) for _, m, _ in partials]
    acc = sum(a * c for (a, _, _), c in zip(partials, scales))
    return acc / sum(t * c for (_, _, t), c in zip(partials, scales))


# ----------------------------------------------------------------------------- blockwise


def _pad_axis(x: Array, axis: int, size: int) -> Array:
    pad = [(0, 0)] * x.ndim
    pad[axis] = (0, size - x.shape[axis])
    return jnp.pad(x, pad)


def _padded_sets(sets, block: int):
    """Each set's slots padded to whole blocks (padding slots are not valid)."""
    out = []
    for keys in sets:
        s = -(-keys.k.shape[2] // block) * block
        out.append(
            Keys(
                _pad_axis(keys.k, 2, s),
                _pad_axis(keys.v, 2, s),
                _pad_axis(keys.valid, 1, s),
                keys.q_slot,
            )
        )
    return out


class _Tile(NamedTuple):
    """Key block j of a set, for one query block: its keys, values and masked scores
    [R, K, X, G, bq, bk]."""

    k: Array
    v: Array
    s: Array


def _needed(keys: Keys, q_slot_b, j, block: int) -> Array:
    """Whether some (query, key) pair of tile j attends: a tile wholly padding, or wholly
    above the causal diagonal, is skipped in the forward and the backward alike."""
    needed = jnp.any(jax.lax.dynamic_slice_in_dim(keys.valid, j * block, block, axis=1))
    if q_slot_b is not None:
        needed &= j * block <= jnp.max(q_slot_b)
    return needed


def _tile(qr, keys: Keys, q_slot_b, j, block: int, scale) -> _Tile:
    k = jax.lax.dynamic_slice_in_dim(keys.k, j * block, block, axis=2)
    v = jax.lax.dynamic_slice_in_dim(keys.v, j * block, block, axis=2)
    valid = jax.lax.dynamic_slice_in_dim(keys.valid, j * block, block, axis=1)
    return _Tile(k, v, _scores(qr, k, valid, q_slot_b, j * block, scale))


def _query_block(x, i, block: int, axis: int):
    return None if x is None else jax.lax.dynamic_slice_in_dim(x, i * block, block, axis=axis)


def _forward_block(q, sets, i, block: int):
    """Output and log-sum-exp of query block i: (out [B, K, G, bq, H], lse [B, K, G, bq])."""
    scale = 1.0 / math.sqrt(q.shape[-1])
    qb = _query_block(q, i, block, 3)
    acc = jnp.zeros(qb.shape, jnp.float32)
    m = jnp.full(qb.shape[:-1], MASKED, jnp.float32)
    total = jnp.zeros(qb.shape[:-1], jnp.float32)
    for keys in sets:
        r = keys.k.shape[0]
        qr, q_slot_b = _by_key_row(qb, r), _query_block(keys.q_slot, i, block, 1)

        def fold(carry, j, keys=keys, qr=qr, q_slot_b=q_slot_b):
            def update(c):
                acc, m, total = c
                tile = _tile(qr, keys, q_slot_b, j, block, scale)
                m_new = jnp.maximum(m, jnp.max(tile.s, axis=-1))
                correction = jnp.exp(m - m_new)
                p = jnp.exp(tile.s - m_new[..., None])
                total = total * correction + jnp.sum(p, axis=-1)
                return acc * correction[..., None] + _values(p, tile.v), m_new, total

            needed = _needed(keys, q_slot_b, j, block)
            return jax.lax.cond(needed, update, lambda c: c, carry), None

        carry = tuple(_by_key_row(x, r) for x in (acc, m, total))
        carry, _ = jax.lax.scan(fold, carry, jnp.arange(keys.k.shape[2] // block))
        acc, m, total = (_by_query_row(x) for x in carry)
    # A query with no valid key anywhere (a pad position) gets a finite output, not 0 / 0;
    # nothing reads it.
    safe = jnp.where(total > 0, total, 1.0)
    return acc / safe[..., None], m + jnp.log(safe)


def _backward_block(q, sets, out, lse, dout, i, grads, block: int):
    """Add query block i's share to the keys' and values' gradients; its query gradient."""
    scale = 1.0 / math.sqrt(q.shape[-1])
    qb = _query_block(q, i, block, 3)
    do = _query_block(dout, i, block, 3).astype(jnp.float32)
    lse_b = _query_block(lse, i, block, 3)
    delta = jnp.sum(do * _query_block(out, i, block, 3), axis=-1)  # [B, K, G, bq]
    dq = jnp.zeros(qb.shape, jnp.float32)
    new_grads = []
    for keys, (dk, dv) in zip(sets, grads):
        r = keys.k.shape[0]
        qr, q_slot_b = _by_key_row(qb, r), _query_block(keys.q_slot, i, block, 1)
        do_r, lse_r, delta_r = (_by_key_row(x, r) for x in (do, lse_b, delta))

        def fold(carry, j, keys=keys, qr=qr, q_slot_b=q_slot_b, do_r=do_r, lse_r=lse_r,
                 delta_r=delta_r):  # fmt: skip
            def update(c):
                dq, dk, dv = c
                tile = _tile(qr, keys, q_slot_b, j, block, scale)
                p = jnp.exp(tile.s - lse_r[..., None])  # [R, K, X, G, bq, bk]
                dv_j = jnp.einsum("rkxgts,rkxgth->rksh", p, do_r)
                dp = jnp.einsum(
                    "rkxgth,rksh->rkxgts", do_r, tile.v, preferred_element_type=jnp.float32
                )
                ds = p * (dp - delta_r[..., None]) * scale
                dq = dq + jnp.einsum(
                    "rkxgts,rksh->rkxgth", ds, tile.k, preferred_element_type=jnp.float32
                )
                dk_j = jnp.einsum("rkxgts,rkxgth->rksh", ds, qr, preferred_element_type=jnp.float32)
                add = lambda total, part: jax.lax.dynamic_update_slice_in_dim(  # noqa: E731
                    total,
                    jax.lax.dynamic_slice_in_dim(total, j * block, block, 2) + part,
                    j * block,
                    2,
                )
                return dq, add(dk, dk_j), add(dv, dv_j)

            needed = _needed(keys, q_slot_b, j, block)
            return jax.lax.cond(needed, update, lambda c: c, carry), None

        carry = (_by_key_row(dq, r), dk, dv)
        (dq_r, dk, dv), _ = jax.lax.scan(fold, carry, jnp.arange(keys.k.shape[2] // block))
        dq = _by_query_row(dq_r)
        new_grads.append((dk, dv))
    return dq, new_grads


def _blockwise(qg: Float[Array, "B K G T H"], sets: tuple[Keys, ...], block: int):
    t = qg.shape[3]
    qs = -(-t // block) * block
    q = _pad_axis(qg, 3, qs)
    padded = [
        k._replace(q_slot=None if k.q_slot is None else _pad_axis(k.q_slot, 1, qs)) for k in sets
    ]
    out = _flash(q, tuple(_padded_sets(padded, block)), block)
    return out[:, :, :, :t]


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _flash(q, sets, block: int):
    return _flash_forward(q, sets, block)[0]


def _flash_forward(q, sets, block: int):
    n_blocks = q.shape[3] // block
    outs, lses = jax.lax.map(lambda i: _forward_block(q, sets, i, block), jnp.arange(n_blocks))
    # [nq, B, K, G, bq, ...] -> [B, K, G, nq * bq, ...]
    out = jnp.moveaxis(outs, 0, 3).reshape(q.shape)
    lse = jnp.moveaxis(lses, 0, 3).reshape(q.shape[:-1])
    return out, lse


def _flash_fwd(q, sets, block: int):
    out, lse = _flash_forward(q, sets, block)
    return out, (q, sets, out, lse)


def _flash_bwd(block: int, residuals, dout):
    q, sets, out, lse = residuals
    grads = [(jnp.zeros(k.k.shape, jnp.float32), jnp.zeros(k.v.shape, jnp.float32)) for k in sets]

    def step(grads, i):
        dq, grads = _backward_block(q, sets, out, lse, dout, i, grads, block)
        return grads, dq

    grads, dqs = jax.lax.scan(step, grads, jnp.arange(q.shape[3] // block))
    dq = jnp.moveaxis(dqs, 0, 3).reshape(q.shape).astype(q.dtype)
    d_sets = tuple(
        Keys(dk.astype(k.k.dtype), dv.astype(k.v.dtype), None, None)
        for k, (dk, dv) in zip(sets, grads)
    )
    return dq, d_sets


_flash.defvjp(_flash_fwd, _flash_bwd)
