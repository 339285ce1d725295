"""Experiment configs: `get_config(arg)` per file, and `get_sweep(hyper)` where a sweep is
defined. Installed with the package, so `from configs import grpo` and
`explore_rl.config.load("configs/grpo.py:demo")` work from any directory."""
