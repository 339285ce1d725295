"""A run's reward: registered rewards by name, a user's own functions, several with weights.

`reward.fn` lists the run's reward functions, each a registered name or
"package.module:function" (importable by that name: the workers import it), and
`reward.weights` their weights (default 1 each); a response's reward is the weighted sum
(a function's missing reward, TRL's None, adds nothing), and the **first** function's
reward > 0 is what counts as correct (accuracy, the held-out Pass@k, which evaluation
scores with that function alone, and the methods' gates: ExTra's novelty, ASE's
contrasts); DAPO's filter and the advantages use the sum. Empty `reward.fn` is
`reward.name` alone. Each function's mean is logged as `reward/<name>/mean` (TRL's
`rewards/<name>/mean`).

    reward.fn = "my.module:score"                         # your own
    reward.fn = "math, my.module:brevity"; reward.weights = "1, 0.1"

A function is called the way its parameters say, so a verl or TRL reward works as written:
- ours, `f(response, problem) -> float`, per response; `problem.columns` is its dataset
  row (verl's `data_source`, `extra_info`; every column of a JSONL or Parquet file);
- verl's `compute_score(data_source, solution_str, ground_truth, extra_info=None)` (a
  parameter named `solution_str`), per response: the row's `data_source`,
  `reward_model.ground_truth` (else the problem's answer) and `extra_info`; a float, or a
  dict whose "score" is the reward (verl's `NaiveRewardManager`);
- TRL's `f(prompts, completions, **kwargs) -> list[float | None]` (a parameter named
  `completions`), batched: one call per verifier worker on its share of the batch, every
  dataset column passed as a keyword list (a task generated in code: `question`,
  `answer`); a chat prompt comes as messages and its completion as
  `[{"role": "assistant", "content": ...}]` (TRL's conversational format).

Every call runs in the verifier's worker processes under its timeout (`reward.timeout` per
response; a batched call gets it times its responses): over time or raising scores 0 and
is counted. Named rewards are built from the config's `reward` section:

    @register("math")
    def _math(section):          # -> a picklable f(response, problem)
        return functools.partial(math_reward, extractors=...)

A reward of its own module, `explore_rl/rewards/<name>.py`, is imported on first use (a
task's reward: `countdown`).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import math
import pickle
from collections.abc import Callable, Sequence

import numpy as np

from explore_rl.registry import Registry, load
from explore_rl.rewards import math as math_rewards

# `reward.name` -> a builder `reward section -> f(response, problem) -> float`
REWARDS = Registry("reward.name", package="explore_rl.rewards")
register = REWARDS.register


def extractors(section) -> tuple[str, ...]:
    return tuple(_entries(section.extractors))


@register("math")
def _math(section):
    """1 when the extracted final answer equals the problem's reference answer (math.py)."""
    return functools.partial(math_rewards.math_reward, extractors=extractors(section))


def _accepted(fn, kwargs: dict) -> dict:
    """The keyword arguments `fn` takes (all of them when it takes **kwargs)."""
    params = inspect.signature(fn).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return kwargs
    return {k: v for k, v in kwargs.items() if k in params}


def call_verl(fn, response: str, problem) -> float:
    """verl's `compute_score(data_source, solution_str, ground_truth, extra_info)` on one
    response (verl.workers.reward_manager.NaiveRewardManager)."""
    row = problem.columns
    truth = row.get("reward_model")
    truth = truth.get("ground_truth", problem.answer) if isinstance(truth, dict) else None
    kwargs = {
        "data_source": row.get("data_source", ""),
        "solution_str": response,
        "ground_truth": problem.answer if truth is None else truth,
        "extra_info": row.get("extra_info"),
    }
    out = fn(**_accepted(fn, kwargs))
    return out["score"] if isinstance(out, dict) else out


def call_trl(fn, items: list) -> list[float]:
    """TRL's `f(prompts, completions, **columns)` on a list of (response, problem) pairs
    (trl.GRPOTrainer's reward functions: columns as keyword lists, None for no reward)."""
    problems = [p for _, p in items]
    rows = [p.columns or {"question": p.question, "answer": p.answer} for p in problems]
    names = dict.fromkeys(k for row in rows for k in row if k not in ("prompt", "completion"))
    kwargs = {k: [row.get(k) for row in rows] for k in names}
    kwargs["prompts"] = [
        [{"role": r, "content": c} for r, c in p.messages] if p.messages else p.question
        for p in problems
    ]
    kwargs["completions"] = [
        [{"role": "assistant", "content": t}] if p.messages else t for t, p in items
    ]
    return [math.nan if x is None else x for x in fn(**_accepted(fn, kwargs))]


