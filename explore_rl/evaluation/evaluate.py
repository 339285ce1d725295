"""Held-out evaluation: n samples per question, Mean@n, Pass@k for every k <= n, Maj@n.

Per benchmark and averaged over benchmarks; sampling temperature and top-p from the
run spec (0.6 / 0.95 by default, as EDEN and ASE report). `plan_fn` lets explorers that
act at test time (EAD's annealed schedule) edit each batch's plan; default: plain policy.
With `eval.diversity`, also the diversity of each question's correct responses (at least
two of them), averaged over questions: distinct-4, Self-BLEU and LogDet of their
all-MiniLM-L6-v2 embeddings (ExTra's Sec. 5.4 measures).
"""

from __future__ import annotations

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
    """Held-out metrics per benchmark and averaged; with `records`, every response is
    appended to it (benchmark, question, reference, response, extracted answer, correct).
    `stop` is asked before each batch: True raises `Stopped` (a preempted run checkpoints
    within a batch's time, not after the whole evaluation)."""
    e, n = spec.eval, spec.eval.samples
    generation = spec.generation(evaluation=True)
    results: dict[str, float] = {}
    for name, problems in benchmarks.items():
        problems = problems[: e.num_prompts or len(problems)]
        correct, answers, diverse = [], [], []
        batches = range(0, len(problems), e.batch_prompts)
        for start in tqdm(batches, desc=f"eval {name}", leave=False):
            if stop is not None and stop():
                raise Stopped(f"evaluation stopped before {name} question {start}")
            chunk = problems[start : start + e.batch_prompts]
            plan = base_plan(len(chunk) * n, e.sampling.max_new_tokens, e.temperature, chunk)
            plan = plan_fn(plan) if plan_fn else plan
            key = jax.random.fold_in(rng, start)
            r = rollout.generate(params, cfg, tok, plan, key, verifier, **generation)
            correct.append(r.correct)
            answers += [
                [extract_answer(t, spec.reward.extractors) for t in r.texts[i * n : (i + 1) * n]]
                for i in range(len(chunk))
            ]
            if records is not None:
                records += _records(name, chunk, r, answers[start:])
            if e.diversity:
                diverse += diversity_of_correct(r)
        results.update(_benchmark_metrics(name, np.concatenate(correct), answers, diverse, n))
    names = sorted({key.split("/", 2)[2] for key in results})
    for metric in names:
        values = [v for key, v in results.items() if key.endswith("/" + metric)]
        results[f"eval/average/{metric}"] = float(np.mean(values))
    return results


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


def _benchmark_metrics(name: str, correct, answers, diverse: list[dict], n: int) -> dict:
    """Mean@n, Pass@k, Worst@k, Maj@n of one benchmark's [Q, n] correctness, and the
    diversity of its correct responses when measured."""
    out = {f"eval/{name}/mean@{n}": metrics.mean_at_k(correct)}
    out.update({f"eval/{name}/pass@{k}": v for k, v in metrics.pass_at_ks(correct).items()})
    out.update({f"eval/{name}/worst@{k}": v for k, v in metrics.worst_at_ks(correct).items()})
    out[f"eval/{name}/maj@{n}"] = metrics.maj_at_k(answers, correct, n)
    for key in ("distinct4", "self_bleu", "logdet"):
        values = [d[key] for d in diverse if np.isfinite(d[key])]  # NaN: < 4 tokens
        if values:
            out[f"eval/{name}/{key}"] = float(np.mean(values))
    return out


@functools.cache
def _encoder():
    from explore_rl.models import minilm

    return minilm.load()


def diversity_of_correct(r) -> list[dict[str, float]]:
    """Per question of a generation batch with >= 2 correct responses: their distinct-4,
    Self-BLEU and MiniLM LogDet."""
    g = r.group_size
    tokens, mask = np.asarray(r.out.tokens), np.asarray(r.out.mask)
    out = []
    for i in range(len(r.problems)):
        rows = [j for j in range(i * g, (i + 1) * g) if r.correct.reshape(-1)[j]]
        if len(rows) < 2:
            continue
        responses = [tokens[j][mask[j]].tolist() for j in rows]
        out.append(
            {
                "distinct4": metrics.distinct_n(responses),
                "self_bleu": metrics.self_bleu(responses),
                "logdet": metrics.log_det(_encoder().embed([r.texts[j] for j in rows])),
            }
        )
    return out
