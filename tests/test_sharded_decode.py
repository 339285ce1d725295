"""On a (data 2, fsdp 2) mesh of 4 fake CPU devices, the one pass's windowed decode keeps
the rollout on its rows' devices between segments (only `done`, which the host reads to
stop, is gathered), hands the host the whole rollout at the end, and samples one device's
tokens, with mu and the readout to float32 rounding (`helpers.assert_float32_close`)."""

import textwrap

import pytest
from helpers import run_on_devices

# sharded against one device: other partial sums, other summation orders
pytestmark = [pytest.mark.slow, pytest.mark.numerics]  # a process of 4 CPU devices

SCRIPT = textwrap.dedent("""
    import jax, jax.numpy as jnp, numpy as np
    jax.config.update("jax_default_matmul_precision", "highest")
    from explore_rl import caching
    caching.enable_compilation_cache(write=False)  # as test_sharded_step: never write
    from explore_rl import parallel
    from explore_rl.models import family, presets, transformer
    from explore_rl.models.transformer import Interventions
    from explore_rl.sampling import sampler
    from explore_rl.sampling.sampler import SamplingConfig
    from helpers import assert_float32_close, logit_scale
    assert jax.device_count() == 4
    cfg = presets.get_preset("tiny-qwen2")
    params = transformer.init_params(cfg, jax.random.key(0), scale=0.4)
    q, g, t, window = 4, 4, 12, 4  # segments of windows 4, 8, 12
    prompts = jax.random.randint(jax.random.key(1), (q, 5), 1, 64)
    pmask = jnp.ones((q, 5), bool).at[1, :2].set(False)
    tau, sc, iv = jnp.ones((q * g, t)), SamplingConfig(t), Interventions(readout_layer=1)
    def run(p, x, m):
        return sampler.sample(p, cfg, x, m, jax.random.key(2), tau, sc, iv, window=window)
    one = run(params, prompts, pmask)
    mesh = parallel.make_mesh(data=2, fsdp=2)
    with parallel.use(mesh):
        placed = parallel.place(params, mesh, family.axes)
        x, m = parallel.shard_batch((prompts, pmask), mesh)
        state, u = sampler.start(placed, cfg, x, m, jax.random.key(2), tau, sc, iv, None)
        state = sampler.decode_segment(placed, cfg, state, tau, u, sc, iv, window)
        assert int(state.step) == window and not bool(np.all(np.asarray(state.done)))
        assert state.done.sharding.is_fully_replicated  # the host's stop test
        for name in ("tokens", "mask", "logprobs", "readout"):  # no gather per segment
            x_ = getattr(state.out, name)
            assert tuple(x_.sharding.spec)[:1] == (("data", "fsdp"),), (name, x_.sharding)
        sharded = run(placed, x, m)
    for leaf in jax.tree.leaves(sharded):  # whole on every device: any host reads it
        assert leaf.sharding.is_fully_replicated, leaf.sharding
    np.testing.assert_array_equal(np.asarray(sharded.tokens), np.asarray(one.tokens))
    np.testing.assert_array_equal(np.asarray(sharded.mask), np.asarray(one.mask))
    np.testing.assert_array_equal(np.asarray(sharded.finished), np.asarray(one.finished))
    src = jnp.repeat(jnp.arange(q), g)
    z = logit_scale(params, cfg, prompts[src], pmask[src], one.tokens, one.mask)
    assert_float32_close(sharded.logprobs, one.logprobs, scale=z)
    assert_float32_close(sharded.readout, one.readout)
    print("ok")
""")


def test_windowed_decode_gathers_the_rollout_once():
    run_on_devices(SCRIPT, 4)
