"""Diversity of correct rollouts before any update: standard vs anchor-perturbed (EDEN).

EDEN's analysis (EDEN paper, "Diversity appears before any update"): for each prompt, sample
G standard rollouts and G rollouts with the prompt's anchor + per-row noise appended, keep
the correct ones, and compare their spread in an aligned 4-gram space. Our reading of that
space: each response is its vector of 4-gram counts over the prompt's joint 4-gram
vocabulary, L2-normalised (so length does not dominate). Per prompt with at least 3 correct
rollouts on each side:
  - RMS radius ratio: sqrt(mean ||x - mean(x)||^2) of the perturbed set / the standard set's;
  - outside the hull: the fraction of perturbed points outside the convex hull of the
    standard points, in the 2-D PCA plane of both sets together (a hull in the full
    space contains almost nothing; the projection is ours);
and over all responses, distinct-4 (unique / total 4-grams), correct ones and all.

The measurement (the rollouts of both sides): `python -m explore_rl.eden_analysis`.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import scipy.spatial

from explore_rl.evaluation.metrics import N, distinct_n, ngrams


def embed(responses: list, n: int = N) -> np.ndarray:
    """[R, V] L2-normalised n-gram count vectors over the responses' joint vocabulary."""
    counts = [Counter(ngrams(r, n)) for r in responses]
    vocab = {g: i for i, g in enumerate(sorted({g for c in counts for g in c}))}
    x = np.zeros((len(responses), max(len(vocab), 1)))
    for row, c in enumerate(counts):
        for g, k in c.items():
            x[row, vocab[g]] = k
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)


def rms_radius(x: np.ndarray) -> float:
    return float(np.sqrt(np.mean(np.sum((x - x.mean(0)) ** 2, axis=1))))


def outside_hull(standard: np.ndarray, perturbed: np.ndarray) -> float:
    """Fraction of perturbed points outside the standard points' hull in the 2-D PCA plane
    of both; NaN when the standard points span no area there."""
    both = np.concatenate([standard, perturbed])
    centred = both - both.mean(0)
    _, _, vt = np.linalg.svd(centred, full_matrices=False)
    plane = centred @ vt[:2].T
    if plane.shape[1] < 2:
        return float("nan")
    try:
        hull = scipy.spatial.Delaunay(plane[: len(standard)])
    except scipy.spatial.QhullError:  # collinear or repeated points: no area
        return float("nan")
    return float(np.mean(hull.find_simplex(plane[len(standard) :]) < 0))


def compare(standard: list[list], perturbed: list[list]) -> dict[str, float]:
    """Per-prompt spread of correct responses: [(standard, perturbed) per prompt] lists of
    token-id responses; prompts with < 3 correct on a side are skipped."""
    ratios, outside = [], []
    for s, p in zip(standard, perturbed):
        if len(s) < 3 or len(p) < 3:
            continue
        x = embed(s + p)
        rs, rp = rms_radius(x[: len(s)]), rms_radius(x[len(s) :])
        if rs > 0:
            ratios.append(rp / rs)
        frac = outside_hull(x[: len(s)], x[len(s) :])
        if not np.isnan(frac):
            outside.append(frac)
    return {
        "prompts_compared": len(ratios),
        "rms_radius_ratio": float(np.mean(ratios)) if ratios else float("nan"),
        "outside_hull_frac": float(np.mean(outside)) if outside else float("nan"),
    }


def summarise(standard: list, null: list, perturbed: list) -> dict:
    """[(all, correct) per prompt] for each side -> the numbers of the module docstring."""
    result = compare([s[1] for s in standard], [p[1] for p in perturbed])
    result.update(
        {f"null/{k}": v for k, v in compare([s[1] for s in standard], [n[1] for n in null]).items()}
    )
    for side, groups in (("standard", standard), ("null", null), ("perturbed", perturbed)):
        result[f"{side}/accuracy"] = float(
            np.mean([len(g[1]) / len(g[0]) for g in groups]) if groups else float("nan")
        )
        result[f"{side}/distinct4_all"] = distinct_n([r for g in groups for r in g[0]])
        result[f"{side}/distinct4_correct"] = distinct_n([r for g in groups for r in g[1]])
    return result
