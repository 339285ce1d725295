"""Decoder parity with transformers (PyTorch CPU, float32), KV cache, interventions."""

import pkgutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import (
    FAMILY_VARIANTS,
    assert_float32_close,
    left_padded_batch,
    make_hf_checkpoint,
    torch_logits,
)

from explore_rl.models import families, presets, transformer, weights
from explore_rl.models.transformer import Interventions, forward, positions_from_mask

pytestmark = [pytest.mark.usefixtures("highest_precision"), pytest.mark.numerics]


@pytest.mark.parametrize("variant", sorted(FAMILY_VARIANTS))
def test_logit_parity_with_transformers(tmp_path, variant):
    model = make_hf_checkpoint(tmp_path, variant, max_shard_size="20KB")
    assert (tmp_path / "model.safetensors.index.json").exists()  # sharded load path
    params, cfg = weights.load_hf(str(tmp_path))
    assert cfg.family == FAMILY_VARIANTS[variant][0]
    tokens, mask = left_padded_batch(np.random.default_rng(1), [12, 7, 3, 12], 64, 12)
    ours = forward(
        params, cfg, jnp.asarray(tokens), positions_from_mask(jnp.asarray(mask)), jnp.asarray(mask)
    ).logits
    ref = torch_logits(model, tokens, mask)
    # another library's kernels and summation orders: more rounding than two XLA programs
    assert_float32_close(np.asarray(ours)[mask], ref[mask], ulps=1024)


def test_every_family_of_the_package_has_a_parity_variant():
    """A family module added to models/families/ fails here until FAMILY_VARIANTS has a
    tiny checkpoint of it (the family registry finds a family by its module's name)."""
    own = {m.name for m in pkgutil.iter_modules(families.__path__)}
    assert {name for name, _ in FAMILY_VARIANTS.values()} == own


def test_hf_config_reads_unlisted_size(tmp_path):
    make_hf_checkpoint(tmp_path, "qwen2")
    cfg = presets.from_hf_config(str(tmp_path))
    assert (cfg.family, cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim) == (
        "qwen2",
        32,
        4,
        2,
        8,
    )
    assert cfg.qkv_bias and not cfg.qk_norm and not cfg.tie_embeddings


def _tiny(name="tiny-llama", seed=0, **kw):
    cfg = presets.get_preset(name, **kw)
    return transformer.init_params(cfg, jax.random.key(seed), scale=0.3), cfg


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen2", "tiny-qwen3"])
def test_kv_cache_decode_matches_full_forward(name):
    params, cfg = _tiny(name)
    total, prompt = 14, 6
    tokens, mask = left_padded_batch(np.random.default_rng(0), [14, 10, 8], 64, total)
    tokens, mask = jnp.asarray(tokens), jnp.asarray(mask)
    pos = positions_from_mask(mask)
    full = forward(params, cfg, tokens, pos, mask).logits
    cache = transformer.init_cache(cfg, 3, total)
    out = forward(params, cfg, tokens[:, :prompt], pos[:, :prompt], mask[:, :prompt], cache)
    steps = [out.logits]
    step = jax.jit(forward, static_argnums=1)
    for t in range(prompt, total):
        out = step(
            params, cfg, tokens[:, t : t + 1], pos[:, t : t + 1], mask[:, t : t + 1], out.cache
        )
        steps.append(out.logits)
    decoded = jnp.concatenate(steps, axis=1)
    m = np.asarray(mask)
    assert_float32_close(np.asarray(decoded)[m], np.asarray(full)[m])


def _prefill_and_decode(params, cfg, tokens, mask, n_steps, iv=None):
    """Prefill (optionally with appended slots), then greedy-decode n_steps; all logits."""
    b, p = tokens.shape
    n_extra = 0 if iv is None or iv.extra_embeds is None else iv.extra_embeds.shape[1]
    cache = transformer.init_cache(cfg, b, p + n_steps, n_extra=n_extra)
    out = forward(params, cfg, tokens, positions_from_mask(mask), mask, cache, iv)
    nxt = out.logits[:, -1]
    if n_extra:
        has = jnp.any(iv.extra_mask, axis=1)[:, None]
        nxt = jnp.where(has, out.extra_logits[:, -1], nxt)
    pos = jnp.sum(mask, 1) + (0 if not n_extra else jnp.sum(iv.extra_mask, 1))
    logits = [nxt]
    steer_only = None if iv is None else iv.replace(extra_embeds=None, extra_mask=None)
    for t in range(n_steps):
        tok = jnp.argmax(nxt, -1)[:, None]
        out = forward(
            params, cfg, tok, (pos + t)[:, None], jnp.ones_like(tok, bool), out.cache, steer_only
        )
        nxt = out.logits[:, -1]
        logits.append(nxt)
    return np.asarray(jnp.stack(logits, 1))


