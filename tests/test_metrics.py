"""Evaluation metrics against hand-computed values."""

import math

import numpy as np
import pytest

from explore_rl.evaluation.metrics import maj_at_k, mean_at_k, pass_at_k, pass_at_ks


def test_pass_at_k_matches_the_binomial_formula():
    for n, c, k in [(16, 3, 1), (16, 3, 8), (16, 0, 4), (16, 16, 4), (256, 5, 64), (5, 4, 2)]:
        exact = 1 - math.comb(n - c, k) / math.comb(n, k)
        assert pass_at_k(n, c, k) == pytest.approx(exact, rel=1e-9, abs=1e-12)
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)
    with pytest.raises(ValueError, match="k=5"):
        pass_at_k(4, 1, 5)


def test_curves_mean_and_majority():
    correct = np.array([[1, 0, 0, 0], [1, 1, 1, 1], [0, 0, 0, 0]], bool)
    curve = pass_at_ks(correct)
    assert list(curve) == [1, 2, 3, 4]
    assert curve[1] == pytest.approx((0.25 + 1 + 0) / 3)
    assert curve[2] == pytest.approx((0.5 + 1 + 0) / 3)  # 1 - C(3,2)/C(4,2) = 1/2
    assert curve[4] == pytest.approx(2 / 3)
    assert mean_at_k(correct) == pytest.approx(5 / 12) and mean_at_k(correct, 1) == pytest.approx(
        2 / 3
    )
    answers = [["7", "5", "5", None], ["2", "2", "2", "2"], [None, None, "1", "3"]]
    ok = np.array([[1, 0, 0, 0], [1, 1, 1, 1], [0, 0, 0, 0]], bool)
    assert maj_at_k(answers, ok, 3) == pytest.approx(1 / 3)  # "5" beats "7"; "2" wins
    assert maj_at_k(answers, ok, 1) == pytest.approx(2 / 3)  # first answers; row 3 no vote
    tie = [["7", "5"]]
    assert maj_at_k(tie, np.array([[1, 0]], bool), 2) == 1.0  # tie: the answer seen first
