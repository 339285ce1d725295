"""EAD: the temperature table, the behaviour log-prob mu it produces, TIS, a smoke run."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import G, Q, assert_float32_close, reference_truncated_logprob, response_logits, score

from configs import ead as ead_config
from explore_rl import config as config_lib
from explore_rl.exploration import base
from explore_rl.logs import read_metrics
from explore_rl.rl import losses
from explore_rl.rl.plan import base_plan
from explore_rl.sampling.sampler import SamplingConfig, sample
from explore_rl.train import loop

# mu vs a reference
pytestmark = [pytest.mark.usefixtures("highest_precision"), pytest.mark.numerics]


def _explorer(**overrides):
    c = ead_config.get_config("smoke")
    c.exploration.ead.update(overrides)
    (ex,) = base.build(config_lib.spec(c))
    return ex, c


def _plan(ex, c, rows, length, step, tau=1.0):
    ctx = base.StepContext(None, None, None, ex.spec, step)
    return ex.plan({}, base_plan(rows, length, tau, []), ctx, None)


@pytest.mark.parametrize(
    "convention,step,t,expected",
    [  # step: the 0-based step index (the paper's s = step + 1); t: the paper's 1-based t
        ("paper", 0, 9, 1.0),  # t < c = 10: temperature 1
        ("paper", 0, 10, 2.2 - math.exp(10 / 30)),  # s = 1: d_1 = 25 + 5
        ("paper", 0, 22, 2.2 - math.exp(22 / 30)),  # 0.1195, the last above tau_min
        ("paper", 0, 23, 0.1),  # 30 ln 2.1 = 22.26 < 23: tau_min
        ("paper", 2, 19, 2.2 - math.exp(19 / 40)),  # s = 3: d_3 = 25 + 15
        ("paper", 10**5, 500, 2.2 - math.exp(500 / 40000)),  # d_s capped at 40000
        ("code", 0, 10, 2.2 - math.exp(10 / 600)),  # k = 20: d = 20 x 30
        ("code", 0, 445, 2.2 - math.exp(445 / 600)),  # 0.1015
        ("code", 0, 446, 0.1),  # 600 ln 2.1 = 445.2
    ],
)
def test_table_matches_the_formula(convention, step, t, expected):
    ex, c = _explorer(convention=convention)
    tau = np.asarray(_plan(ex, c, 2, 600, step).temperature)
    np.testing.assert_allclose(tau[:, t - 1], expected, rtol=1e-5)


def test_the_seed_indexing_is_the_default_and_zero_based_is_named():
    ex, c = _explorer()
    assert (c.exploration.ead.c, c.exploration.ead.first_token) == (10, 1)  # EAD paper, Sec. 3
    tau = np.asarray(_plan(ex, c, 1, 16, 0).temperature)[0]
    assert (tau[:9] == 1.0).all() and tau[9] < 1.0  # 9 tokens at 1.0 with c = 10
    zero, _ = _explorer(first_token=0)
    tau0 = np.asarray(_plan(zero, c, 1, 16, 0).temperature)[0]
    assert (tau0[:10] == 1.0).all()
    np.testing.assert_allclose(tau0[10], 2.2 - math.exp(10 / 30), rtol=1e-6)


def test_table_multiplies_the_base_and_k_overrides():
    ex, c = _explorer(k=5.0, tau_min=0.8)
    tau = np.asarray(_plan(ex, c, 2, 64, 0, tau=0.5).temperature)
    np.testing.assert_allclose(tau[:, 9], 0.5 * (2.2 - math.exp(10 / 150)), rtol=1e-6)
    np.testing.assert_allclose(tau[:, 63], 0.5 * 0.8, rtol=1e-6)  # 2.2 - e^(64/150) < 0.8


def test_levels_draw_each_steps_tokens_at_its_level_or_refuse_what_is_not_one():
    ex, c = _explorer(levels=(0.3, 0.5, 1.1))
    for step, level in ((0, 0.3), (1, 0.5), (2, 1.1), (7, 1.1)):  # the last after the end
        tau = np.asarray(_plan(ex, c, 2, 16, step, tau=0.5).temperature)
        np.testing.assert_allclose(tau, np.full((2, 16), 0.5 * level), rtol=1e-6)
    for bad in (0.0, math.nan, math.inf, True, "a"):  # greedy, no number, not a level
        with pytest.raises(ValueError, match=rf"levels: every level .* \(found {bad!r}\)"):
            _explorer(levels=(0.3, bad))


def test_mu_is_the_annealed_truncated_logprob(tiny):  # noqa: F811
    params, cfg, prompts, pmask = tiny
    ex, c = _explorer(d0=4.0, c=2, tau_min=0.3)  # anneals within the 8 tokens
    t = 8
    plan = _plan(ex, c, Q * G, t, step=0)  # s = 1: d = 9
    tau = np.asarray(plan.temperature)
    assert tau[0, 0] == 1.0 and tau[0, -1] == pytest.approx(0.3) and tau[0, 3] < 1.0
    r = sample(
        params, cfg, prompts, pmask, jax.random.key(7), plan.temperature, SamplingConfig(t, 0.9)
    )
    src = np.repeat(np.arange(Q), G)
    logits = response_logits(params, cfg, prompts[src], pmask[src], r.tokens, r.mask)
    toks, mu = np.asarray(r.tokens), np.asarray(r.logprobs)
    ref = np.array(
        [
            [
                reference_truncated_logprob(logits[b, i], tau[b, i], 0.9, 0)[toks[b, i]]
                for i in range(t)
            ]
            for b in range(Q * G)
        ]
    )
    assert_float32_close(mu, ref, scale=float(np.abs(logits / tau[..., None]).max()))

    # pi_old: the clean policy at temperature 1 on the same tokens; TIS against it
    old, _ = score(params, cfg, prompts, pmask, r.tokens, r.mask)
    clean = np.take_along_axis(
        logits - np.log(np.exp(logits).sum(-1, keepdims=True)), toks[..., None], -1
    )[..., 0]
    assert_float32_close(old, clean, scale=float(np.abs(logits).max()))
    ratio = np.exp(np.asarray(old) - mu)
    # a cap near the 80% point with tokens on both sides of it, midway in the widest gap
    # between two tokens' ratios there: none within rounding of it, so numpy's exp and
    # XLA's (each a CPU's own vector code) clip the same tokens
    s = np.unique(ratio[np.asarray(r.mask)])
    lo, hi = int(0.75 * len(s)), int(0.85 * len(s))
    i = lo + int(np.argmax(s[lo:hi] - s[lo - 1 : hi - 1]))
    cap = float((s[i - 1] + s[i]) / 2)
    w = np.minimum(cap, ratio)
    assert (w == cap).any() and (w < 1.0).any()

    lc = losses.LossConfig(tis_cap=cap)
    adv = jnp.linspace(-1.0, 1.0, Q * G)

    def loss(logp, behaviour):
        x = losses.LossInputs(logp, old, adv, r.mask, behaviour_logp=behaviour)
        return losses.policy_loss(lc, x)

    value, metrics = loss(old, r.logprobs)
    m = np.asarray(r.mask)
    # on-policy ratio 1: token-mean of -w A
    expected = -(w * np.asarray(adv)[:, None])[m].sum() / m.sum()
    # a float32 mean of ~100 terms -w A, cancelling to ~0: rounded at the terms' size in
    # whatever order a CPU sums them
    terms = float(np.abs(w * np.asarray(adv)[:, None])[m].max())
    assert_float32_close(value, expected, scale=terms, ulps=16)
    np.testing.assert_allclose(float(metrics["tis/mean"]), w[m].mean(), rtol=1e-5)
    np.testing.assert_allclose(float(metrics["tis/max"]), w[m].max(), rtol=1e-6)
    np.testing.assert_allclose(float(metrics["tis/clipped_frac"]), (w[m] >= cap).mean())
    kl = (mu - np.asarray(old))[m].mean()  # KL(mu || pi_old), k1 on tokens drawn from mu
    np.testing.assert_allclose(float(metrics["policy/kl_mu_old"]), kl, rtol=1e-4)
    d_behaviour = jax.grad(lambda b: loss(old, b)[0])(r.logprobs)
    assert not np.asarray(d_behaviour).any()  # no gradient through w
    d_logp = np.asarray(jax.grad(lambda lp: loss(lp, r.logprobs)[0])(old))
    np.testing.assert_allclose(d_logp[m], -(w * np.asarray(adv)[:, None])[m] / m.sum(), rtol=1e-4)


def test_eval_plan_anneals_only_when_asked():
    ex, c = _explorer()
    ctx = base.StepContext(None, None, None, ex.spec, 0)
    p = base_plan(2, 32, 1.0, [])
    assert ex.eval_plan({}, p, ctx) is p
    ex, c = _explorer(at_eval=True)
    np.testing.assert_allclose(
        ex.eval_plan({}, p, ctx).temperature, _plan(ex, c, 2, 32, 0).temperature
    )


@pytest.mark.slow
def test_smoke_config_trains_with_the_code_convention_and_at_eval(tmp_path):
    # in process: the command line itself is tested in test_trainer and test_main
    c = ead_config.get_config("smoke")
    c.rollout.max_new_tokens = 16
    c.exploration.ead.convention, c.exploration.ead.at_eval = "code", True
    loop.train(config_lib.spec(c), str(tmp_path))
    rows = read_metrics(str(tmp_path))
    assert [r["step"] for r in rows] == [1, 2, 3]
    for r in rows:
        assert 1.0 < r["rollout/temperature"] < 1.2  # k = 20: still hot at 16 tokens
        # as drawn: the first c tokens at 1 (EAD paper, Sec. 4), the last still hot
        assert r["rollout/temperature_first"] == pytest.approx(1.0)
        assert 1.0 < r["rollout/temperature_last"] < 1.2
        assert r["tis/mean"] > 0 and r["tis/max"] <= 2.0
        assert r["policy/kl_mu_old"] != 0  # k1 on samples: can be either sign
        assert r["time/pi_old_s"] > 0  # mu is not pi_old under EAD
    assert "eval/arithmetic/maj@2" in rows[-1]
    assert '"convention": "code"' in (tmp_path / "config.json").read_text()


@pytest.mark.slow
def test_levels_reach_the_rollouts_step_by_step(tmp_path):
    """The control drawn as configured: each step's every token at its level (realised, as
    logged from the rollouts), TIS against pi_old at 1 as EAD's."""
    c = ead_config.get_config("smoke")
    c.rollout.max_new_tokens = 8
    c.exploration.ead.levels = (0.6, 0.9, 1.3)
    loop.train(config_lib.spec(c), str(tmp_path))
    rows = read_metrics(str(tmp_path))
    for r, level in zip(rows, (0.6, 0.9, 1.3), strict=True):
        for key in ("rollout/temperature", "rollout/temperature_first", "rollout/temperature_last"):
            assert r[key] == pytest.approx(level, rel=1e-6)
        assert r["policy/kl_mu_old"] != 0  # mu at the level, pi_old at 1: TIS between them
        assert r["time/pi_old_s"] > 0  # pi_old rescored, as EAD's