def test_masked_appended_slot_is_bit_exact_clean():
    params, cfg = _tiny("tiny-qwen2")
    tokens, mask = left_padded_batch(np.random.default_rng(2), [9, 5, 9, 7], 64, 9)
    tokens, mask = jnp.asarray(tokens), jnp.asarray(mask)
    extra_mask = jnp.array([[True], [False], [False], [True]])
    embeds = jax.random.normal(jax.random.key(3), (4, 1, cfg.d_model))
    iv = Interventions(extra_embeds=embeds, extra_mask=extra_mask)
    clean = _prefill_and_decode(params, cfg, tokens, mask, 6)
    noisy = _prefill_and_decode(params, cfg, tokens, mask, 6, iv)
    # exact: a row with every slot masked takes the plain attention output unchanged
    np.testing.assert_array_equal(noisy[1], clean[1])
    np.testing.assert_array_equal(noisy[2], clean[2])
    assert np.abs(noisy[0] - clean[0]).max() > 1e-3  # the slot does something
    assert np.abs(noisy[3] - clean[3]).max() > 1e-3


def test_appended_slot_equals_an_inserted_embedding():
    """An unmasked slot acts like one more input position holding that embedding."""
    params, cfg = _tiny("tiny-llama")
    tokens, mask = left_padded_batch(np.random.default_rng(4), [6, 4], 64, 6)
    tokens, mask = jnp.asarray(tokens), jnp.asarray(mask)
    slot_token = jnp.array([[17], [33]])
    iv = Interventions(extra_embeds=params["embed"][slot_token], extra_mask=jnp.ones((2, 1), bool))
    with_slot = _prefill_and_decode(params, cfg, tokens, mask, 3, iv)
    inserted = jnp.concatenate([tokens, slot_token], 1)
    plain = _prefill_and_decode(
        params, cfg, inserted, jnp.concatenate([mask, jnp.ones((2, 1), bool)], 1), 3
    )
    assert_float32_close(with_slot, plain)


def test_steering_zero_is_clean_and_acts_only_after_its_block():
    params, cfg = _tiny("tiny-qwen3", n_layers=3)
    tokens, mask = left_padded_batch(np.random.default_rng(5), [8, 6], 64, 8)
    tokens, mask = jnp.asarray(tokens), jnp.asarray(mask)
    pos = positions_from_mask(mask)
    run = lambda iv: forward(params, cfg, tokens, pos, mask, None, iv)  # noqa: E731
    clean = run(None).logits
    zero = run(Interventions(steer=jnp.zeros((2, cfg.d_model)), steer_layer=1)).logits
    np.testing.assert_array_equal(np.asarray(zero), np.asarray(clean))  # exact: x + 0 is x
    v = jax.random.normal(jax.random.key(6), (2, cfg.d_model))
    for readout in (0, 1, 2):
        clean_r = run(Interventions(readout_layer=readout)).readout
        steer_r = run(Interventions(steer=v, steer_layer=1, readout_layer=readout)).readout
        if readout < 1:  # exact: the blocks below the steered one are the same program
            np.testing.assert_array_equal(np.asarray(steer_r), np.asarray(clean_r))
        elif readout == 1:  # (x + v) - x: the roundings of x + v, at the block output's scale
            assert_float32_close(
                steer_r - clean_r,
                jnp.broadcast_to(v[:, None], clean_r.shape),
                scale=float(jnp.abs(steer_r).max()),
                ulps=8,
            )
        else:
            assert np.abs(np.asarray(steer_r - clean_r)).max() > 1e-2
    steered = run(Interventions(steer=v, steer_layer=1)).logits
    assert np.abs(np.asarray(steered - clean)).max() > 1e-3


def test_bfloat16_runs_and_logits_are_float32():
    params, cfg = _tiny("tiny-llama", param_dtype="bfloat16", dtype="bfloat16")
    assert params["layers"][0]["q"].dtype == jnp.bfloat16
    tokens, mask = left_padded_batch(np.random.default_rng(7), [5, 3], 64, 5)
    f32_params, f32 = _tiny("tiny-llama")
    out = forward(
        params, cfg, jnp.asarray(tokens), positions_from_mask(jnp.asarray(mask)), jnp.asarray(mask)
    )
    ref = forward(
        f32_params,
        f32,
        jnp.asarray(tokens),
        positions_from_mask(jnp.asarray(mask)),
        jnp.asarray(mask),
    )
    assert out.logits.dtype == jnp.float32
    # bfloat16 keeps 8 bits: a few of its roundings (2^-8) of the logits' scale, whichever
    # kernels (some CPUs have bfloat16 dot products) run them
    err = np.abs(np.asarray(out.logits - ref.logits))[mask].max()
    assert err < 8 * 2.0**-8 * np.abs(np.asarray(ref.logits))[mask].max(), err


def test_num_params_matches_tree():
    for name in ("tiny-llama", "tiny-qwen2", "tiny-qwen3"):
        params, cfg = _tiny(name)
        assert cfg.num_params() == sum(x.size for x in jax.tree.leaves(params))
