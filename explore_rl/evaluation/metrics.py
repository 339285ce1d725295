"""Sample-based evaluation metrics over n rollouts per question.

correct: [P, n] booleans (question p, sample i). All metrics average over questions.

- Mean@k: expected accuracy of one of the first k samples.
- Pass@k: the unbiased estimator 1 - C(n - c, k) / C(n, k) of Chen et al. 2021 (Codex,
  Eq. 1), computed as a stable product, for every k <= n.
- Worst@k: C(c, k) / C(n, k), the chance that k samples are all correct (EAD paper).
- Maj@k: majority vote over the first k samples' answers (ties: the answer seen first);
  correct when the voted answer is.
- Answer disagreement: the fraction of pairs of one question's samples whose final answers
  differ (ASE, ASE paper: how many distinct solutions a group explores).

Diversity of a set of responses (ExTra, ExTra paper, Sec. 5.4): distinct-n (unique / all
n-grams), Self-BLEU (each response's BLEU-4 against the others, averaged: lower is more
diverse) and LogDet (log det(I + alpha K), K the cosine kernel of sentence embeddings:
higher is a larger volume).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence

import numpy as np

# the key segment of a temperature of `eval.temperatures`: eval/<set>/T_<label>/<metric>
# (evaluate.py writes them, analysis.frontier reads them)
SWEEP = "T_"


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


def worst_at_k(n: int, c: int, k: int) -> float:
    """C(c, k) / C(n, k) = prod_{i < k} (c - i) / (n - i): the chance that k of the n
    samples, drawn without replacement, are all correct (the EAD paper's Worst@k, Sec. 5.2;
    unbiased as `pass_at_k` is)."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"need 0 <= c <= n and 1 <= k <= n, got n={n} c={c} k={k}")
    return float(np.prod((c - np.arange(k)) / (n - np.arange(k)))) if c >= k else 0.0


def worst_at_ks(correct: np.ndarray) -> dict[int, float]:
    """Worst@k for k = 1..n, averaged over questions."""
    correct = np.asarray(correct, bool)
    n = correct.shape[1]
    counts = correct.sum(axis=1)
    return {k: float(np.mean([worst_at_k(n, int(c), k) for c in counts])) for k in range(1, n + 1)}


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


N = 4  # n of the n-gram diversity measures


def ngrams(tokens, n: int = N) -> list[tuple]:
    return [tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1)]


def distinct_n(responses: list, n: int = N) -> float:
    """Unique n-grams / all n-grams over the responses (token ids)."""
    grams = [g for r in responses for g in ngrams(r, n)]
    return len(set(grams)) / len(grams) if grams else float("nan")


def bleu(hypothesis: Sequence, references: list[Sequence], n: int = N) -> float:
    """Sentence BLEU-n with uniform weights (Papineni et al. 2002): modified n-gram
    precisions clipped by the references' maximum counts, a zero count smoothed to 0.1
    (Chen and Cherry 2014, method 1, as NLTK and Texygen's Self-BLEU), times the brevity
    penalty against the reference length closest to the hypothesis'."""
    most = [Counter() for _ in range(n)]
    for ref in references:
        for k in range(n):
            for g, c in Counter(ngrams(ref, k + 1)).items():
                most[k][g] = max(most[k][g], c)
    grams = [Counter(ngrams(hypothesis, k)) for k in range(1, n + 1)]
    return _bleu(grams, most, len(hypothesis), [len(r) for r in references])


def _bleu(grams: list[Counter], most: list, length: int, ref_lengths: list[int]) -> float:
    """`bleu` of a hypothesis of `length` tokens from its n-gram counts of each order
    (`grams`) and, per order, each of its grams' largest count in a reference (`most`)."""
    if not length:
        return 0.0
    log_p = 0.0
    for counts, clip in zip(grams, most):
        total = max(sum(counts.values()), 1)
        hits = sum(min(c, clip.get(g, 0)) for g, c in counts.items())
        log_p += math.log((hits or 0.1) / total) / len(grams)
    closest = min((abs(r - length), r) for r in ref_lengths)[1]
    brevity = min(1.0, math.exp(1 - closest / length))
    return brevity * math.exp(log_p)


def self_bleu(responses: list[Sequence], n: int = N) -> float:
    """Mean BLEU-n of each response against all the others (Zhu et al. 2018, Texygen).
    A gram's largest count among the others is the largest over all responses unless that
    is the response's own, then the second largest: each response's counts are taken once
    (not once per other response, which cost seconds a question at 64 samples)."""
    if len(responses) < 2:
        return float("nan")
    grams = [[Counter(ngrams(r, k)) for k in range(1, n + 1)] for r in responses]
    top = [{} for _ in range(n)]  # per order: gram -> (largest count, whose, second largest)
    for i, own in enumerate(grams):
        for k in range(n):
            for g, c in own[k].items():
                first, whose, second = top[k].get(g, (0, -1, 0))
                top[k][g] = (c, i, first) if c > first else (first, whose, max(second, c))
    lengths = [len(r) for r in responses]
    scores = []
    for i, own in enumerate(grams):
        most = [{g: t[0] if t[1] != i else t[2] for g in own[k] for t in [top[k][g]]}
                for k in range(n)]  # fmt: skip
        scores.append(_bleu(own, most, lengths[i], lengths[:i] + lengths[i + 1 :]))
    return float(np.mean(scores))


def log_det(z: np.ndarray, alpha: float = 1.0) -> float:
    """log det(I + alpha K), K = Z Z^T the cosine kernel of unit embeddings [R, F]."""
    k = z @ z.T
    return float(np.linalg.slogdet(np.eye(len(z)) + alpha * k)[1])
