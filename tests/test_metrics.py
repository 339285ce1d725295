"""Evaluation metrics against hand-computed values."""

import math

import numpy as np
import pytest

from explore_rl.evaluation import metrics as metrics_lib
from explore_rl.evaluation.metrics import maj_at_k, mean_at_k, pass_at_k, pass_at_ks


def test_pass_at_k_matches_the_binomial_formula():
    for n, c, k in [(16, 3, 1), (16, 3, 8), (16, 0, 4), (16, 16, 4), (256, 5, 64), (5, 4, 2)]:
        exact = 1 - math.comb(n - c, k) / math.comb(n, k)
        assert pass_at_k(n, c, k) == pytest.approx(exact, rel=1e-9, abs=1e-12)
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)
    with pytest.raises(ValueError, match="k=5"):
        pass_at_k(4, 1, 5)


def test_worst_at_k_is_the_chance_that_k_drawn_samples_are_all_correct():
    for n, c, k in [(16, 3, 1), (16, 12, 8), (16, 3, 4), (16, 16, 16), (256, 250, 64), (5, 4, 2)]:
        exact = math.comb(c, k) / math.comb(n, k)
        assert metrics_lib.worst_at_k(n, c, k) == pytest.approx(exact, rel=1e-9, abs=1e-12)
    # by enumeration: 2 of 4 drawn from [1, 1, 1, 0] are both correct in 3 of the 6 pairs
    assert metrics_lib.worst_at_k(4, 3, 2) == pytest.approx(0.5)
    correct = np.array([[1, 0, 0, 0], [1, 1, 1, 1], [1, 1, 1, 0]], bool)
    curve = metrics_lib.worst_at_ks(correct)
    assert curve[1] == pytest.approx(mean_at_k(correct))  # one sample: the mean
    assert curve[2] == pytest.approx((0 + 1 + 0.5) / 3)
    assert curve[4] == pytest.approx(1 / 3)  # all four correct: the second question only
    with pytest.raises(ValueError, match="k=5"):
        metrics_lib.worst_at_k(4, 1, 5)


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


def test_diversity_measures_by_hand():
    from explore_rl.evaluation import diversity

    assert metrics_lib.distinct_n([[1, 2, 3, 4, 5], [1, 2, 3, 4]]) == 2 / 3  # 3 grams, 2 unique
    assert math.isnan(metrics_lib.distinct_n([[1, 2]]))
    x = diversity.embed([[1, 2, 3, 4, 5], [1, 2, 3, 4]])  # grams (1234), (2345)
    np.testing.assert_allclose(x, [[2**-0.5, 2**-0.5], [1, 0]])
    pts = np.array([[0.0, 0], [2, 0], [0, 2], [2, 2]])
    assert diversity.rms_radius(pts) == pytest.approx(math.sqrt(2))
    inner, outer = np.array([[1.0, 1], [0.5, 1.5]]), np.array([[3.0, 3], [-1, 1]])
    assert diversity.outside_hull(pts, np.concatenate([inner, outer])) == 0.5
    assert math.isnan(diversity.outside_hull(pts[:1].repeat(3, 0), outer))  # no area
    same = [[1, 2, 3, 4, 5], [1, 2, 3, 4, 6], [1, 2, 3, 4, 7]]
    wide = [[9, 8, 7, 6], [5, 4, 3, 2, 1], [1, 2, 3, 4, 5]]
    out = diversity.compare([same, same[:2]], [wide, wide])  # the 2nd prompt: < 3 correct
    assert out["prompts_compared"] == 1 and out["rms_radius_ratio"] > 1


def test_answer_disagreement_by_hand():
    from explore_rl.evaluation.metrics import answer_disagreement

    # 3 pairs, one agreeing ("1", "1"): 2/3; no answer twice agrees with itself: 0
    assert answer_disagreement([["1", "1", "2"], [None, None]]) == pytest.approx(1 / 3)
    assert answer_disagreement([["3", None, "4", "5"]]) == 1.0
    assert math.isnan(answer_disagreement([["1"]]))


def test_self_bleu_and_log_det_by_hand():
    from explore_rl.evaluation.metrics import bleu, log_det, self_bleu

    same = [[1, 2, 3, 4, 5, 6]] * 3
    assert self_bleu(same) == pytest.approx(1.0)  # identical responses: no diversity
    # hyp [1 2 3 4 5 9] vs ref [1 2 3 4 5 6]: precisions 5/6, 4/5, 3/4, 2/3, no brevity cost
    expected = (5 / 6 * 4 / 5 * 3 / 4 * 2 / 3) ** 0.25
    assert bleu([1, 2, 3, 4, 5, 9], [[1, 2, 3, 4, 5, 6]]) == pytest.approx(expected)
    # shared: unigrams 1, 2 and the bigram (1, 2); no trigram or 4-gram: each of those
    # precisions is smoothed to 0.1 / (the hypothesis' grams of that order: 4 and 3)
    smoothed = (2 / 6 * 1 / 5 * 0.1 / 4 * 0.1 / 3) ** 0.25
    assert bleu([7, 8, 9, 1, 2, 10], [[1, 2, 3, 4, 5, 6]]) == pytest.approx(smoothed)
    short = bleu([1, 2, 3, 4], [[1, 2, 3, 4, 5, 6]])  # brevity penalty exp(1 - 6 / 4)
    assert short == pytest.approx(math.exp(1 - 6 / 4))
    assert math.isnan(self_bleu([[1, 2, 3, 4]]))
    assert log_det(np.eye(3)) == pytest.approx(3 * math.log(2))  # orthogonal: K = I
    assert log_det(np.ones((4, 1)), alpha=0.5) == pytest.approx(math.log(1 + 4 * 0.5))
