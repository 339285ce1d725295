"""A decode step reads a row's response slots only up to the last one written (tiles of
`attention.DECODE_TILE`), with the softmax of every slot at once, and never touches the
cache's unfilled tail."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import assert_float32_close, left_padded_batch

from explore_rl.models import attention, presets, transformer
from explore_rl.models.attention import Keys
from explore_rl.sampling import engine
from explore_rl.sampling.engine import EngineConfig
from explore_rl.sampling.sampler import SamplingConfig, sample

pytestmark = [pytest.mark.usefixtures("highest_precision"), pytest.mark.numerics]


def _reference(q, sets):
    """Softmax over the union of the sets' attended slots, row by row, in float64."""
    q = np.asarray(q, np.float64)  # [B, N, 1, H]
    b, n, _, h = q.shape
    out = np.zeros_like(q)
    for r in range(b):
        ks, vs = [], []
        for keys in sets:
            x = b // keys.k.shape[0]
            see = np.asarray(keys.valid[r // x])
            if keys.q_slot is not None:
                qs = np.asarray(keys.q_slot)[r if keys.q_slot.shape[0] == b else 0, 0]
                see = see & (np.arange(see.size) <= qs)
            ks.append(np.asarray(keys.k[r // x], np.float64)[:, see])
            vs.append(np.asarray(keys.v[r // x], np.float64)[:, see])
        k, v = np.concatenate(ks, axis=1), np.concatenate(vs, axis=1)  # [K, S, H]
        for head in range(n):
            kh = head // (n // k.shape[0])
            s = k[kh] @ q[r, head, 0] / np.sqrt(h)
            p = np.exp(s - s.max())
            out[r, head, 0] = p @ v[kh] / p.sum()
    return out


def test_a_decode_step_reads_only_the_filled_tiles_and_equals_the_softmax():
    """Rows at different steps (the slot engine's per-row slots: the first tile, a middle
    one, the last, partial tile), a shared prompt beside them; the slots past the last
    tile any row reaches hold NaN, which a read would spread."""
    tile = attention.DECODE_TILE
    b, s, p = 4, 3 * tile - 100, 7
    ks = jax.random.split(jax.random.key(0), 6)
    k = jax.random.normal(ks[0], (b, 2, s, 8))
    v = jax.random.normal(ks[1], (b, 2, s, 8))
    q = jax.random.normal(ks[2], (b, 4, 1, 8))
    q_slot = jnp.asarray([[3], [tile + 5], [tile + 40], [2 * tile - 1]])
    valid = jnp.arange(s)[None] <= q_slot
    prompt = Keys(
        jax.random.normal(ks[3], (2, 2, p, 8)),
        jax.random.normal(ks[4], (2, 2, p, 8)),
        jnp.arange(p)[None] >= jnp.asarray([[0], [3]]),  # left padding
    )
    own = Keys(k, v, valid, q_slot)
    expected = _reference(q, [own, prompt])
    unread = jnp.arange(s)[None, None, :, None] >= 2 * tile
    poisoned = own._replace(k=jnp.where(unread, jnp.nan, k), v=jnp.where(unread, jnp.nan, v))
    out = jax.jit(attention.attention)(q, [poisoned, prompt])
    assert np.isfinite(np.asarray(out)).all()
    assert_float32_close(out, expected)
    # one step index for all rows (the one-pass decode) reaching into the partial tile
    last = own._replace(q_slot=jnp.asarray([[s - 1]]), valid=jnp.ones((b, s), bool))
    assert_float32_close(jax.jit(attention.attention)(q, [last]), _reference(q, [last]))


def test_rollouts_past_a_tile_equal_at_any_tile_size(monkeypatch):
    """The sampler and the slot engine with 9 tokens to decode, read in tiles of 4 slots
    (a partial last tile): the tokens and mu of tiles wider than the cache."""
    cfg = presets.get_preset("tiny-llama", attention="dense")
    params = transformer.init_params(cfg, jax.random.key(1), scale=0.3)
    prompts, pmask = map(jnp.asarray, left_padded_batch(np.random.default_rng(3), [9, 4], 64, 9))
    b, t = 6, 9
    temps, config = jnp.ones((b, t)), SamplingConfig(t, stop_ids=(5,))
    ref = sample(params, cfg, prompts, pmask, jax.random.key(7), temps, config)
    monkeypatch.setattr(attention, "DECODE_TILE", 4)
    tiled = cfg.replace(attention_block=cfg.attention_block + 1)  # a new trace: the new tile
    out = sample(params, tiled, prompts, pmask, jax.random.key(7), temps, config)
    np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(ref.tokens))
    assert_float32_close(out.logprobs, ref.logprobs, scale=10.0)
    slotted, _ = engine.generate(
        params, tiled, prompts, pmask, jax.random.key(7), temps, config, EngineConfig(4, 2)
    )
    np.testing.assert_array_equal(np.asarray(slotted.tokens), np.asarray(ref.tokens))
