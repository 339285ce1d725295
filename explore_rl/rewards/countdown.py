"""`reward.name = "countdown"`: 1 for a response whose steps reach the target from the
question's numbers, each used once (`data.countdown.steps_reach`), else 0."""

from explore_rl.data import countdown
from explore_rl.rewards.registry import register


@register("countdown")
def _countdown(section):
    return countdown.reward
