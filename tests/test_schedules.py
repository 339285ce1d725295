"""Temperature tables against hand-computed values."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from explore_rl.sampling import schedules


def test_ead_hand_picked_points():
    # tau_max 1.2, tau_min 0.1, d0 25, k 1, c 10; position i holds the paper's t = i + 1
    tau = np.asarray(schedules.ead(40, step=0))
    np.testing.assert_allclose(tau[:9], 1.0)  # t = 1..9 < c: the paper's 9 tokens at 1.0
    np.testing.assert_allclose(tau[9], 2.2 - math.exp(10 / 25), rtol=1e-6)  # t = 10: 0.70818
    np.testing.assert_allclose(tau[17], 2.2 - math.exp(18 / 25), rtol=1e-5)  # t = 18: 0.14557
    # exp(t / 25) >= 2.1 from t = 25 ln 2.1 = 18.55: tau_min from t = 19 (position 18) on
    np.testing.assert_allclose(tau[18:], 0.1)
    late = np.asarray(schedules.ead(40, step=100))  # d_s = 25 + 500
    np.testing.assert_allclose(late[9], 2.2 - math.exp(10 / 525), rtol=1e-6)
    code = np.asarray(schedules.ead(40, step=0, k=20.0))  # the public code's k
    np.testing.assert_allclose(code[29], 2.2 - math.exp(30 / 500), rtol=1e-6)
    capped = np.asarray(schedules.ead(40, step=10**6))  # d_s = 40000
    np.testing.assert_allclose(capped[39], 2.2 - math.exp(40 / 40000), rtol=1e-6)
    zero = np.asarray(schedules.ead(40, step=0, first=0))  # zero-based: 10 tokens at 1.0
    np.testing.assert_allclose(zero[:10], 1.0)
    np.testing.assert_allclose(zero[10], 2.2 - math.exp(10 / 25), rtol=1e-6)
    np.testing.assert_allclose(zero[1:], tau[:-1])  # the same curve, one token later


def test_ead_step_is_traced():
    f = jax.jit(lambda s: schedules.ead(16, s, tau_min=0.8))
    a, b = f(0), f(50)
    assert f._cache_size() == 1 and float(a[12]) < float(b[12])


def test_cosine_warmup_and_composition():
    w = [float(schedules.cosine_warmup(s, 200)) for s in (0, 100, 200, 400)]
    np.testing.assert_allclose(w, [0.2, 0.6, 1.0, 1.0], atol=1e-6)  # schedule values: absolute
    noisy = jnp.array([True, False, True])
    rows = schedules.per_row(noisy, schedules.cosine_warmup(0, 200), 1.0)
    tab = schedules.table(rows, schedules.ead(12, 0))
    assert tab.shape == (3, 12)
    np.testing.assert_allclose(tab[0, :9], 0.2, rtol=1e-6)
    np.testing.assert_allclose(tab[1, 9], 2.2 - math.exp(0.4), rtol=1e-6)
    np.testing.assert_allclose(schedules.table(batch=2, length=3), np.ones((2, 3)))
    np.testing.assert_allclose(schedules.constant(2, 3, 0.7), np.full((2, 3), 0.7))
    with pytest.raises(ValueError, match="per_row or batch"):
        schedules.table(per_position=jnp.ones(3))
