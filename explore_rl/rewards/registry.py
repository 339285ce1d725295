"""Rewards by name (`reward.name`), or a user's own function (`reward.fn`).

A reward is `f(response: str, problem: Problem) -> float`, called in the verifier's worker
processes under the per-item timeout (`reward.timeout`): an item over time scores 0 and is
counted, one that raises scores 0. A positive reward counts as correct (accuracy, Pass@k,
DAPO's filter). Named rewards are built from the config's `reward` section:

    @register("math")
    def _math(section):          # -> a picklable f(response, problem)
        return functools.partial(math_reward, extractors=...)

A user's function is given as `reward.fn = "package.module:function"`: it must be
importable by that name (the workers import it), take (response, problem) and return a
float. It replaces `reward.name`.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import traceback
from collections.abc import Callable

from explore_rl.registry import Registry
from explore_rl.rewards import math as math_rewards

Reward = Callable[[str, object], float]
# `reward.name` -> a builder `reward section -> reward`
REWARDS = Registry("reward.name")
register = REWARDS.register


def extractors(section) -> tuple[str, ...]:
    return tuple(e.strip() for e in section.extractors.split(",") if e.strip())


@register("math")
def _math(section) -> Reward:
    """1 when the extracted final answer equals the problem's reference answer (math.py)."""
    return functools.partial(math_rewards.math_reward, extractors=extractors(section))


def load_function(spec: str) -> Reward:
    """The function `module.path:name`; a config error naming what is missing."""
    module_name, _, name = spec.partition(":")
    if not module_name or not name:
        raise ValueError(f"config: reward.fn={spec!r}: give 'module.path:function'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ValueError(f"config: reward.fn={spec!r}: cannot import {module_name} ({e})") from None
    except SyntaxError as e:
        raise ValueError(f"config: reward.fn={spec!r}: {e.filename}:{e.lineno}: {e.msg}") from None
    except Exception as e:  # the module's own code failed as it was imported: where it did
        origin = importlib.util.find_spec(module_name).origin
        frames = traceback.extract_tb(e.__traceback__)
        frame = next((f for f in reversed(frames) if f.filename == origin), frames[-1])
        raise ValueError(
            f"config: reward.fn={spec!r}: importing {module_name} raised "
            f"{type(e).__name__}: {e} ({frame.filename}:{frame.lineno})"
        ) from None
    fn = getattr(module, name, None)
    if not callable(fn):
        raise ValueError(f"config: reward.fn={spec!r}: {module_name} has no function {name!r}")
    return fn


def build(section) -> Reward:
    """The run's reward: `reward.fn` when set, else the registered `reward.name`."""
    if section.fn:
        return load_function(section.fn)
    return REWARDS.get(section.name)(section)
