"""Rewards by name (`reward.name`), or a user's own function (`reward.fn`).

A reward is `f(response: str, problem: Problem) -> float`, called in the verifier's worker
processes under the per-item timeout (`reward.timeout`): an item over time scores 0 and is
counted, one that raises scores 0. A positive reward counts as correct (accuracy, Pass@k,
DAPO's filter). Named rewards are built from the config's `reward` section:

    @register("math")
    def _math(section):          # -> a picklable f(response, problem)
        return functools.partial(math_reward, extractors=...)

A reward of its own module, `explore_rl/rewards/<name>.py`, is imported on first use (a
task's reward: `countdown`). A user's function is given as
`reward.fn = "package.module:function"`: it must be importable by that name (the workers
import it), take (response, problem) and return a float. It replaces `reward.name`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from explore_rl.registry import Registry, load
from explore_rl.rewards import math as math_rewards

Reward = Callable[[str, object], float]
# `reward.name` -> a builder `reward section -> reward`
REWARDS = Registry("reward.name", package="explore_rl.rewards")
register = REWARDS.register


def extractors(section) -> tuple[str, ...]:
    return tuple(e.strip() for e in section.extractors.split(",") if e.strip())


@register("math")
def _math(section) -> Reward:
    """1 when the extracted final answer equals the problem's reference answer (math.py)."""
    return functools.partial(math_rewards.math_reward, extractors=extractors(section))


def load_function(spec: str) -> Reward:
    """The function `module.path:name`; a config error naming what is missing."""
    fn = load(spec, "reward.fn")
    if not callable(fn):
        raise ValueError(f"config: reward.fn={spec!r}: not a function")
    return fn


def build(section) -> Reward:
    """The run's reward: `reward.fn` when set, else the registered `reward.name`."""
    if section.fn:
        return load_function(section.fn)
    return REWARDS.get(section.name)(section)