def calling_of(fn, said: str) -> str:
    """How `fn` is called ("ours", "verl" or "trl"), read from its parameters; a config
    error when it fits none."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # a builtin without a signature: ours, as written
        return "ours"
    params = signature.parameters
    if "completions" in params:
        unsupplied = [
            n for n in ("completion_ids", "trainer_state")
            if n in params and params[n].default is inspect.Parameter.empty
        ]  # fmt: skip
        if unsupplied:
            raise ValueError(
                f"{said}: needs {', '.join(unsupplied)}, which this project does not pass "
                "(it passes prompts, completions and the data's columns)"
            )
        return "trl"
    if "solution_str" in params:
        return "verl"
    try:
        signature.bind("response", "problem")
    except TypeError:
        raise ValueError(
            f"{said}: takes ({', '.join(params)}): give f(response, problem), verl's "
            "compute_score(data_source, solution_str, ground_truth, extra_info) or TRL's "
            "f(prompts, completions, **kwargs)"
        ) from None
    return "ours"


@dataclasses.dataclass(frozen=True)
class Function:
    """One of a run's reward functions: its name (logged as `reward/<name>/mean`), the
    function, how it is called ("ours", "verl" or "trl") and its weight."""

    name: str
    fn: Callable
    calling: str = "ours"
    weight: float = 1.0

    def addend(self, rewards: np.ndarray) -> np.ndarray:
        """What its rewards add to the sum: weighted; TRL's None (NaN here) adds nothing,
        as in TRL's nansum, while a NaN of ours or verl's is a broken reward and stays NaN
        (the update skips it and counts it)."""
        return self.weight * (np.nan_to_num(rewards, nan=0.0) if self.calling == "trl" else rewards)

    def score(self, verifier: math_rewards.Verifier, items: list) -> math_rewards.Scores:
        """Its rewards of (response, problem) pairs, in the verifier's workers."""
        if self.calling == "trl":
            return verifier.score(items, functools.partial(call_trl, self.fn), batched=True)
        fn = functools.partial(call_verl, self.fn) if self.calling == "verl" else self.fn
        return verifier.score(items, fn)


@dataclasses.dataclass(frozen=True)
class Scored:
    total: np.ndarray  # [n] the weighted sum
    correct: np.ndarray  # [n] bool: the first function's reward > 0
    by_function: dict[str, np.ndarray]  # [n] each function's own rewards (NaN: none given)
    timeouts: int  # responses over time, summed over the functions
    errors: int  # responses whose function raised, summed over the functions


@dataclasses.dataclass(frozen=True)
class Reward:
    """A run's reward functions, summed with their weights."""

    functions: tuple[Function, ...]

    @classmethod
    def of(cls, fn: Callable) -> Reward:
        """One function of ours (`f(response, problem)`), as a run's whole reward."""
        return cls((Function(getattr(fn, "__name__", "reward"), fn),))

    def score(self, verifier: math_rewards.Verifier, items: list) -> Scored:
        by_function, timeouts, errors = {}, 0, 0
        for f in self.functions:
            s = f.score(verifier, items)
            by_function[f.name] = np.asarray(s.rewards, np.float32)
            timeouts, errors = timeouts + s.timeouts, errors + s.errors
        weighted = [f.addend(by_function[f.name]) for f in self.functions]
        first = by_function[self.functions[0].name]
        total = np.sum(np.stack(weighted), axis=0).astype(np.float32)
        return Scored(total, np.nan_to_num(first) > 0, by_function, timeouts, errors)

    def describe(self) -> str:
        """One line: each function with its weight and how it is called."""
        return ", ".join(
            f"{f.weight:g} x {f.name}" + ("" if f.calling == "ours" else f" ({f.calling})")
            for f in self.functions
        )


def _entries(text: str) -> list[str]:
    return [e.strip() for e in text.split(",") if e.strip()]


def _function(entry: str, section, weight: float) -> Function:
    """`entry` of `reward.fn` (a registered name or "module:function"), or `reward.name`
    when `reward.fn` is empty, as a run's reward function."""
    said = f"config: reward.fn={entry!r}"
    if ":" in entry:
        fn = load(entry, "reward.fn")
        if not callable(fn):
            raise ValueError(f"{said}: not a function")
        _check_sendable(fn, said)
        return Function(entry.rpartition(":")[2], fn, calling_of(fn, said), weight)
    if section.fn and entry not in REWARDS.known():
        raise ValueError(f"{said}: give 'module.path:name' or a reward of {REWARDS.known()}")
    fn = REWARDS.get(entry)(section)
    return Function(entry, fn, calling_of(fn, said), weight)


def _check_sendable(fn: Callable, said: str) -> None:
    """The reward workers receive a function pickled (by its module and name): one that
    does not pickle (a lambda, a function defined inside another) is refused now, before
    the model loads, not at the first scoring."""
    try:
        pickle.dumps(fn)
    except Exception as e:  # noqa: BLE001 - pickle raises several types
        raise ValueError(
            f"{said}: cannot be sent to the reward workers ({type(e).__name__}: "
            f"{str(e).splitlines()[0] if str(e) else ''}): define it with `def` at the top "
            "level of its module"
        ) from None


def weights(section, count: int) -> list[float]:
    """`reward.weights` as `count` numbers (empty: 1 each); a config error otherwise."""
    text = _entries(section.weights)
    if not text:
        return [1.0] * count
    try:
        values = [float(w) for w in text]
    except ValueError:
        raise ValueError(f"config: reward.weights={section.weights!r}: not numbers") from None
    if len(values) != count or not all(map(math.isfinite, values)):
        raise ValueError(
            f"config: reward.weights={section.weights!r}: give {count} finite numbers, one "
            "per function of reward.fn"
        )
    return values


def build(section) -> Reward:
    """The run's reward: the functions of `reward.fn` when set, else `reward.name`."""
    entries: Sequence[str] = _entries(section.fn) or [section.name]
    functions = [_function(e, section, w) for e, w in zip(entries, weights(section, len(entries)))]
    names = [f.name for f in functions]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ValueError(
            f"config: reward.fn={section.fn!r}: two functions are named {twice[0]!r} (each "
            "is logged under its name)"
        )
    return Reward(tuple(functions))
