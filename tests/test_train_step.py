"""Scoring with the shared prompt, the update's gradient, micro-batches, skips, learning."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import assert_float32_close, forward, left_padded_batch, logit_scale, score

from explore_rl.models import presets, transformer
from explore_rl.rl import advantages, losses
from explore_rl.rl.train_step import (
    Batch,
    OptimConfig,
    _loss,
    init_state,
    make_optimizer,
    train_step,
)
from explore_rl.sampling.sampler import SamplingConfig, sample

pytestmark = [pytest.mark.usefixtures("highest_precision"), pytest.mark.numerics]
Q, G, T = 3, 4, 6


def copy(tree):
    """train_step donates its state: give it buffers the fixtures do not share."""
    return jax.tree.map(jnp.copy, tree)


@pytest.fixture(scope="module")
def tiny():
    cfg = presets.get_preset("tiny-qwen3")
    params = transformer.init_params(cfg, jax.random.key(0), scale=0.3)
    prompts, pmask = left_padded_batch(np.random.default_rng(0), [6, 3, 5], 64, 6)
    prompts, pmask = jnp.asarray(prompts), jnp.asarray(pmask)
    r = sample(
        params,
        cfg,
        prompts,
        pmask,
        jax.random.key(1),
        jnp.ones((Q * G, T)),
        SamplingConfig(T, stop_ids=(7,)),
    )
    return params, cfg, prompts, pmask, r


def _logit_scale(tiny, r, temperature=1.0):
    params, cfg, prompts, pmask, _ = tiny
    src = np.arange(Q * G) // G
    return logit_scale(params, cfg, prompts[src], pmask[src], r.tokens, r.mask, temperature)


def test_score_equals_full_forward_and_sampler(tiny):
    params, cfg, prompts, pmask, r = tiny
    logp, entropy = score(params, cfg, prompts, pmask, r.tokens, r.mask)
    m = np.asarray(r.mask)
    scale = _logit_scale(tiny, r)
    assert_float32_close(np.asarray(logp)[m], np.asarray(r.logprobs)[m], scale=scale)
    assert_float32_close(np.asarray(entropy)[m], np.asarray(r.entropy)[m], scale=scale)
    b = 5  # and one row against a plain forward of prompt + response
    p = np.asarray(prompts[b // G])[np.asarray(pmask[b // G])]
    seq = jnp.asarray(np.concatenate([p, np.asarray(r.tokens[b])]))[None]
    full = jax.nn.log_softmax(
        forward(params, cfg, seq, jnp.arange(seq.shape[1])[None], jnp.ones_like(seq, bool)).logits[
            0
        ]
    )
    ref = full[len(p) - 1 : -1][jnp.arange(T), r.tokens[b]]
    assert_float32_close(np.asarray(logp[b])[m[b]], np.asarray(ref)[m[b]], scale=scale)


def test_score_temperature_is_the_sampler_tempered_policy(tiny):
    # rl.score_temperature = "rollout" (verl): pi_old and pi_theta are softmax(logits / T),
    # so rows drawn at T are scored on-policy: the sampler's mu equals the tempered score
    params, cfg, prompts, pmask, _ = tiny
    t = 1.7
    r = sample(
        params,
        cfg,
        prompts,
        pmask,
        jax.random.key(3),
        jnp.full((Q * G, T), t),
        SamplingConfig(T, stop_ids=(7,)),
    )
    m = np.asarray(r.mask)
    hot, hot_entropy = score(params, cfg, prompts, pmask, r.tokens, r.mask, t)
    cold, _ = score(params, cfg, prompts, pmask, r.tokens, r.mask)
    scale = _logit_scale(tiny, r, t)  # the tempered logits
    assert_float32_close(np.asarray(hot)[m], np.asarray(r.logprobs)[m], scale=scale)
    assert np.abs(np.asarray(cold) - np.asarray(hot))[m].max() > 1e-2  # T = 1 is another policy
    # by hand: log_softmax(logits / T) of the T = 1 log-probs' logits, per position
    b = 2
    p = np.asarray(prompts[b // G])[np.asarray(pmask[b // G])]
    seq = jnp.asarray(np.concatenate([p, np.asarray(r.tokens[b])]))[None]
    logits = forward(
        params, cfg, seq, jnp.arange(seq.shape[1])[None], jnp.ones_like(seq, bool)
    ).logits[0][len(p) - 1 : -1]
    ref = jax.nn.log_softmax(logits / t)
    assert_float32_close(
        np.asarray(hot[b])[m[b]], np.asarray(ref[jnp.arange(T), r.tokens[b]])[m[b]], scale=scale
    )
    ent = -jnp.sum(jnp.exp(ref) * ref, axis=-1)
    assert_float32_close(np.asarray(hot_entropy[b])[m[b]], np.asarray(ent)[m[b]], scale=scale)


def _batch(tiny, adv):
    params, cfg, prompts, pmask, r = tiny
    old, _ = score(params, cfg, prompts, pmask, r.tokens, r.mask)
    return Batch(
        prompts=prompts,
        prompt_mask=pmask,
        tokens=r.tokens,
        mask=r.mask,
        advantages=adv,
        behaviour_logp=r.logprobs,
        old_logp=old,
        weights=jnp.ones(Q * G),
    )


def test_on_policy_gradient_is_reinforce(tiny):
    params, cfg, prompts, pmask, r = tiny
    adv = jax.random.normal(jax.random.key(2), (Q * G,))
    batch = _batch(tiny, adv)
    lc = losses.LossConfig(aggregation="token_mean")
    n = jnp.sum(r.mask)
    # jitted: op-by-op differentiation of the decoder is ~10x slower than compiling it
    grads = jax.jit(jax.grad(lambda p: _loss(p, cfg, lc, batch, n)[0]))(params)

    def reinforce(p):
        logp, _ = score(p, cfg, prompts, pmask, r.tokens, r.mask)
        return -jnp.sum(jnp.where(r.mask, adv[:, None] * logp, 0.0)) / n

    ref = jax.jit(jax.grad(reinforce))(params)
    # per leaf, to its own scale: a backward pass through the decoder rounds more
    for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(grads), jax.tree.leaves(ref)):
        assert_float32_close(a, b, ulps=1024, err_msg=jax.tree_util.keystr(path))


def test_micro_batches_give_the_same_update(tiny):
    params, cfg, *_, r = tiny
    adv = jax.random.normal(jax.random.key(3), (Q * G,))
    batch = _batch(tiny, adv)
    lc = losses.LossConfig(aggregation="seq_mean_token_mean")
    out = []
    for m in (1, 3):
        oc = OptimConfig(lr=1e-3, micro_batches=m)  # Adam moves every weight by ~lr
        opt = make_optimizer(oc)
        state, metrics = train_step(init_state(copy(params), opt), batch, cfg, lc, oc, opt)
        out.append((state.params, float(metrics["train/loss"])))
    # the loss: a mean of A x ratio, ratio = exp(logp - old) of log-probs rounded at the
    # logits' scale
    scale = float(jnp.abs(adv).max()) * _logit_scale(tiny, r)
    assert_float32_close(out[1][1], out[0][1], scale=scale)
    for (path, a), b, w in zip(
        jax.tree_util.tree_leaves_with_path(out[1][0]),
        jax.tree.leaves(out[0][0]),
        jax.tree.leaves(params),
    ):
        # The moves compared, at lr's scale (the weights' own would hide them). Adam divides
        # each gradient entry by its own size, so an entry far below its leaf's largest
        # passes its rounding (at the leaf's scale) on amplified: ~0.1% of lr, not lr's
        # rounding (this also covers a rounding of each weight, |w| < 2)
        w = np.asarray(w, np.float64)
        move_a, move_b = np.asarray(a) - w, np.asarray(b) - w
        assert_float32_close(
            move_a, move_b, scale=1e-3, ulps=8192, err_msg=jax.tree_util.keystr(path)
        )


def test_non_finite_loss_skips_the_update(tiny):
    params, cfg, *_ = tiny
    batch = _batch(tiny, jnp.full((Q * G,), jnp.nan))
    oc = OptimConfig(lr=1e-2)
    opt = make_optimizer(oc)
    state, _ = train_step(init_state(copy(params), opt), batch, cfg, losses.LossConfig(), oc, opt)
    assert int(state.skipped) == 1 and int(state.step) == 1
    for a, b in zip(jax.tree.leaves(state.params), jax.tree.leaves(params)):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("warmup", [0, 4])
def test_the_learning_rate_warms_up_then_decays_along_half_a_cosine(warmup):
    """A constant gradient moves a weight by the step's learning rate under Adam (its
    bias-corrected m / sqrt(v) is 1): the moves are the schedule, against its formula."""
    lr, decay = 0.1, 8
    opt = make_optimizer(OptimConfig(lr=lr, warmup_steps=warmup, decay_steps=decay,
                                     weight_decay=0.0, max_grad_norm=1e9))  # fmt: skip
    w = jnp.zeros(())
    opt_state = opt.init(w)
    moves = []
    for _ in range(warmup + decay + 2):
        updates, opt_state = opt.update(jnp.ones(()), opt_state, w)
        moves.append(-float(updates))
    cosine = [lr * 0.5 * (1 + np.cos(np.pi * min(k, decay) / decay)) for k in range(decay + 2)]
    expected = [lr * k / warmup for k in range(warmup)] + cosine
    np.testing.assert_allclose(moves, expected, rtol=1e-5, atol=1e-7)


def test_a_held_learning_rate_keeps_the_optimizer_state_earlier_checkpoints_have():
    """No warm-up, no decay: the state has no schedule step count, so a run checkpointed
    before `decay_steps` existed still restores."""
    import optax

    params = {"w": jnp.zeros(3)}
    ours = make_optimizer(OptimConfig(lr=1e-3)).init(params)
    before = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(1e-3)).init(params)
    assert jax.tree.structure(ours) == jax.tree.structure(before)
    decayed = make_optimizer(OptimConfig(lr=1e-3, decay_steps=10)).init(params)
    assert jax.tree.structure(decayed) != jax.tree.structure(before)


@pytest.mark.slow
def test_learning_happens_on_a_learnable_task():
    """Reward 1 when the first response token is 5: GRPO drives it from ~1/64 to > 0.8."""
    cfg = presets.get_preset("tiny-llama")
    params = transformer.init_params(cfg, jax.random.key(4), scale=0.1)
    q, g, t = 8, 8, 4
    prompts, pmask = left_padded_batch(np.random.default_rng(5), [4] * q, 64, 4)
    prompts, pmask = jnp.asarray(prompts), jnp.asarray(pmask)
    oc = OptimConfig(lr=3e-3, weight_decay=0.0)
    opt = make_optimizer(oc)
    lc = losses.LossConfig()
    state = init_state(params, opt)
    curve = []
    for step in range(40):
        r = sample(
            state.params,
            cfg,
            prompts,
            pmask,
            jax.random.key(100 + step),
            jnp.ones((q * g, t)),
            SamplingConfig(t),
        )
        reward = (r.tokens[:, 0] == 5).astype(jnp.float32)
        curve.append(float(reward.mean()))
        adv = advantages.grpo(reward.reshape(q, g)).reshape(-1)
        old, _ = score(state.params, cfg, prompts, pmask, r.tokens, r.mask)
        batch = Batch(prompts, pmask, r.tokens, r.mask, adv, r.logprobs, old, jnp.ones(q * g))
        state, _ = train_step(state, batch, cfg, lc, oc, opt)
    assert np.mean(curve[:3]) < 0.1 and np.mean(curve[-3:]) > 0.8, curve
