"""On a (data 2, fsdp 2, tensor 2) mesh of 8 fake CPU devices, a sampling call and two
train steps give what one device gives, with the layers unrolled and scanned: the same
tokens, mu and params to float32 rounding (`helpers.assert_float32_close`)."""

import textwrap

import pytest
from helpers import run_on_devices

# sharded against one device: other partial sums, other summation orders
pytestmark = [pytest.mark.slow, pytest.mark.numerics]  # a process of 8 CPU devices

SCRIPT = textwrap.dedent("""
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import PartitionSpec as P
    jax.config.update("jax_default_matmul_precision", "highest")
    from explore_rl import caching
    # read, as the suite's own processes do, never write: an 8-device program with
    # collectives read back from the cache deadlocked its all-reduce in a later run
    caching.enable_compilation_cache(write=False)
    from explore_rl import parallel
    from explore_rl.models import family, presets, transformer
    from explore_rl.rl import footprint
    from helpers import assert_float32_close, logit_scale, sampled_updates
    assert jax.device_count() == 8
    cfg = presets.get_preset("tiny-qwen2")
    params = transformer.init_params(cfg, jax.random.key(0), scale=0.3)
    q, g, t = 4, 4, 6
    prompts = jax.random.randint(jax.random.key(1), (q, 5), 1, 64)
    pmask = jnp.ones((q, 5), bool).at[1, :2].set(False)
    mesh = parallel.make_mesh(devices=jax.devices()[:1])
    r1, _, single, m1 = sampled_updates(params, cfg, mesh, prompts, pmask, g, t)
    src = jnp.repeat(jnp.arange(q), g)
    z = logit_scale(params, cfg, prompts[src], pmask[src], r1.tokens, r1.mask)  # mu's logits
    mesh = parallel.make_mesh(data=2, fsdp=2, tensor=2)
    with parallel.use(mesh):
        placed = parallel.place(params, mesh, family.axes)
        specs = {n: placed["layers"][0][n].sharding.spec for n in ("q", "k", "o", "down")}
        assert specs == {"q": P("fsdp", "tensor", None), "k": P("fsdp", "tensor", None),
                         "o": P("tensor", None, "fsdp"), "down": P("tensor", "fsdp")}, specs
        assert placed["lm_head"].sharding.spec == P("fsdp", "tensor")
        assert placed["layers"][0]["attn_norm"].sharding.spec == P()
        # the memory estimate's shard sizes are the placed arrays' own
        held = sum(x.addressable_shards[0].data.nbytes for x in jax.tree.leaves(placed))
        shapes = jax.eval_shape(lambda: params)
        assert footprint.per_device_bytes(shapes, dict(mesh.shape)) == held
        placed_prompts = parallel.shard_batch((prompts, pmask), mesh)
        r2, batch, sharded, m2 = sampled_updates(placed, cfg, mesh, *placed_prompts, g, t)
        cfg = cfg.replace(scan_layers=True)  # the stacked weights sharded as the layers'
        r3, _, scanned, _ = sampled_updates(placed, cfg, mesh, *placed_prompts, g, t)
    assert batch.tokens.sharding.spec == P(("data", "fsdp"), None)
    np.testing.assert_array_equal(np.asarray(r1.tokens), np.asarray(r2.tokens))
    np.testing.assert_array_equal(np.asarray(r1.mask), np.asarray(r2.mask))
    assert_float32_close(r2.logprobs, r1.logprobs, scale=z)
    # the update's new state is where the rules put it, moments included
    assert sharded.params["layers"][1]["up"].sharding.spec == P("fsdp", "tensor")
    mu = sharded.opt_state[1][0].mu["layers"][1]["up"]
    assert mu.sharding.spec == P("fsdp", "tensor"), mu.sharding
    # Adam moves each weight by ~lr a step: the moves compared, at lr's scale (the weights'
    # own would hide them). Adam divides each gradient entry by its own size, so an entry
    # far below its leaf's largest passes its rounding on amplified: ~0.2% of lr in two
    # steps (test_train_step's one step: 0.1%)
    for a, b, c, w in zip(jax.tree.leaves(sharded.params), jax.tree.leaves(single.params),
                          jax.tree.leaves(scanned.params), jax.tree.leaves(params)):  # fmt: skip
        w = np.asarray(w, np.float64)
        assert_float32_close(np.asarray(a) - w, np.asarray(b) - w, scale=1e-3, ulps=16384)
        assert_float32_close(np.asarray(c) - w, np.asarray(b) - w, scale=1e-3, ulps=16384)
    np.testing.assert_array_equal(np.asarray(r3.tokens), np.asarray(r1.tokens))
    # the loss: a mean of A x ratio, ratio = exp(logp - old) of log-probs rounded at z
    adv = jax.random.normal(jax.random.key(3), (q * g,))
    scale = float(jnp.abs(adv).max()) * z
    assert_float32_close(m2["train/loss"], m1["train/loss"], scale=scale)
    print("ok")
""")


def test_data_fsdp_tensor_mesh_equals_one_device():
    run_on_devices(SCRIPT, 8)
