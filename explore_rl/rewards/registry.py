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
    reward.fn = "path/to/my_reward.py:compute_score"      # a file (verl's custom path)
    reward.name = "data_source"                           # verl's default, by data_source

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
import importlib.util
import inspect
import math
import os
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


# The data sources verl's `default_compute_score` (verl/utils/reward_score/__init__.py)
# scores as math, and where its scorer reads the answer: GSM8K after "####" (gsm8k.py,
# strict), the others in the last \boxed{} (math_reward.py, math_dapo.py, prime_math).
VERL_MATH_SOURCES = {
    "openai/gsm8k": ("hash",),
    "lighteval/MATH": ("boxed",),
    "DigitalLearningGmbH/MATH-lighteval": ("boxed",),
    "HuggingFaceH4/MATH-500": ("boxed",),
}
VERL_MATH_PREFIXES = ("math_dapo", "aime", "numina_")  # the same, by the name's start


def by_data_source(response: str, problem) -> float:
    """verl's `default_compute_score` dispatch on a row's `data_source`: a source verl
    scores as math is scored by this project's math equivalence, its answer read where
    verl's scorer reads it (`VERL_MATH_SOURCES`: 1 or 0, where verl's math_dapo gives -1
    for a wrong answer); another source raises, as verl's NotImplementedError (the
    response scores 0 and is counted in `rollout/reward_errors`): score it with a verl
    function of your own (`reward.fn=path/to/file.py:compute_score`)."""
    source = str(problem.columns.get("data_source", ""))
    how = VERL_MATH_SOURCES.get(source) or (
        ("boxed",) if source.startswith(VERL_MATH_PREFIXES) else None
    )
    if how is None:
        raise NotImplementedError(f"no reward for data_source={source!r}")
    return math_rewards.math_reward(response, problem, how)


@register("data_source")
def _data_source(section):
    """verl's default reward: by each row's `data_source` (`by_data_source`)."""
    return by_data_source


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


@dataclasses.dataclass(frozen=True)
class FromFile:
    """The function `name` of the Python file `path` (verl's `custom_reward_function.path`
    and `.name`): picklable by its path, so each spawned reward worker loads the file
    itself, once; called and inspected as the function is."""

    path: str
    name: str

    @property
    def fn(self) -> Callable:
        return getattr(_file_module(self.path), self.name)

    def __call__(self, *args, **kwargs):
        return self.fn(*args, **kwargs)

    @property
    def __signature__(self) -> inspect.Signature:  # how it is called: the function's
        return inspect.signature(self.fn)


@functools.cache
def _file_module(path: str):
    """The Python file `path` run as a module, once a process (as verl loads its
    `custom_reward_function.path`)."""
    module_spec = importlib.util.spec_from_file_location(f"_reward_file_{abs(hash(path))}", path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module


def from_file(entry: str, said: str) -> FromFile:
    """`path/to/file.py[:function]` as a reward function (verl's default name,
    `compute_score`, when none is given); a config error naming what is missing."""
    path, _, name = entry.rpartition(".py")
    path, name = os.path.abspath(path + ".py"), name.lstrip(":") or "compute_score"
    if not os.path.isfile(path):
        raise ValueError(f"{said}: no such file {path}")
    try:
        module = _file_module(path)
    except Exception as e:  # the file's own code failed as it ran
        raise ValueError(f"{said}: running {path} raised {type(e).__name__}: {e}") from None
    if not hasattr(module, name):
        raise ValueError(f"{said}: {path} has no {name!r}")
    if not callable(getattr(module, name)):
        raise ValueError(f"{said}: not a function")
    return FromFile(path, name)


def _function(entry: str, section, weight: float) -> Function:
    """`entry` of `reward.fn` (a registered name, "module:function" or
    "path/to/file.py[:function]"), or `reward.name` when `reward.fn` is empty, as a run's
    reward function."""
    said = f"config: reward.fn={entry!r}"
    if entry.endswith(".py") or ".py:" in entry:
        fn = from_file(entry, said)
        return Function(fn.name, fn, calling_of(fn, said), weight)
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
