"""On a (data 2, fsdp 2, tensor 2) mesh of 8 fake CPU devices, a sampling call and two
train steps give what one device gives: the same tokens, params within 1e-5."""

import os
import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent("""
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import PartitionSpec as P
    jax.config.update("jax_default_matmul_precision", "highest")
    from explore_rl import caching
    caching.enable_compilation_cache()
    from explore_rl import parallel
    from explore_rl.models import presets, transformer
    from explore_rl.rl import footprint, losses
    from explore_rl.rl.train_step import Batch, OptimConfig, init_state, make_optimizer
    from explore_rl.rl.train_step import score, train_step
    from explore_rl.sampling.sampler import SamplingConfig, sample
    assert jax.device_count() == 8
    cfg = presets.get_preset("tiny-qwen2")
    params = transformer.init_params(cfg, jax.random.key(0), scale=0.3)
    q, g, t = 4, 4, 6
    prompts = jax.random.randint(jax.random.key(1), (q, 5), 1, 64)
    pmask = jnp.ones((q, 5), bool).at[1, :2].set(False)
    temps = jnp.ones((q * g, t))

    def run(params, prompts, pmask):
        r = sample(params, cfg, prompts, pmask, jax.random.key(2), temps, SamplingConfig(t))
        old, _ = score(params, cfg, prompts, pmask, r.tokens, r.mask)
        adv = jax.random.normal(jax.random.key(3), (q * g,))
        batch = Batch(prompts, pmask, r.tokens, r.mask, adv, r.logprobs, old, jnp.ones(q * g))
        batch = parallel.shard_batch(batch, mesh)
        oc, lc = OptimConfig(lr=1e-3, micro_batches=2), losses.LossConfig()
        opt = make_optimizer(oc)
        state = parallel.create(init_state, mesh, jax.tree.map(jnp.copy, params), opt)
        state, m = train_step(state, batch, cfg, lc, oc, opt)
        state, _ = train_step(state, batch, cfg, lc, oc, opt)
        return r, batch, state, m

    mesh = parallel.make_mesh(devices=jax.devices()[:1])
    r1, _, single, m1 = run(params, prompts, pmask)
    mesh = parallel.make_mesh(data=2, fsdp=2, tensor=2)
    with parallel.use(mesh):
        placed = parallel.place(params, mesh)
        specs = {n: placed["layers"][0][n].sharding.spec for n in ("q", "k", "o", "down")}
        assert specs == {"q": P("fsdp", "tensor", None), "k": P("fsdp", "tensor", None),
                         "o": P("tensor", None, "fsdp"), "down": P("tensor", "fsdp")}, specs
        assert placed["lm_head"].sharding.spec == P("fsdp", "tensor")
        assert placed["layers"][0]["attn_norm"].sharding.spec == P()
        # the memory estimate's shard sizes are the placed arrays' own
        held = sum(x.addressable_shards[0].data.nbytes for x in jax.tree.leaves(placed))
        assert footprint.per_device_bytes(jax.eval_shape(lambda: params), mesh) == held
        r2, batch, sharded, m2 = run(placed, *parallel.shard_batch((prompts, pmask), mesh))
    assert batch.tokens.sharding.spec == P(("data", "fsdp"), None)
    np.testing.assert_array_equal(np.asarray(r1.tokens), np.asarray(r2.tokens))
    np.testing.assert_array_equal(np.asarray(r1.mask), np.asarray(r2.mask))
    np.testing.assert_allclose(np.asarray(r1.logprobs), np.asarray(r2.logprobs), atol=1e-5)
    # the update's new state is where the rules put it, moments included
    assert sharded.params["layers"][1]["up"].sharding.spec == P("fsdp", "tensor")
    mu = sharded.opt_state[1][0].mu["layers"][1]["up"]
    assert mu.sharding.spec == P("fsdp", "tensor"), mu.sharding
    worst = max(float(np.max(np.abs(np.asarray(a) - np.asarray(b)))) for a, b in
                zip(jax.tree.leaves(single.params), jax.tree.leaves(sharded.params)))
    assert worst < 1e-5, worst
    assert abs(float(m1["train/loss"]) - float(m2["train/loss"])) < 1e-5
    print("ok", worst)
""")


def test_data_fsdp_tensor_mesh_equals_one_device():
    env = dict(
        os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8", JAX_PLATFORMS="cpu"
    )
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=600
    )
    assert out.returncode == 0 and out.stdout.startswith("ok"), out.stderr[-3000:]
