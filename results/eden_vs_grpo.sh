#!/usr/bin/env bash
# EDEN on the demo setting at GRPO's rollout budget (4 prompts x 8 rollouts x 32 tokens, 12
# steps; 2 of each 8 rollouts noisy), seeds 0 and 1, held-out Pass@1 / Pass@8 from 8
# samples per question; GRPO's runs come from results/ead_vs_grpo.sh.
#   bash results/eden_vs_grpo.sh && python -m explore_rl.analysis runs/cmp/*
set -euo pipefail
for seed in 0 1; do
  python -m explore_rl.main --config configs/eden.py:demo --workdir "runs/cmp/eden_py_demo-s$seed" \
    --config.seed=$seed --config.eval.samples=8
done
