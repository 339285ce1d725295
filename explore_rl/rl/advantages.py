"""Advantage estimators over groups of rollouts, registered by name.

Rewards come as [P, G]: P prompts, G rollouts each. Every estimator returns [P, G]
advantages, one per rollout (broadcast over its tokens by the loss). A group whose rewards
are all equal gets advantage 0 (finite, never NaN).

    advantages = ADVANTAGES[config.rl.advantage](rewards)
"""

from __future__ import annotations

from collections.abc import Callable

import jax.numpy as jnp
from jaxtyping import Array, Float

from explore_rl.registry import Registry

Estimator = Callable[[Float[Array, "P G"]], Float[Array, "P G"]]
ADVANTAGES = Registry("rl.advantage")
register = ADVANTAGES.register
EPS = 1e-6


def _std(x: Array, axis=None) -> Array:
    # Unbiased (n - 1), as torch.std in TRL and verl, so numbers compare across codebases.
    return jnp.std(x, axis=axis, ddof=1, keepdims=axis is not None)


@register("grpo")
def grpo(rewards: Float[Array, "P G"]) -> Float[Array, "P G"]:
    """A_i = (r_i - mean(r)) / (std(r) + eps) within each group (Shao et al. 2024,
    DeepSeekMath, Sec. 4.1.2 outcome supervision)."""
    centred = rewards - jnp.mean(rewards, axis=1, keepdims=True)
    return centred / (_std(rewards, axis=1) + EPS)


@register("dr_grpo")
def dr_grpo(rewards: Float[Array, "P G"]) -> Float[Array, "P G"]:
    """A_i = r_i - mean(r): no std division, which up-weights near-solved and near-failed
    groups (Liu et al. 2025, "Understanding R1-Zero-Like Training", Sec. 3.1)."""
    return rewards - jnp.mean(rewards, axis=1, keepdims=True)


@register("batch")
def batch_normalised(rewards: Float[Array, "P G"]) -> Float[Array, "P G"]:
    """A_i = (r_i - mean(group)) / std(batch): group mean, batch-level std (Liu et al. 2025,
    "Tricks or Traps? A Deep Dive into RL for LLM Reasoning", Sec. 4.1)."""
    centred = rewards - jnp.mean(rewards, axis=1, keepdims=True)
    return centred / (_std(rewards) + EPS)


@register("rloo")
def rloo(rewards: Float[Array, "P G"]) -> Float[Array, "P G"]:
    """A_i = r_i - mean_{j != i} r_j = G / (G - 1) (r_i - mean(r)): each rollout against
    the mean of the group's others, an unbiased baseline (Ahmadian et al. 2024, "Back to
    Basics: Revisiting REINFORCE Style Optimization for Learning from Human Feedback in
    LLMs", Sec. 3.2, RLOO; as verl's `rloo` and TRL's RLOOTrainer)."""
    g = rewards.shape[1]
    return (rewards - jnp.mean(rewards, axis=1, keepdims=True)) * (g / (g - 1))


# Each built-in estimator by its paper's name, for the run's start-up header.
PAPERS = {
    "grpo": "GRPO's group mean and std (Shao et al. 2024)",
    "dr_grpo": "Dr. GRPO's group mean, no std (Liu et al. 2025)",
    "batch": "group mean, batch std (Liu et al. 2025, Tricks or Traps)",
    "rloo": "RLOO's leave-one-out mean (Ahmadian et al. 2024)",
}


def zero_advantage_groups(rewards: Float[Array, "P G"]) -> Array:
    """Which groups teach nothing: every rollout got the same reward."""
    return jnp.all(rewards == rewards[:, :1], axis=1)
