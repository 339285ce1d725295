"""explore_rl: GRPO and four exploration methods in JAX (README.md, CHANGELOG.md)."""

__version__ = "0.2.0"
