"""How exploration methods plug into the trainer: the Explorer protocol and its registry.

An explorer acts at three points of a step:

- `plan`: before sampling, it edits the `RolloutPlan` (`rl/plan.py`) of the batch: the
  per-row, per-position temperature table (a product of factors: the config's base
  temperature x each explorer's), the `Interventions` (appended embeddings, steering), the
  rows' steering routes, the problems themselves (replacement prompts with their own
  reference answers, response prefixes), and `info`, its own per-row [B] or per-group [Q]
  arrays that it reads back in `shape_advantages`.
- `rewards`: after the verifier, it may change the rewards the advantage estimator sees
  (an intrinsic bonus before normalisation).
- `shape_advantages`: after rewards and the base advantages, it returns new advantages, per-row loss
  weights (0 drops a row from the update), its new state and metrics.

Explorers run in the order of `config.exploration.methods`, each seeing the plan and the
advantages the previous one left. Two that would both set the same `Interventions` field,
or both replace prompts, are a config error. Explorer state (e.g. EDEN's anchor bank) is a
pytree of arrays, checkpointed and resumed with the train state; data that is not a
fixed-shape array (per-problem memories keyed by `Problem.id`, queues of guided prompts)
goes in a `hoststate.HostState` inside it, saved as JSON with the same checkpoint.

A new method is one module that subclasses `Explorer` and decorates it with
`@register("name")`; `get("name")` imports `explore_rl.exploration.<name>` on first use, so
nothing else changes. Its settings are a frozen dataclass, `Explorer.Spec`, whose
defaults (each field commented) are its config section `config.exploration.<name>`
(`defaults()`); the explorer gets them typed (`self.settings`) with the run's spec
(`self.spec`, `spec.RunSpec`).

Dimension letters: Q problems, G rollouts per problem, B = Q x G rows, T response tokens.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from ml_collections import ConfigDict

from explore_rl.registry import Registry
from explore_rl.rl.plan import RolloutPlan
from explore_rl.spec import RunSpec

REGISTRY = Registry("exploration.methods", package="explore_rl.exploration")


@dataclasses.dataclass
class StepContext:
    """What an explorer may read at a step: the policy that samples (pi_old), its model
    config and tokenizer, the run's spec, the global step; for building state (EDEN's
    screen), the training problems, the verifier and the run directory."""

    params: Any
    cfg: Any  # ModelConfig
    tok: Any  # Tokenizer
    spec: RunSpec
    step: int
    train_set: Sequence = ()  # a list, or the run's `data.sharded.Problems`
    verifier: Any = None  # rewards.math.Verifier
    workdir: str | None = None


@dataclasses.dataclass
class Shaped:
    advantages: np.ndarray  # [B]
    weights: np.ndarray  # [B] loss weights; 0 drops the row
    state: Any
    metrics: dict[str, float]


@dataclasses.dataclass(frozen=True)
class NoSpec:
    """A method with nothing to set."""


class Explorer:
    """Base class: every hook defaults to "change nothing"."""

    name = ""
    intervenes: tuple[str, ...] = ()  # Interventions fields this method sets
    replaces_prompts = False
    Spec: type = NoSpec  # a frozen dataclass, every field's default commented

    def __init__(self, settings, spec: RunSpec):
        self.settings = settings
        self.spec = spec

    @classmethod
    def defaults(cls) -> ConfigDict:
        """The method's config section: its `Spec`'s defaults."""
        return ConfigDict(dataclasses.asdict(cls.Spec()))

    @staticmethod
    def check(settings, spec: RunSpec) -> None:
        """Raise ValueError("config: ...") on settings this method cannot run with (in
        the run of spec `spec`); checked once, when the spec is resolved."""

    def init(self, ctx: StepContext) -> Any:
        """State before the first step (a pytree of arrays)."""
        return {}

    def template(self, ctx: StepContext) -> Any:
        """A state of the right structure and shapes to restore a checkpoint into; cheap
        (a resume must not rebuild what the checkpoint holds)."""
        return self.init(ctx)

    def plan(self, state, plan: RolloutPlan, ctx: StepContext, rng: jax.Array) -> RolloutPlan:
        return plan

    def eval_plan(self, state, plan: RolloutPlan, ctx: StepContext) -> RolloutPlan:
        """The plan at evaluation time (default: evaluate the plain policy)."""
        return plan

    def rewards(self, state, rollouts, rewards: np.ndarray, ctx: StepContext) -> np.ndarray:
        """The [Q, G] rewards the advantage estimator sees (default: the verifier's); e.g.
        an intrinsic bonus added before GRPO's normalisation."""
        return rewards

    def shape_advantages(self, state, rollouts, advantages, weights, ctx: StepContext) -> Shaped:
        return Shaped(advantages, weights, state, {})

    def step_sizes(self, sizes):
        """The step's sizes with this method on (`rl.footprint.StepSizes`), at their
        largest, for the memory estimate made at start: more prompt rows to prefill, longer
        prompts. Default: unchanged."""
        return sizes


def register(name: str):
    def wrap(cls):
        cls.name = name
        return REGISTRY.register(name)(cls)

    return wrap


def get(name: str) -> type[Explorer]:
    """The method `name` of `exploration.methods`: a registered name, or `module:Class`
    for one defined outside the package (registered there under its own name)."""
    cls = REGISTRY.get(name)
    if not (isinstance(cls, type) and issubclass(cls, Explorer) and cls.name):
        raise ValueError(
            f"config: exploration.methods {name!r} is not an Explorer subclass decorated "
            "with @register('<name>')"
        )
    return cls


def check(spec: RunSpec) -> None:
    """Each method's settings checked, and no two methods in conflict."""
    owners = {}
    for name, settings in spec.methods:
        cls = get(name)
        cls.check(settings, spec)
        for claim in [*cls.intervenes, *(["prompts"] if cls.replaces_prompts else [])]:
            if claim in owners:
                raise ValueError(
                    f"config: exploration.methods {owners[claim]!r} and {name!r} both set "
                    f"{claim}: use one of them"
                )
            owners[claim] = name


def build(spec: RunSpec) -> list[Explorer]:
    """The run's explorers, in order (their settings checked by `check`)."""
    return [get(name)(settings, spec) for name, settings in spec.methods]


def plan(explorers, states: dict, p: RolloutPlan, ctx: StepContext, rng) -> RolloutPlan:
    for i, ex in enumerate(explorers):
        p = ex.plan(states[ex.name], p, ctx, jax.random.fold_in(rng, i))
    return p


def eval_plan(explorers, states: dict, p: RolloutPlan, ctx: StepContext) -> RolloutPlan:
    for ex in explorers:
        p = ex.eval_plan(states[ex.name], p, ctx)
    return p


def rewards(explorers, states: dict, rollouts, r: np.ndarray, ctx: StepContext) -> np.ndarray:
    """The rewards for the advantage estimator after every explorer in turn."""
    for ex in explorers:
        r = ex.rewards(states[ex.name], rollouts, r, ctx)
    return r


def step_sizes(explorers, sizes):
    """The step's sizes after every explorer in turn (`Explorer.step_sizes`)."""
    for ex in explorers:
        sizes = ex.step_sizes(sizes)
    return sizes


def shape_advantages(explorers, states: dict, rollouts, advantages, weights, ctx: StepContext):
    """(advantages, weights, new states, metrics) after every explorer in turn."""
    states, metrics = dict(states), {}
    for ex in explorers:
        s = ex.shape_advantages(states[ex.name], rollouts, advantages, weights, ctx)
        advantages, weights, states[ex.name] = s.advantages, s.weights, s.state
        metrics.update({f"{ex.name}/{k}": v for k, v in s.metrics.items()})
    return advantages, weights, states, metrics
