"""Sample-based evaluation metrics over n rollouts per question.

correct: [P, n] booleans (question p, sample i). All metrics average over questions.

- Mean@k: expected accuracy of one of the first k samples.
- Pass@k: the unbiased estimator 1 - C(n - c, k) / C(n, k) of Chen et al. 2021 (Codex,
  Eq. 1), computed as a stable product, for every k <= n.
- Maj@k: majority vote over the first k samples' answers (ties: the answer seen first);
  correct when the voted answer is.
- Answer disagreement: the fraction of pairs of one question's samples whose final answers
  differ (ASE, seed 001: how many distinct solutions a group explores).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import numpy as np


def pass_at_k(n: int, c: int, k: int) -> float:
    """1 - C(n - c, k) / C(n, k) = 1 - prod_{i = n - c + 1}^{n} (1 - k / i)."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"need 0 <= c <= n and 1 <= k <= n, got n={n} c={c} k={k}")
    if n - c < k:
        return 1.0
    return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


def pass_at_ks(correct: np.ndarray) -> dict[int, float]:
    """Pass@k for k = 1..n, averaged over questions."""
    correct = np.asarray(correct, bool)
    n = correct.shape[1]
    counts = correct.sum(axis=1)
    return {k: float(np.mean([pass_at_k(n, int(c), k) for c in counts])) for k in range(1, n + 1)}


def mean_at_k(correct: np.ndarray, k: int | None = None) -> float:
    correct = np.asarray(correct, bool)
    return float(correct[:, : k or correct.shape[1]].mean())


def maj_at_k(answers: Sequence[Sequence[str | None]], correct: np.ndarray, k: int) -> float:
    """Majority vote over the first k extracted answers (None: no vote)."""
    correct = np.asarray(correct, bool)
    hits = []
    for row, ok in zip(answers, correct):
        votes = Counter(a for a in row[:k] if a is not None)
        if not votes:
            hits.append(False)
            continue
        top = max(votes.values())
        winner = next(a for a in row[:k] if a is not None and votes[a] == top)
        hits.append(bool(ok[list(row).index(winner)]))
    return float(np.mean(hits))


def answer_disagreement(answers: Sequence[Sequence[str | None]]) -> float:
    """Mean over questions of the fraction of sample pairs (i < j) with different final
    answers; "no answer" (None) is one more answer, equal to itself."""
    fractions = []
    for row in answers:
        n = len(row)
        if n < 2:
            continue
        same = sum(c * (c - 1) // 2 for c in Counter(row).values())
        fractions.append(1.0 - same / (n * (n - 1) // 2))
    return float(np.mean(fractions)) if fractions else float("nan")
