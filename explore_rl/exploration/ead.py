"""EAD: exploratory annealed decoding (EAD paper).

Each response is sampled hot at first and cooler later: the t-th token of a rollout at
global step s is drawn at temperature

    tau_t = 1                                        for t < c
    tau_t = max(1 + tau_max - exp(t / (k d_s)), tau_min)   otherwise,  d_s = min(d0 + 5 s, 40000)

(the paper's Eq. for the annealed temperature with its global-step-aware decay rate;
`sampling.schedules.ead`). Indexing follows the paper: t counts response tokens from 1, so
with c = 10 the first 9 tokens are at 1.0 and the 10th is the first annealed one
(`first_token = 0` counts from 0 instead: 10 tokens at 1.0, e^0 at the first); s counts
training steps from 1, as the papers' framework (verl) numbers them, so the first rollout
uses d_1 = d0 + 5 and an evaluation after N steps the schedule of step N + 1. The paper
has k = 1; the authors' public code has k = 20, which cools 20x more slowly: `convention`
names both, `k` overrides. The table multiplies the
plan's temperature (the config's base, 1.0 in the paper), so EAD composes with other
explorers' per-row factors (EDEN's warm-up).

The sampler records mu, the log-prob of each sampled token under the annealed (and top-p /
top-k truncated) distribution it really drew from; pi_old is the clean policy at
temperature 1, so the trainer recomputes it, and the update weighs each token by the
truncated importance weight w_t = min(c_IS, pi_old(y_t) / mu(y_t)), c_IS = 2 (`rl.tis_cap`,
set by configs/ead.py). Per token with cap 2 is our convention: the paper's App. B.2 writes
one sequence-level ratio, min(pi_old(y | x) / pi_EAD(y | x), epsilon), and states no cap. A
sequence ratio is the product of the response's per-token ratios; App. B.1 shows each
token's variance factor is smallest at tau = 1 and grows away from it, and over hundreds or
thousands of annealed tokens the product is far from 1 for nearly every response, so
truncated it either silences the response or is the cap. Per-token weights capped at 2 are
the TIS the paper cites (Yao et al. 2025, as verl applies it) and ASE's (ASE paper, Eq. 9);
`rl.tis_level = "row_mean"` gives every token of a row the row's mean weight instead. With
`at_eval` the same schedule is used when evaluating (the paper's test-time Maj@N); leave
`eval.temperature` at 1.0 for the paper's setting, since the table multiplies it. The
sweep of `eval.temperatures` draws the policy at each fixed T, without the schedule, so an
EAD arm's Pass@k at T is comparable with GRPO's (evaluation/evaluate.py). `levels` is a
control, not the paper's: every token of the s-th step's rollouts at levels[s - 1] (say,
EAD's own realised mean temperature at that step), so that beside EAD, with the same TIS
and the same level as training goes on, only the schedule's shape along the response
differs.

    python -m explore_rl.main --config configs/ead.py:demo --workdir runs/ead
"""

from __future__ import annotations

import dataclasses
import math
import warnings

import jax.numpy as jnp

from explore_rl.exploration.base import Explorer, StepContext, register
from explore_rl.rl.plan import RolloutPlan
from explore_rl.sampling import schedules
from explore_rl.spec import RunSpec

K_CONVENTIONS = {"paper": 1.0, "code": 20.0}


@register("ead")
class EAD(Explorer):
    @dataclasses.dataclass(frozen=True)
    class Spec:
        tau_max: float = 1.2  # temperature at t = 0 of the annealed part (1 + tau_max - e^0)
        tau_min: float = 0.1  # floor: 0.1 for 1B/1.5B models, 0.8 for 7B (EAD paper)
        d0: float = 25.0  # initial decay scale d_0; d_s = min(d0 + 5 s, 40000)
        c: int = 10  # tokens t < c at temperature 1; 10: EAD paper, Fig. 3's illustration
        first_token: int = 1  # t of the first response token: 1 (the paper) | 0 (zero-based)
        convention: str = "paper"  # paper: k = 1 | code: k = 20 (the authors' public code)
        k: float = 0.0  # explicit k; 0 = from `convention`
        at_eval: bool = False  # also anneal when evaluating (test-time EAD, Maj@N)
        # non-empty: no schedule, every token of the rollouts of (0-based) step index s at
        # levels[s] (the last one after its end): a control for the shape, not the paper's
        levels: tuple[float, ...] = ()

    @property
    def k(self) -> float:
        return self.settings.k or K_CONVENTIONS[self.settings.convention]

    @staticmethod
    def check(e: Spec, spec: RunSpec) -> None:
        if e.convention not in K_CONVENTIONS:
            raise ValueError(
                f"config: exploration.ead.convention={e.convention!r}: allowed "
                f"{sorted(K_CONVENTIONS)}"
            )
        if not 0 < e.tau_min <= e.tau_max:
            raise ValueError(
                f"config: exploration.ead.tau_min={e.tau_min} must be in (0, tau_max={e.tau_max}]"
            )
        if e.d0 <= 0 or e.k < 0 or e.c < 0 or e.first_token not in (0, 1):
            raise ValueError(
                "config: exploration.ead needs d0 > 0, k >= 0, c >= 0 and first_token 0 or 1"
            )
        # a temperature of 0 would be greedy, silently; a bool is not a level
        bad = [
            x for x in e.levels
            if isinstance(x, bool) or not isinstance(x, (int, float)) or not 0 < x < math.inf
        ]  # fmt: skip
        if bad:
            raise ValueError(
                f"config: exploration.ead.levels: every level must be a finite number above "
                f"0 (found {bad[0]!r})"
            )
        if not spec.loss.tis_cap:
            # a warning, not an error: EAD without TIS is one of the paper's own ablations
            warnings.warn(
                "EAD without TIS (rl.tis_cap=0): the paper corrects with TIS (ours: c_IS = 2)",
                stacklevel=2,
            )

    def table(self, length: int, step: int):
        """The schedule of the rollouts drawn at (0-based) step index `step`."""
        e = self.settings
        s = step + 1  # the paper's global step: the first training step is s = 1 (verl)
        if e.levels:
            level = jnp.asarray(e.levels, jnp.float32)[jnp.minimum(step, len(e.levels) - 1)]
            return level * jnp.ones((length,), jnp.float32)
        return schedules.ead(length, s, e.tau_max, e.tau_min, e.d0, self.k, e.c, e.first_token)

    def _anneal(self, plan: RolloutPlan, step: int) -> RolloutPlan:
        tau = plan.temperature * self.table(plan.temperature.shape[1], step)[None, :]
        return plan.replace(temperature=tau)

    def plan(self, state, plan, ctx: StepContext, rng):
        return self._anneal(plan, ctx.step)

    def eval_plan(self, state, plan, ctx: StepContext):
        return self._anneal(plan, ctx.step) if self.settings.at_eval else plan
