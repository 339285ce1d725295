#!/usr/bin/env bash
# GRPO vs EAD vs fixed temperature 1.2 on the demo setting (embedded SmolLM2-135M, 1-digit
# additions, 4 prompts x 8 rollouts x 32 tokens a step, 12 steps: the same rollout budget),
# seeds 0 and 1, held-out Pass@1 / Pass@8 from 8 samples per question at steps 6 and 12.
#   bash results/ead_vs_grpo.sh && python -m explore_rl.analysis runs/cmp/*
set -euo pipefail
for seed in 0 1; do
  for run in grpo.py:demo ead.py:demo controls.py:temperature; do
    name=$(echo "$run" | tr ':.' '__')
    python -m explore_rl.main --config "configs/$run" --workdir "runs/cmp/${name}-s$seed" \
      --config.seed=$seed --config.eval.samples=8
  done
done
