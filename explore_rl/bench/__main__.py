"""`python -m explore_rl.bench <benchmark>` (explore_rl/bench/__init__.py)."""

from explore_rl.bench import main

main()
