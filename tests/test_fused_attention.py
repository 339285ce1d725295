"""The fused attention path (`jax.nn.dot_product_attention`; its XLA implementation on a
CPU, cuDNN's on a GPU) gives what the portable blockwise path gives, forward and
gradients, for every mask the model uses: left padding with holes and trailing pads, the
update's group-shared prompts (laid out one sequence a row), response prefixes (the end
of a prompt row), ASE's steering and EDEN's appended slots (which stay portable)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import assert_float32_close, left_padded_batch, score

from explore_rl.models import attention, presets, transformer
from explore_rl.models.attention import Keys
from explore_rl.models.transformer import Interventions
from explore_rl.rl import losses
from explore_rl.rl.train_step import Batch, _loss
from explore_rl.sampling.sampler import SamplingConfig, sample

pytestmark = [pytest.mark.usefixtures("highest_precision"), pytest.mark.numerics]

Q, G, T = 3, 4, 11
PORTABLE = dict(attention="blockwise", attention_block=4)


def _valid() -> np.ndarray:
    """Rows of 13 slots: left padding, a hole, trailing pads, one full, one empty."""
    v = np.ones((5, 13), bool)
    v[0, :4] = False  # left padding
    v[1, 6] = False  # a hole in the middle
    v[2, 9:] = False  # trailing pads (a finished response)
    v[3, :2], v[3, 11:] = False, False
    v[4] = False
    return v


def _attend(q, k, v, valid, implementation):
    keys = Keys(k, v, valid, jnp.arange(q.shape[2])[None])
    return attention.attention(q, [keys], implementation, block=4)


# bfloat16: units of its own rounding (2**-8 = 2**15 float32 units): the two paths round
# the probabilities to bfloat16 at different points
@pytest.mark.parametrize("dtype, ulps", [(jnp.float32, 256), (jnp.bfloat16, 4 * 2**15)])
def test_fused_kernel_equals_blockwise_forward_and_gradients(dtype, ulps):
    """GQA (4 query heads on 2 kv heads), every padding kind: the outputs at real queries
    and the gradients of q, k, v of a loss over them."""
    valid = jnp.asarray(_valid())
    b, t = valid.shape
    ks = jax.random.split(jax.random.key(0), 4)
    q = jax.random.normal(ks[0], (b, 4, t, 8)).astype(dtype)
    k = jax.random.normal(ks[1], (b, 2, t, 8)).astype(dtype)
    v = jax.random.normal(ks[2], (b, 2, t, 8)).astype(dtype)
    weight = jax.random.normal(ks[3], (b, 4, t, 8)) * valid[:, None, :, None]

    def loss(impl):
        f = lambda q, k, v: jnp.sum(_attend(q, k, v, valid, impl).astype(jnp.float32) * weight)  # noqa: E731
        return jax.jit(jax.value_and_grad(f, argnums=(0, 1, 2)))(q, k, v)

    fused_out = np.asarray(_attend(q, k, v, valid, "fused"), np.float32)
    ref_out = np.asarray(_attend(q, k, v, valid, "blockwise"), np.float32)
    assert np.isfinite(fused_out).all()  # pad queries too: they feed later layers' pads
    real = np.asarray(valid)
    assert_float32_close(
        fused_out.transpose(0, 2, 1, 3)[real], ref_out.transpose(0, 2, 1, 3)[real], ulps=ulps
    )
    (fused_l, fused_g), (ref_l, ref_g) = loss("fused"), loss("blockwise")
    assert_float32_close(fused_l, ref_l, scale=float(jnp.sum(jnp.abs(weight))), ulps=ulps)
    for name, a, r in zip("qkv", fused_g, ref_g):
        assert_float32_close(
            np.asarray(a, np.float32), np.asarray(r, np.float32), ulps=2 * ulps, err_msg=name
        )


def test_the_fused_residual_carries_no_gradient():
    """Why key sets are not merged by the kernel's log-sum-exp: its gradient is zero in
    the pinned JAX (what the module docstring says)."""
    q, k, v = (jax.random.normal(jax.random.key(i), (1, 5, 2, 8)) for i in range(3))

    def lse_sum(q):
        _, lse = jax.nn.dot_product_attention(
            q, k, v, is_causal=True, implementation="xla", return_residual=True
        )
        return jnp.sum(lse)

    assert float(jnp.max(jnp.abs(jax.grad(lse_sum)(q)))) == 0.0


def test_auto_is_portable_on_a_cpu_and_says_so():
    assert not attention.uses_fused("auto", jnp.bfloat16, 64)  # no GPU here
    assert attention.uses_fused("fused", jnp.float32, 64)
    assert "blockwise above" in attention.describe("auto", jnp.bfloat16, 64, 512)
    assert "XLA" in attention.describe("fused", jnp.float32, 64, 512)


def _model(name="tiny-qwen2", **kw):
    cfg = presets.get_preset(name, attention="dense", **kw)
    return transformer.init_params(cfg, jax.random.key(1), scale=0.3), cfg


def _rows(seed=0):
    """Q left-padded prompts (lengths 9, 5, 2; a prompt row ends with its response prefix
    where it has one: no mask of its own) and Q x G right-padded responses."""
    rng = np.random.default_rng(seed)
    prompts, pmask = left_padded_batch(rng, [9, 5, 2], 64, 9)
    tokens = rng.integers(1, 64, (Q * G, T)).astype(np.int32)
    mask = np.arange(T)[None] < rng.integers(1, T + 1, Q * G)[:, None]
    return tuple(map(jnp.asarray, (prompts, pmask, tokens, mask)))


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen2", "tiny-qwen3"])
def test_fused_prefill_and_contiguous_scoring_equal_the_portable_path(name):
    """A left-padded forward, and the update's scoring: shared prompts (portable) against
    one prompt + response sequence a row (fused)."""
    params, cfg = _model(name)
    fused, portable = cfg.replace(attention="fused"), cfg.replace(**PORTABLE)
    prompts, pmask, tokens, mask = _rows()
    pos = transformer.positions_from_mask(pmask)
    ref = transformer.forward(params, portable, prompts, pos, pmask).logits
    out = transformer.forward(params, fused, prompts, pos, pmask).logits
    m = np.asarray(pmask)
    assert_float32_close(np.asarray(out)[m], np.asarray(ref)[m])
    r, scale = np.asarray(mask), float(np.abs(np.asarray(ref)).max())
    for a, b in zip(score(params, fused, *_rows()), score(params, portable, *_rows())):
        assert_float32_close(np.asarray(a)[r], np.asarray(b)[r], scale=scale)


def test_update_gradients_equal_under_the_fused_layout():
    """The update's loss and every weight's gradient (TIS, entropy and KL on): fused (one
    sequence a row, each prompt's gradient summed over its rows) against portable, layers
    unrolled and scanned."""
    params, cfg = _model("tiny-qwen2")
    prompts, pmask, tokens, mask = _rows(1)
    rng = np.random.default_rng(2)
    old = jnp.asarray(-rng.random((Q * G, T)) * 3, jnp.float32)
    batch = Batch(
        prompts, pmask, tokens, mask, advantages=jnp.asarray(rng.normal(size=Q * G), jnp.float32),
        behaviour_logp=old - 0.1, old_logp=old, weights=jnp.ones(Q * G), ref_logp=old + 0.05,
    )  # fmt: skip
    lc = losses.LossConfig(tis_cap=2.0, entropy_coef=0.01, kl_coef=0.1)

    def loss_and_grads(c):
        return jax.jit(jax.value_and_grad(lambda p: _loss(p, c, lc, batch, jnp.sum(mask))[0]))(
            params
        )

    ref_loss, ref_grads = loss_and_grads(cfg.replace(**PORTABLE))
    for kw in (dict(attention="fused"), dict(attention="fused", scan_layers=True, remat="block")):
        loss, grads = loss_and_grads(cfg.replace(**kw))
        assert_float32_close(loss, ref_loss, err_msg=str(kw))
        for (path, a), b in zip(
            jax.tree_util.tree_leaves_with_path(grads), jax.tree.leaves(ref_grads)
        ):
            assert_float32_close(a, b, ulps=1024, err_msg=f"{kw} {jax.tree_util.keystr(path)}")


def test_rollouts_with_slots_and_steering_equal_under_fused():
    """EDEN's appended slots (portable: they attend a cache) after a fused prefill steered
    by ASE's vectors: the portable path's tokens and mu."""
    params, cfg = _model("tiny-llama")
    prompts, pmask, *_ = _rows(3)
    b, t = Q * G, 9
    iv = Interventions(
        extra_embeds=jax.random.normal(jax.random.key(5), (b, 2, cfg.d_model)),
        extra_mask=jnp.asarray(np.random.default_rng(4).random((b, 2)) < 0.5).at[0].set(False),
        steer=jnp.repeat(jax.random.normal(jax.random.key(6), (Q, cfg.d_model)), G, axis=0),
        steer_layer=0,
    )
    temps, config = jnp.ones((b, t)), SamplingConfig(t, stop_ids=(5, 9))
    run = lambda c: sample(params, c, prompts, pmask, jax.random.key(7), temps, config, iv)  # noqa: E731
    ref, out = run(cfg.replace(**PORTABLE)), run(cfg.replace(attention="fused"))
    np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(ref.tokens))
    assert_float32_close(out.logprobs, ref.logprobs, scale=10.0)
