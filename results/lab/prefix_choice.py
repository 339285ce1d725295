"""A focused experiment of docs/lab.md, "ExTra's prefix choice without RL": on the lab's
4-number base model (the ExTra arms' own), does the prefix ExTra-R chooses lead to correct
completions more often than a random cut, and more often than fresh rollouts of the same
hard problems?

    python results/lab/prefix_choice.py          # writes results/lab/prefix_choice.md

The 512 test problems at 4 numbers, each sampled G = 8 times at temperature 1; a problem is
hard when all 8 are wrong (the ExTra paper's rule, Sec. 4.3). A hard problem's candidate
prefixes are the cuts of all 8 responses (the paper's Fig. 1: every rollout's prefixes;
`mine = "all"`), at line ends as the lab's ExTra cuts them (`select_cuts`: at least 4 tokens
apart, the last dropped), the same tokens counted once. Each candidate's score is its mean
token entropy (MTE, at temperature 1); ExTra's choice is the lowest MTE after the paper's
smoothing over the candidates' MiniLM embeddings (`smooth_scores`, tau as the lab's). Every
candidate, and the bare prompt (a fresh unguided rollout), is continued K = 32 times at
temperature 1; a prefix's solve rate is the share of its continuations whose whole answer
(prefix + continuation) is correct. Paired by problem, with 95% percentile bootstrap
intervals over the hard problems (`analysis.bootstrap_interval`). Every number in the report
comes from this run; the model, problems and draws are fixed by seed 0.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys

import numpy as np

G = 8  # the first draw's group size: a hard problem's 8 wrong answers
K = 32  # continuations of each prefix
CHUNK = 32  # prompts a generation call draws its K rows for
MAX_PROMPT = 64  # tokens of a prompt with its prefix (the lab's 24 leaves out later cuts)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="results/lab/prefix_choice.md")
    p.add_argument("--problems", type=int, default=512, help="test problems (the first n)")
    args = p.parse_args(argv)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import lab_study

    from explore_rl import caching

    caching.enable_compilation_cache()
    c = lab_study.arm_config("extra4", 0)  # ExTra's lab setting and its base model
    c.rollout.max_prompt_len = MAX_PROMPT
    text = run(c, args.problems)
    with open(args.out, "w") as f:
        f.write(text)
    print(text)


def run(c, n_problems: int) -> str:
    import jax

    from explore_rl import config as config_lib
    from explore_rl.models import minilm

    spec = config_lib.spec(c)
    params, cfg, tok = spec.model.load(spec.seed)
    spec = spec.with_stop_ids(tok.stop_ids)
    problems = next(iter(spec.problems()[1].values()))[:n_problems]
    x = c.exploration.extra
    min_gap, max_cuts, tau = int(x.min_gap), int(x.max_cuts), float(x.tau)
    rng = jax.random.key(spec.seed)
    with spec.reward.verifier() as verifier:
        draw = _Drawer(params, cfg, tok, spec, verifier)
        first = draw(problems, G, jax.random.fold_in(rng, 0))
        hard = [i for i in range(len(problems)) if not first.correct[i].any()]
        encoder = minilm.load(x.encoder)
        cases = [_candidates(first, i, tok, min_gap, max_cuts) for i in hard]
        # every prefix to continue: each hard problem's bare prompt, then its candidates
        jobs = [(i, ()) for i in hard] + [(i, x.tokens) for i, cs in zip(hard, cases) for x in cs]
        guided = [dataclasses.replace(problems[i], prefix=prefix) for i, prefix in jobs]
        solved = draw(guided, K, jax.random.fold_in(rng, 1)).correct.mean(axis=1)
    rate = dict(zip(jobs, solved))
    return _report(problems, first, hard, cases, rate, encoder, tok, tau)


class _Drawer:
    """`rollout.generate` at temperature 1 over chunks of CHUNK problems, n rows each."""

    def __init__(self, params, cfg, tok, spec, verifier):
        self.params, self.cfg, self.tok, self.spec, self.verifier = (
            params, cfg, tok, spec, verifier)  # fmt: skip

    def __call__(self, problems, n: int, rng):
        import jax

        from explore_rl.rl import plan as plan_lib
        from explore_rl.rl import rollout

        length = self.spec.rollout.sampling.max_new_tokens
        parts = []
        for start in range(0, len(problems), CHUNK):
            chunk = problems[start : start + CHUNK]
            plan = plan_lib.base_plan(len(chunk) * n, length, 1.0, chunk)
            parts.append(rollout.generate(
                self.params, self.cfg, self.tok, plan, jax.random.fold_in(rng, start),
                self.verifier, **self.spec.generation()))  # fmt: skip
        return _Drawn(
            correct=np.concatenate([r.correct for r in parts]),
            tokens=[t for r in parts for t in np.asarray(r.out.tokens)],
            mask=[m for r in parts for m in np.asarray(r.out.mask)],
            entropy=[h for r in parts for h in np.asarray(r.out.entropy)],
        )


@dataclasses.dataclass
class _Drawn:
    correct: np.ndarray  # [problems, n]
    tokens: list  # rows, problem-major
    mask: list
    entropy: list


def _candidates(first: _Drawn, i: int, tok, min_gap: int, max_cuts: int) -> list[_Cut]:
    """A hard problem's distinct cut prefixes over all G responses, each with its MTE: a
    list of (tokens, mte, response index)."""
    from explore_rl.exploration.extra import select_cuts

    seen, out = set(), []
    for j in range(G):
        row = i * G + j
        resp = first.tokens[row][first.mask[row]]
        ent = first.entropy[row][first.mask[row]]
        ends = np.asarray(["\n" in tok.decode([int(t)]) for t in resp], bool)
        for cut in select_cuts(np.flatnonzero(ends), min_gap, max_cuts):
            prefix = tuple(int(t) for t in resp[: cut + 1])
            if prefix not in seen:
                seen.add(prefix)
                out.append(_Cut(prefix, float(ent[: cut + 1].mean()), j))
    return out


@dataclasses.dataclass(frozen=True)
class _Cut:
    tokens: tuple
    mte: float
    response: int


def _report(problems, first, hard, cases, rate, encoder, tok, tau) -> str:
    from explore_rl import analysis
    from explore_rl.exploration.extra import lowest, smooth_scores

    rows = []  # per hard problem with at least one candidate
    for i, cs in zip(hard, cases):
        if not cs:
            continue
        mte = np.asarray([x.mte for x in cs])
        z = encoder.embed([tok.decode(list(x.tokens)) for x in cs])
        chosen = cs[lowest(smooth_scores(z, mte, tau), mte)]
        # the public code's mining: the cuts of the group's lowest-MTE response only
        resp_mte = [_response_mte(first, i * G + j) for j in range(G)]
        own = [x for x in cs if x.response == int(np.argmin(resp_mte))]
        lowest_mined = own[int(np.argmin([x.mte for x in own]))] if own else None
        solve = np.asarray([rate[(i, x.tokens)] for x in cs])
        rows.append({
            "n": len(cs),
            "chosen": rate[(i, chosen.tokens)],
            "mean_cut": float(solve.mean()),
            "fresh": rate[(i, ())],
            "lowest_raw": rate[(i, cs[int(np.argmin(mte))].tokens)],
            "lowest_mined": None if lowest_mined is None else rate[(i, lowest_mined.tokens)],
            "corr": _spearman(mte, solve),
        })  # fmt: skip
    with_choice = [r for r in rows if r["n"] >= 2]
    lines = [
        "# ExTra's prefix choice without RL",
        "",
        "Written by `python results/lab/prefix_choice.py`; the design and the prediction: "
        'docs/lab.md, "Focused experiments". The lab\'s 4-number base model (the ExTra '
        "arms'), its test problems; each cell the mean over hard problems [its 95% "
        "percentile bootstrap interval], differences paired by problem.",
        "",
        "## Mechanism checks (judged before the outcomes)",
        "",
        f"- problems: {len(problems)}; hard (all {G} first answers wrong): {len(hard)} "
        f"(at least 100: {'passed' if len(hard) >= 100 else 'failed'})",
        f"- hard problems with at least one cut: {len(rows)}; with at least 2 distinct "
        f"candidates (something to choose): {len(with_choice)} "
        f"(at least half of the hard ones: "
        f"{'passed' if 2 * len(with_choice) >= len(hard) else 'failed'})",
        f"- candidates a hard problem: {cell([r['n'] for r in rows])}",
        "",
        "## Outcomes (over the hard problems with at least 2 candidates)",
        "",
        "| quantity | problems | measured |",
        "|---|---|---|",
    ]
    pairs = (
        ("solve rate from ExTra's choice (all rollouts mined, smoothed)", "chosen", None),
        ("solve rate from a random cut (the mean over candidates)", "mean_cut", None),
        ("solve rate of fresh unguided rollouts", "fresh", None),
        ("**primary**: ExTra's choice minus a random cut", "chosen", "mean_cut"),
        ("ExTra's choice minus fresh unguided rollouts", "chosen", "fresh"),
        ("the lowest MTE unsmoothed minus a random cut", "lowest_raw", "mean_cut"),
        ("the public code's choice (lowest-MTE rollout mined) minus a random cut",
         "lowest_mined", "mean_cut"),
        ("Spearman correlation of a candidate's MTE with its solve rate", "corr", None),
    )  # fmt: skip
    primary = None
    for text, a, b in pairs:
        values = [r[a] - r[b] if b else r[a] for r in with_choice
                  if r[a] is not None and (b is None or r[b] is not None)]  # fmt: skip
        values = [v for v in values if v == v]  # a correlation: NaN where nothing varies
        lines.append(f"| {text} | {len(values)} | {cell(values)} |")
        if (a, b) == ("chosen", "mean_cut"):
            primary = values
    verdict = analysis.verdict(analysis.bootstrap_interval(primary), ">", 0.0)
    lines += ["", f"Prediction (ExTra's choice above a random cut): **{verdict}**" + (
        f"; the smallest difference these problems detect with probability 0.8: "
        f"{analysis.detectable(float(np.std(primary, ddof=1)), len(primary)):.4f}."
        if len(primary) > 1 else "."), ""]  # fmt: skip
    return "\n".join(lines)


def _response_mte(first: _Drawn, row: int) -> float:
    m = first.mask[row]
    return float(first.entropy[row][m].mean()) if m.any() else np.inf


def _spearman(x: np.ndarray, y: np.ndarray) -> float:
    """Rank correlation; NaN when either side is constant (nothing to rank)."""
    from scipy import stats

    if len(x) < 2 or np.ptp(x) == 0 or np.ptp(y) == 0:
        return float("nan")
    return float(stats.spearmanr(x, y).statistic)


def cell(values) -> str:
    from explore_rl import analysis

    mean, low, high = analysis.bootstrap_interval(list(values))
    return f"{mean:.3f} [{low:.3f}, {high:.3f}]"


if __name__ == "__main__":
    main()
