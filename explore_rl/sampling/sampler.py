"""Prefill + KV-cache decode in one jitted `lax.while_loop`.

Prompts are left-padded to a static length P; the cache holds P + T_new slots and every
row writes slot P + t at step t, so shapes never change. Positions come from the prompt
mask, so left padding costs no position. A row stops at its first stop id (the stop token
is part of the response and its mask); decoding ends when every row stopped or after
`max_new_tokens`.

    gen = greedy(params, cfg, tokens, mask, max_new_tokens=32, stop_ids=tok.stop_ids)
    texts = [tok.decode(t[m]) for t, m in zip(gen.tokens, gen.mask)]
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from flax import struct
from jaxtyping import Array, Bool, Int

from explore_rl.models import transformer
from explore_rl.models.presets import ModelConfig


@struct.dataclass
class Generation:
    tokens: Int[Array, "B T"]
    mask: Bool[Array, "B T"]  # real response tokens, the stop token included
    finished: Bool[Array, " B"]  # stopped on a stop id (False: ran out of length)


@struct.dataclass
class _DecodeState:
    step: Int[Array, ""]
    cache: transformer.KVCache
    last: Int[Array, " B"]
    position: Int[Array, " B"]
    done: Bool[Array, " B"]
    tokens: Int[Array, "B T"]
    mask: Bool[Array, "B T"]


def _record(state: _DecodeState, token, stop_ids) -> _DecodeState:
    live = ~state.done
    token = jnp.where(live, token, 0)
    stopped = jnp.isin(token, jnp.asarray(stop_ids, jnp.int32)) & live
    return state.replace(
        last=token,
        tokens=state.tokens.at[:, state.step].set(token),
        mask=state.mask.at[:, state.step].set(live),
        done=state.done | stopped,
    )


@functools.partial(jax.jit, static_argnames=("cfg", "max_new_tokens", "stop_ids"))
def greedy(
    params: dict,
    cfg: ModelConfig,
    tokens: Int[Array, "B P"],
    mask: Bool[Array, "B P"],
    max_new_tokens: int,
    stop_ids: tuple[int, ...],
) -> Generation:
    """Greedy continuation of left-padded prompts."""
    b, p = tokens.shape
    mask = mask.astype(bool)
    cache = transformer.init_cache(cfg, b, p + max_new_tokens)
    positions = transformer.positions_from_mask(mask)
    out = transformer.hidden_states(params, cfg, tokens, positions, mask, cache)
    first = jnp.argmax(transformer.lm_logits(params, cfg, out.hidden[:, -1]), axis=-1)
    state = _DecodeState(
        step=jnp.zeros((), jnp.int32),
        cache=out.cache,
        last=first,
        position=jnp.sum(mask, axis=1).astype(jnp.int32),
        done=jnp.zeros((b,), bool),
        tokens=jnp.zeros((b, max_new_tokens), jnp.int32),
        mask=jnp.zeros((b, max_new_tokens), bool),
    )
    state = _record(state, first, stop_ids)

    def cond(s: _DecodeState):
        return (s.step + 1 < max_new_tokens) & ~jnp.all(s.done)

    def body(s: _DecodeState):
        live = s.mask[:, s.step]
        o = transformer.hidden_states(
            params, cfg, s.last[:, None], s.position[:, None], live[:, None], s.cache
        )
        nxt = jnp.argmax(transformer.lm_logits(params, cfg, o.hidden[:, 0]), axis=-1)
        s = s.replace(step=s.step + 1, cache=o.cache, position=s.position + 1)
        return _record(s, nxt, stop_ids)

    state = jax.lax.while_loop(cond, body, state)
    return Generation(tokens=state.tokens, mask=state.mask, finished=state.done)


def left_pad(rows: list[list[int]], pad_id: int, length: int | None = None):
    """Token lists -> (tokens [B, P], mask [B, P]) left-padded to `length` (default: longest)."""
    longest = max(map(len, rows))
    length = length or longest
    if longest > length:
        raise ValueError(f"a prompt has {longest} tokens, more than the limit {length}")
    tokens = [[pad_id] * (length - len(r)) + list(r) for r in rows]
    mask = [[False] * (length - len(r)) + [True] * len(r) for r in rows]
    return jnp.asarray(tokens, jnp.int32), jnp.asarray(mask, bool)
