"""Advantages and losses against hand-computed values."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import assert_float32_close

from explore_rl.rl import advantages as adv
from explore_rl.rl.losses import LossConfig, LossInputs, kl_k3, normaliser, policy_loss

# two computations of one loss or gradient (micro-batches, the REINFORCE form) too
pytestmark = pytest.mark.numerics

REWARDS = jnp.array([[1.0, 0, 0, 1], [1, 1, 1, 1], [0, 0, 0, 1]])


def test_grpo_dr_grpo_and_batch_advantages():
    a = adv.ADVANTAGES["grpo"](REWARDS)
    s = 1 / math.sqrt(1 / 3)  # group 0: mean 0.5, unbiased std sqrt(1/3)
    np.testing.assert_allclose(a[0], [0.5 * s, -0.5 * s, -0.5 * s, 0.5 * s], rtol=1e-5)
    np.testing.assert_array_equal(a[1], [0, 0, 0, 0])  # constant group: 0, finite
    np.testing.assert_allclose(a[2], [-0.5, -0.5, -0.5, 1.5], rtol=1e-5)  # std 0.5
    np.testing.assert_allclose(adv.ADVANTAGES["dr_grpo"](REWARDS)[2], [-0.25, -0.25, -0.25, 0.75])
    batch_std = math.sqrt((7 * (5 / 12) ** 2 + 5 * (7 / 12) ** 2) / 11)
    np.testing.assert_allclose(
        adv.ADVANTAGES["batch"](REWARDS)[2],
        np.array([-0.25, -0.25, -0.25, 0.75]) / batch_std,
        rtol=1e-5,
    )
    np.testing.assert_array_equal(adv.zero_advantage_groups(REWARDS), [False, True, False])


def test_rloo_is_each_reward_against_the_mean_of_the_others():
    a = adv.ADVANTAGES["rloo"](REWARDS)
    # group 0: r_0 = 1 against (0 + 0 + 1) / 3; r_1 = 0 against (1 + 0 + 1) / 3
    np.testing.assert_allclose(a[0], [2 / 3, -2 / 3, -2 / 3, 2 / 3], rtol=1e-6)
    np.testing.assert_array_equal(a[1], [0, 0, 0, 0])
    np.testing.assert_allclose(a[2], [-1 / 3, -1 / 3, -1 / 3, 1.0], rtol=1e-6)


def inputs(ratios, advantages, mask, **kw):
    old = jnp.zeros_like(jnp.asarray(ratios, jnp.float32))
    return LossInputs(
        logp=jnp.log(jnp.asarray(ratios, jnp.float32)),
        old_logp=old,
        advantages=jnp.asarray(advantages, jnp.float32),
        mask=jnp.asarray(mask, bool),
        **kw,
    )


RATIOS = [[0.5, 0.9, 1.0, 1.5], [0.5, 0.9, 1.0, 1.5]]
MASK = [[1, 1, 1, 1], [1, 1, 0, 0]]
# A = +1: -min(r, clip(r)) = [-0.5, -0.9, -1, -1.28]; A = -1: max(r, clip(r)) = [0.8, 0.9]
ROW0, ROW1 = -0.5 - 0.9 - 1.0 - 1.28, 0.8 + 0.9


@pytest.mark.parametrize(
    "aggregation,max_len,expected",
    [
        ("token_mean", 0, (ROW0 + ROW1) / 6),
        ("seq_mean_token_mean", 0, (ROW0 / 4 + ROW1 / 2) / 2),
        ("seq_mean_token_sum_norm", 0, (ROW0 + ROW1) / 8),
        ("seq_mean_token_sum_norm", 16, (ROW0 + ROW1) / 32),
    ],
)
def test_ppo_clip_aggregations(aggregation, max_len, expected):
    config = LossConfig(aggregation=aggregation, max_response_len=max_len)
    loss, m = policy_loss(config, inputs(RATIOS, [1, -1], MASK))
    np.testing.assert_allclose(float(loss), expected, rtol=1e-5)
    np.testing.assert_allclose(float(m["policy/clip_frac_low"]), 1 / 6, rtol=1e-6)  # r=.5, A<0
    np.testing.assert_allclose(float(m["policy/clip_frac_high"]), 1 / 6, rtol=1e-6)  # r=1.5, A>0


def test_micro_batches_sum_to_the_full_batch_loss():
    config = LossConfig(aggregation="seq_mean_token_mean")
    x = inputs(RATIOS, [1, -1], MASK)
    n = normaliser(config, x)
    halves = [jax.tree.map(lambda a, i=i: a[i : i + 1], x) for i in range(2)]
    total = sum(float(policy_loss(config, h, n)[0]) for h in halves)
    # terms of size ~1 (ratios 0.5-1.5, |A| = 1) summing to -0.035: an absolute bound, a few
    # float32 roundings of 1 (relative to the small total it would be under one of them)
    np.testing.assert_allclose(total, float(policy_loss(config, x)[0]), rtol=0, atol=1e-6)


def test_dual_clip_bounds_negative_advantages():
    loss, _ = policy_loss(LossConfig(dual_clip=3.0), inputs([[4.0]], [-1], [[1]]))
    assert float(loss) == pytest.approx(3.0)  # max(4, 1.28) = 4, capped at 3
    loss, _ = policy_loss(LossConfig(), inputs([[4.0]], [-1], [[1]]))
    assert float(loss) == pytest.approx(4.0)


def test_tis_weight_values_and_no_gradient():
    mu = -jnp.log(jnp.array([[0.5, 1.0, 3.0, 2.5]]))  # pi_old / mu = [0.5, 1, 3, 2.5]
    config = LossConfig(tis_cap=2.0)
    x = inputs([[1.0, 1.0, 1.0, 1.0]], [1.0], [[1, 1, 1, 1]], behaviour_logp=mu)
    loss, m = policy_loss(config, x)
    w = np.array([0.5, 1.0, 2.0, 2.0])
    np.testing.assert_allclose(float(loss), -w.mean(), rtol=1e-6)  # ratio 1: loss = -A w
    np.testing.assert_allclose(float(m["tis/mean"]), w.mean(), rtol=1e-6)
    np.testing.assert_allclose(float(m["tis/max"]), 2.0, rtol=1e-6)
    np.testing.assert_allclose(float(m["tis/clipped_frac"]), 0.5)
    grad_mu = jax.grad(lambda b: policy_loss(config, x.replace(behaviour_logp=b))[0])(mu)
    np.testing.assert_array_equal(grad_mu, 0.0)


def test_loss_weights_drop_and_scale_rows():
    x = inputs(RATIOS, [1, -1], MASK)
    dropped, _ = policy_loss(LossConfig(), x.replace(weights=jnp.array([1.0, 0.0])))
    np.testing.assert_allclose(float(dropped), ROW0 / 4, rtol=1e-5)  # row 1 leaves the mean
    scaled, _ = policy_loss(LossConfig(), x.replace(weights=jnp.array([1.0, 0.5])))
    np.testing.assert_allclose(float(scaled), (ROW0 + 0.5 * ROW1) / 6, rtol=1e-5)


def test_gspo_sequence_ratio():
    logp = jnp.array([[0.1, 0.3, 9.0], [-0.1, -0.3, 9.0]])  # third token masked
    x = LossInputs(
        logp=logp,
        old_logp=jnp.zeros_like(logp),
        advantages=jnp.array([1.0, -1.0]),
        mask=jnp.array([[1, 1, 0], [1, 1, 0]], bool),
    )
    loss, m = policy_loss(LossConfig(policy="gspo", aggregation="seq_mean_token_mean"), x)
    # s = exp(+-0.2), far outside [1 - 3e-4, 1 + 4e-4]: both rows clipped; terms of size 1
    # cancelling to -3.5e-4, so an absolute bound at a few float32 roundings of 1
    np.testing.assert_allclose(float(loss), (-(1 + 4e-4) + (1 - 3e-4)) / 2, atol=1e-6)
    assert float(m["policy/clip_frac_low"]) == 0.5 and float(m["policy/clip_frac_high"]) == 0.5
    with pytest.raises(ValueError, match="sequence-level"):
        LossConfig(policy="gspo")


@pytest.mark.parametrize("level", ["token", "row_mean", None])
def test_gspo_with_tis_weights_tokens_by_their_own_or_the_row_mean_w(level):
    # Two rows, the second's last token masked; s inside GSPO's clip range (unclipped).
    old = jnp.array([[-1.0, -2.0, -0.5], [-0.3, -1.2, 0.0]])
    logp = old + jnp.array([[1e-4, -2e-4, 1e-4], [5e-5, 5e-5, 9.0]])
    mu = old - jnp.log(jnp.array([[0.5, 1.5, 3.0], [1.2, 0.8, 1.0]]))  # pi_old / mu
    a, mask = jnp.array([1.0, -0.5]), jnp.array([[1, 1, 1], [1, 1, 0]], bool)
    x = LossInputs(logp=logp, old_logp=old, advantages=a, mask=mask, behaviour_logp=mu)
    tis = {"tis_cap": 2.0, "tis_level": level} if level else {}
    lc = LossConfig(policy="gspo", aggregation="seq_mean_token_mean", **tis)
    loss_fn = lambda lp: policy_loss(lc, x.replace(logp=lp))[0]  # noqa: E731
    value, grad = float(loss_fn(logp)), np.asarray(jax.grad(loss_fn)(logp))
    m = np.asarray(mask)
    n = m.sum(1)
    s = np.exp(np.where(m, np.asarray(logp - old), 0).sum(1) / n)  # GSPO's sequence ratio
    w = np.where(m, np.minimum(2.0, np.array([[0.5, 1.5, 3.0], [1.2, 0.8, 1.0]])), 0)
    w = w if level else m.astype(float)
    w_bar = w.sum(1) / n
    a_np = np.asarray(a)
    # value: every token carries -A s; mean over the row of w times it; mean over rows
    np.testing.assert_allclose(value, np.mean(-a_np * s * w_bar), rtol=1e-6)
    # gradient (GSPO-token, Eq. 13-14): token t of row i gets -A_i s_i x_t / (n_i R), with
    # x_t its own w_t (verl) or the row's mean w (row_mean); 0 where masked
    x_t = w if level == "token" or level is None else np.broadcast_to(w_bar[:, None], w.shape)
    expected = np.where(m, -(a_np * s)[:, None] * x_t / n[:, None] / 2, 0.0)
    np.testing.assert_allclose(grad, expected, rtol=1e-5, atol=1e-9)  # atol: the masked 0s


def test_the_gspo_token_form_has_the_sequence_gradient_without_tis():
    # GSPO's s_i = exp(mean_t log ratio): d(-A s)/d logp_t = -A s / n for every token
    old = jnp.zeros((1, 4))
    logp = jnp.array([[1e-4, 2e-4, -1e-4, 0.0]])
    mask = jnp.ones((1, 4), bool)
    x = LossInputs(logp=logp, old_logp=old, advantages=jnp.array([2.0]), mask=mask)
    lc = LossConfig(policy="gspo", aggregation="seq_mean_token_mean")
    grad = jax.grad(lambda lp: policy_loss(lc, x.replace(logp=lp))[0])(logp)
    s = np.exp(np.asarray(logp).mean())
    np.testing.assert_allclose(np.asarray(grad), np.full((1, 4), -2.0 * s / 4), rtol=1e-6)


def test_entropy_bonus_and_kl_to_reference():
    x = inputs(
        [[1.0, 1.0]],
        [0.0],
        [[1, 1]],
        entropy=jnp.array([[2.0, 4.0]]),
        ref_logp=jnp.log(jnp.array([[0.5, 1.0]])),
    )
    loss, m = policy_loss(LossConfig(entropy_coef=0.1, kl_coef=0.5), x)
    k3 = 0.5 - math.log(0.5) - 1  # exp(r) - r - 1 at r = log 0.5; 0 for the second token
    np.testing.assert_allclose(float(loss), -0.1 * 3.0 + 0.5 * k3 / 2, rtol=1e-5)
    np.testing.assert_allclose(float(m["policy/entropy"]), 3.0)
    np.testing.assert_allclose(
        float(kl_k3(jnp.log(0.5), jnp.log(0.25))), 0.5 + math.log(2) - 1, rtol=1e-6
    )


def test_on_policy_unclipped_gradient_is_reinforce():
    """With pi_old = pi_theta (stopped), grad of the token-mean loss = -mean A grad log pi."""
    theta = jax.random.normal(jax.random.key(0), (3, 5))  # logits of 3 rows x 5 actions
    actions = jnp.array([[1], [4], [2]])
    a = jnp.array([1.5, -0.5, 0.2])

    def logp(t):
        return jnp.take_along_axis(jax.nn.log_softmax(t), actions, axis=1)

    def loss(t):
        lp = logp(t)
        x = LossInputs(
            logp=lp, old_logp=jax.lax.stop_gradient(lp), advantages=a, mask=jnp.ones((3, 1), bool)
        )
        return policy_loss(LossConfig(), x)[0]

    reinforce = jax.grad(lambda t: -jnp.mean(a[:, None] * logp(t)))(theta)
    # two programs for one gradient (a 5-way softmax, a mean of 3 rows): a few roundings of
    # the gradient's scale, small entries included
    assert_float32_close(jax.grad(loss)(theta), reinforce, ulps=16)


def test_bad_loss_config():
    with pytest.raises(ValueError, match="aggregation='mean'"):
        LossConfig(aggregation="mean")
    with pytest.raises(ValueError, match="dual_clip=0.5"):
        LossConfig(dual_clip=0.5)


def test_gspo_clip_range_comes_from_the_config():
    from configs import grpo
    from explore_rl import config as config_lib

    c = grpo.get_config("smoke")
    # the config's defaults are the loss's (GSPO, Zheng et al. 2025: 3e-4 / 4e-4)
    default = config_lib.loss_config(c)
    assert (default.gspo_eps_low, default.gspo_eps_high) == (3e-4, 4e-4)
    c.rl.gspo_eps_low, c.rl.gspo_eps_high = 1e-3, 2e-3
    lc = config_lib.loss_config(c)
    assert (lc.gspo_eps_low, lc.gspo_eps_high) == (1e-3, 2e-3)


def test_a_registered_policy_loss_is_used_by_name():
    from explore_rl.rl import losses

    @losses.register("test_unclipped")
    def unclipped(x, c):  # plain importance-weighted policy gradient, never clipped
        ratio = jnp.exp(x.logp - x.old_logp)
        never = jnp.zeros(x.mask.shape, bool)
        return -x.advantages[:, None] * ratio, never, never

    logp = jnp.log(jnp.array([[0.5, 0.2], [0.4, 0.9]]))
    old = jnp.log(jnp.array([[0.25, 0.2], [0.8, 0.3]]))
    x = LossInputs(logp, old, jnp.array([1.0, -2.0]), jnp.array([[True, True], [True, False]]))
    value, metrics = policy_loss(LossConfig(policy="test_unclipped"), x)
    # ratios 2, 1 (A = 1) and 0.5 (A = -2); token-mean over 3 tokens
    assert float(value) == pytest.approx(-(2.0 + 1.0 - 2.0 * 0.5) / 3, rel=1e-6)
    with pytest.raises(ValueError, match="registered twice"):
        losses.register("test_unclipped")(lambda x, c: None)
