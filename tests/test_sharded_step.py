"""One train step on a (data=2, fsdp=2) mesh of 4 fake CPU devices == on one device."""

import os
import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent("""
    import jax, jax.numpy as jnp, numpy as np
    jax.config.update("jax_default_matmul_precision", "highest")
    from explore_rl import caching
    caching.enable_compilation_cache()
    from explore_rl import parallel
    from explore_rl.models import presets, transformer
    from explore_rl.rl import losses
    from explore_rl.rl.train_step import Batch, OptimConfig, init_state, make_optimizer
    from explore_rl.rl.train_step import score, train_step
    from explore_rl.sampling.sampler import SamplingConfig, sample
    assert jax.device_count() == 4
    cfg = presets.get_preset("tiny-qwen2")
    params = transformer.init_params(cfg, jax.random.key(0), scale=0.3)
    q, g, t = 4, 4, 6
    prompts = jax.random.randint(jax.random.key(1), (q, 5), 1, 64)
    pmask = jnp.ones((q, 5), bool).at[1, :2].set(False)
    r = sample(params, cfg, prompts, pmask, jax.random.key(2), jnp.ones((q * g, t)),
               SamplingConfig(t))
    old, _ = score(params, cfg, prompts, pmask, r.tokens, r.mask)
    adv = jax.random.normal(jax.random.key(3), (q * g,))
    batch = Batch(prompts, pmask, r.tokens, r.mask, adv, r.logprobs, old, jnp.ones(q * g))
    oc, lc = OptimConfig(lr=1e-3, micro_batches=2), losses.LossConfig()
    opt = make_optimizer(oc)
    copy = lambda tree: jax.tree.map(jnp.copy, tree)
    single, m1 = train_step(init_state(copy(params), opt), batch, cfg, lc, oc, opt)
    single, _ = train_step(single, batch, cfg, lc, oc, opt)
    mesh = parallel.make_mesh(data=2, fsdp=2)
    state = init_state(copy(params), opt)
    state = jax.device_put(state, parallel.param_shardings(state, mesh))
    q_spec = state.params["layers"][0]["q"].sharding.spec
    assert q_spec == jax.sharding.PartitionSpec("fsdp", None, None), q_spec
    sharded_batch = parallel.shard_batch(batch, mesh)
    assert len(sharded_batch.tokens.sharding.device_set) == 4
    sharded, m2 = train_step(state, sharded_batch, cfg, lc, oc, opt)
    sharded, _ = train_step(sharded, sharded_batch, cfg, lc, oc, opt)
    worst = max(float(jnp.max(jnp.abs(a - b))) for a, b in
                zip(jax.tree.leaves(single.params), jax.tree.leaves(sharded.params)))
    assert worst < 1e-5, worst
    assert abs(float(m1["train/loss"]) - float(m2["train/loss"])) < 1e-5
    print("ok", worst)
""")


def test_sharded_step_equals_single_device():
    env = dict(
        os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4", JAX_PLATFORMS="cpu"
    )
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=600
    )
    assert out.returncode == 0 and out.stdout.startswith("ok"), out.stderr[-3000:]
