"""`reward.name = "multistep"`: 1 for a response that reduces the question's expression
step by step to its value (`data.multistep.steps_reach`), else 0."""

from explore_rl.data import multistep
from explore_rl.rewards.registry import register


@register("multistep")
def _multistep(section):
    return multistep.reward
