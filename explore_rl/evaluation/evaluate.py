"""Held-out evaluation: n samples per question, Mean@n, Pass@k for every k <= n, Maj@n.

Per benchmark and averaged over benchmarks; sampling temperature and top-p from the
run spec (0.6 / 0.95 by default, as EDEN and ASE report). `plan_fn` lets explorers that
act at test time (EAD's annealed schedule) edit each batch's plan; default: plain policy.
With `eval.diversity`, also the diversity of each question's responses, averaged over
questions: distinct-4, Self-BLEU and LogDet of their all-MiniLM-L6-v2 embeddings (ExTra's
Sec. 5.4 measures), over its correct ones, all n, and its first m correct (`measures`),
and the task's distinct solutions (`tasks.SOLUTIONS`: Countdown's expression trees).

With `eval.temperatures` (the matched-temperature frontier), the same questions are also
sampled at each listed temperature: its Mean@n and Pass@k under `eval/<set>/T_<label>/`
(label: the number, or "rollout" for `rollout.temperature`, a fixed-temperature arm at
its own), and `eval/<set>/T_<label>/temperature` the value drawn at, so a record says what
it sampled (`analysis.frontier`). The sweep draws from the plain policy at a fixed T for
every arm: an explorer acting at test time (EAD's schedule, ASE's routes with `at_eval`)
does so in the base evaluation only, so at "temperature T" an EAD arm is its policy at T,
comparable with GRPO's, and its schedule's test-time behaviour is the base evaluation's,
as before. Each temperature draws its own keys (`sweep_key`); the base evaluation's keys,
keys and numbers are those of an evaluation without a sweep.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable

import jax
import numpy as np
from tqdm import tqdm

from explore_rl.answers import extract_answer
from explore_rl.data.tasks import Problem
from explore_rl.evaluation import metrics
from explore_rl.exploration import base as exploration
from explore_rl.rewards.math import Verifier
from explore_rl.rl import rollout
from explore_rl.rl.plan import base_plan
from explore_rl.spec import RunSpec

# the stream `eval.temperatures` draw from: rng folded with it is no base batch's key
# (a batch's is rng folded with its first question's index, far below)
SWEEP_STREAM = 2**31 - 1


class Stopped(Exception):
    """The evaluation was asked to stop (`evaluate`'s `stop`) and has no result."""


def run_keys(seed: int) -> tuple[jax.Array, jax.Array]:
    """A run's two root keys: step s samples with fold_in(first, s), the evaluation after
    step s with fold_in(second, s) (`--mode eval` of a checkpoint draws as the run did)."""
    key, eval_key = jax.random.split(jax.random.key(seed))
    return key, eval_key


def fit_held_out(spec: RunSpec, tok, test_sets: dict[str, list[Problem]]):
    """The benchmarks' problems whose prompts fit `rollout.max_prompt_len`
    (`rollout.fit_prompts`, by `task.long_prompts`), and the longest kept prompt's tokens
    (what sizes an evaluation batch's caches)."""
    fitted = {
        name: rollout.fit_prompts(
            tok, problems, spec.prompt, spec.rollout.max_prompt_len, spec.task.long_prompts, name
        )
        for name, problems in test_sets.items()
    }
    longest = max((n for _, n in fitted.values()), default=0)
    return {name: kept for name, (kept, _) in fitted.items()}, longest


def evaluate_policy(
    params, cfg, tok, spec: RunSpec, benchmarks: dict, verifier: Verifier, rng: jax.Array,
    explorers: list, states: dict, step: int, records: list | None = None, stop=None,
) -> dict[str, float]:  # fmt: skip
    """`evaluate` with the explorers acting at test time (EAD's schedule at step `step`),
    reading their `states`: what a run evaluates between steps, and `--mode eval`."""
    ctx = exploration.StepContext(params, cfg, tok, spec, step, verifier=verifier)
    plan_fn = lambda p: exploration.eval_plan(explorers, states, p, ctx)  # noqa: E731
    return evaluate(params, cfg, tok, benchmarks, spec, verifier, rng, plan_fn, records, stop)


def evaluate(
    params,
    cfg,
    tok,
    benchmarks: dict[str, list[Problem]],
    spec: RunSpec,
    verifier: Verifier,
    rng: jax.Array,
    plan_fn=None,
    records: list | None = None,
    stop: Callable[[], bool] | None = None,
) -> dict[str, float]:
    """Held-out metrics per benchmark and averaged; with `records`, every response of the
    base evaluation is appended to it (benchmark, question, reference, response, extracted
    answer, correct). `stop` is asked before each batch: True raises `Stopped` (a preempted
    run checkpoints within a batch's time, not after the whole evaluation)."""
    e, n = spec.eval, spec.eval.samples
    draw = functools.partial(_draw, params, cfg, tok, spec, verifier, stop=stop)
    results: dict[str, float] = {}
    for name, problems in benchmarks.items():
        problems = problems[: e.num_prompts or len(problems)]
        base = draw(name, problems, e.temperature, rng, plan_fn, records, e.diversity)
        results.update(_benchmark_metrics(name, base, n, e.diversity_correct))
        for i, t in enumerate(e.temperatures):
            swept = draw(f"{name} at T={t.label}", problems, t.value, sweep_key(rng, i))
            prefix = f"eval/{name}/{metrics.SWEEP}{t.label}"
            results.update(_sweep_metrics(prefix, swept, t.value))
    return {**results, **_averages(results)}


def sweep_key(rng: jax.Array, index: int) -> jax.Array:
    """The key the `index`-th entry of `eval.temperatures` draws with (its batches fold
    their offsets into it, as the base evaluation's into `rng`): one stream per entry, so
    two entries at one temperature draw different samples."""
    return jax.random.fold_in(jax.random.fold_in(rng, SWEEP_STREAM), index)


@dataclasses.dataclass
class Drawn:
    """One benchmark's responses at one temperature: [Q, n] correctness, each question's
    extracted answers and, when measured, its diversity (`measures`)."""

    correct: np.ndarray
    answers: list[list]
    measured: list[dict[str, float]]


def _draw(
    params, cfg, tok, spec: RunSpec, verifier: Verifier, what: str, problems: list[Problem],
    temperature: float, rng: jax.Array, plan_fn=None, records: list | None = None,
    measure: bool = False, stop=None,
) -> Drawn:  # fmt: skip
    """n responses to each problem at `temperature`, in batches of `eval.batch_prompts`
    (batch at offset i: key fold_in(rng, i)); `what` names them (the benchmark's name, in
    `records`)."""
    e, n = spec.eval, spec.eval.samples
    generation = spec.generation(evaluation=True)
    solutions = spec.task.solutions if measure else None
    correct, answers, measured = [], [], []
    for start in tqdm(range(0, len(problems), e.batch_prompts), desc=f"eval {what}", leave=False):
        if stop is not None and stop():
            raise Stopped(f"evaluation stopped before {what} question {start}")
        chunk = problems[start : start + e.batch_prompts]
        plan = base_plan(len(chunk) * n, e.sampling.max_new_tokens, temperature, chunk)
        plan = plan_fn(plan) if plan_fn else plan
        key = jax.random.fold_in(rng, start)
        r = rollout.generate(params, cfg, tok, plan, key, verifier, **generation)
        correct.append(r.correct)
        answers += [
            [extract_answer(t, spec.reward.extractors) for t in r.texts[i * n : (i + 1) * n]]
            for i in range(len(chunk))
        ]
        if records is not None:
            records += _records(what, chunk, r, answers[start:])
        if measure:
            measured += measures(r, e.diversity_correct, solutions)
    return Drawn(np.concatenate(correct), answers, measured)


def _records(name: str, chunk: list[Problem], r, answers: list[list]) -> list[dict]:
    """One record per response of a batch: its question, reference, extracted answer."""
    n = r.group_size
    return [
        {
            "benchmark": name,
            "question": p.question,
            "reference": p.answer,
            "response": r.texts[i * n + j],
            "extracted": answers[i][j],
            "correct": bool(r.correct[i, j]),
        }
        for i, p in enumerate(chunk)
        for j in range(n)
    ]


def _benchmark_metrics(name: str, drawn: Drawn, n: int, m: int) -> dict:
    """Mean@n, Pass@k, Worst@k, Maj@n of one benchmark's [Q, n] correctness and, when
    measured, each diversity measure averaged over the questions that have it, with how
    many questions have m correct responses (`covered@<m>correct`)."""
    correct = drawn.correct
    out = {f"eval/{name}/mean@{n}": metrics.mean_at_k(correct)}
    out.update({f"eval/{name}/pass@{k}": v for k, v in metrics.pass_at_ks(correct).items()})
    out.update({f"eval/{name}/worst@{k}": v for k, v in metrics.worst_at_ks(correct).items()})
    out[f"eval/{name}/maj@{n}"] = metrics.maj_at_k(drawn.answers, correct, n)
    if not drawn.measured:
        return out
    for key in dict.fromkeys(k for d in drawn.measured for k in d):  # first seen first
        values = [d[key] for d in drawn.measured if np.isfinite(d.get(key, np.nan))]
        if values:  # distinct-4 is NaN under 4 tokens
            out[f"eval/{name}/{key}"] = float(np.mean(values))
    out[f"eval/{name}/covered@{m}correct"] = float(np.sum(correct.sum(axis=1) >= m))
    return out


def _sweep_metrics(prefix: str, drawn: Drawn, temperature: float) -> dict:
    """A swept temperature's Mean@n and Pass@k (k <= n) under `prefix`, and the value."""
    n = drawn.correct.shape[1]
    out = {f"{prefix}/temperature": temperature}
    out[f"{prefix}/mean@{n}"] = metrics.mean_at_k(drawn.correct)
    out.update({f"{prefix}/pass@{k}": v for k, v in metrics.pass_at_ks(drawn.correct).items()})
    return out


def _averages(results: dict[str, float]) -> dict[str, float]:
    """`eval/average/<metric>`: each metric's mean over the benchmarks that have it."""
    by_metric: dict[str, list[float]] = {}
    for key, value in results.items():
        by_metric.setdefault(key.split("/", 2)[2], []).append(value)
    return {f"eval/average/{m}": float(np.mean(v)) for m, v in sorted(by_metric.items())}


@functools.cache
def _encoder():
    from explore_rl.models import minilm

    return minilm.load()


def measures(r, m: int, solutions=None) -> list[dict[str, float]]:
    """Per question of a generation batch, the diversity (distinct-4, Self-BLEU, MiniLM
    LogDet) of three sets of its n responses, each measure named with the set's suffix:
    - "": its correct responses, when >= 2: how many varies with accuracy, so across arms
      these track it (Self-BLEU and LogDet grow with the set, distinct-4 falls);
    - "@<n>": all n: one count for every question and arm, wrong responses included (the
      policy's spread, not only its solutions');
    - "@<m>correct": its first m correct, when it has m: one count of solutions, over the
      questions that have m (a set that grows with accuracy: `covered@<m>correct` counts
      them; compare arms on it beside the measure).
    With the task's solution key (`solutions`), also its distinct solutions among the
    correct ones of all n (`solutions@<n>`, 0 when none is correct) and of the first m
    correct (`solutions@<m>correct`)."""
    n = r.group_size
    tokens, mask = np.asarray(r.out.tokens), np.asarray(r.out.mask)
    correct = np.asarray(r.correct).reshape(-1, n)
    out = []
    for i in range(len(r.problems)):
        rows = range(i * n, (i + 1) * n)
        texts = [r.texts[j] for j in rows]
        responses = [tokens[j][mask[j]].tolist() for j in rows]
        z = _encoder().embed(texts)
        right = [j for j in range(n) if correct[i, j]]
        sets = {"": right if len(right) >= 2 else [], f"@{n}": list(range(n))}
        sets[f"@{m}correct"] = right[:m] if len(right) >= m else []
        d = {}
        for suffix, chosen in sets.items():
            if chosen:
                d.update({k + suffix: v for k, v in _diversity(responses, z, chosen).items()})
        if solutions is not None:
            d[f"solutions@{n}"] = len({solutions(texts[j]) for j in right})
            if len(right) >= m:
                d[f"solutions@{m}correct"] = len({solutions(texts[j]) for j in right[:m]})
        out.append(d)
    return out


def _diversity(responses: list[list[int]], z: np.ndarray, chosen: list[int]) -> dict:
    """Distinct-4, Self-BLEU and LogDet of the `chosen` responses (token ids; z: the
    embeddings of all of them)."""
    picked = [responses[j] for j in chosen]
    return {
        "distinct4": metrics.distinct_n(picked),
        "self_bleu": metrics.self_bleu(picked),
        "logdet": metrics.log_det(z[chosen]),
    }
