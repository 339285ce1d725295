"""How one generation batch is drawn: the per-row plan that generation, evaluation,
the explorers and the analysis tools share.

A plan is built by `base_plan` (the config's temperature, the batch's problems), edited by
the explorers in turn (`exploration.base.plan`), and read by `rollout.generate`, which
draws the rows, and by the trainer, which checks whether the sampler's mu is pi_old.

Dimension letters: Q problems, G rollouts per problem, B = Q x G rows, T response tokens.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct
from jaxtyping import Array, Float, Int

from explore_rl.models.transformer import Interventions


@struct.dataclass
class RolloutPlan:
    """How one generation batch is drawn; rows grouped by problem (row b: problem b // G)."""

    temperature: Float[Array, "B T"]
    interventions: Interventions | None = None
    info: dict[str, Any] = dataclasses.field(default_factory=dict)  # {explorer: arrays}
    # Per-row steering route (any ints; None: one route). Rows of a problem with the same
    # route share one prefill, so they must carry the same steering vector; routes may be
    # laid out freely inside a group.
    route: Int[Array, " B"] | None = None
    # the batch's Q problems (an explorer may replace them); None once sampled
    problems: list | None = struct.field(pytree_node=False, default=None)

    def is_drawn_at(self, temperature: float) -> bool:
        """Whether every row is drawn from the plain policy at `temperature` (then, with no
        truncation, the sampler's mu is the policy at that temperature)."""
        return self.interventions is None and bool(jnp.all(self.temperature == temperature))

    def rows(self, group: int, group_size: int) -> RolloutPlan:
        """The plan of one group: per-row leaves sliced to its G rows, per-group to one."""
        q = self.temperature.shape[0] // group_size

        def take(x):
            if np.ndim(x) and x.shape[0] == q * group_size:
                return x[group * group_size : (group + 1) * group_size]
            if np.ndim(x) and x.shape[0] == q:
                return x[group : group + 1]
            raise ValueError(f"plan arrays are per row [B, ...] or per group [Q, ...]: {x.shape}")

        return jax.tree.map(take, self.replace(problems=None))


def base_plan(rows: int, length: int, temperature: float, problems: list) -> RolloutPlan:
    return RolloutPlan(jnp.full((rows, length), temperature, jnp.float32), problems=problems)
