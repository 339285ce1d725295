#!/usr/bin/env bash
# GRPO vs ASE vs ASE's unstructured-random-steering ablation (a fresh random unit vector
# per rollout, no bank) where most groups start without signal: the "hard" setting of
# run.sh (operands of 1-2 digits, 12 steps, 4 prompts x 8 rollouts x 32 tokens a step: the
# same rollout budget), seeds 0, 1, 2; GRPO's runs are fidelity.sh's.
#   bash results/demo_methods/ase_vs_grpo.sh
set -euo pipefail
source "$(dirname "$0")/run.sh"
for seed in 0 1 2; do
  for config in grpo.py:demo ase.py:demo ase.py:unstructured,demo; do
    run hard "$seed" "$config"
  done
done
python -m explore_rl.analysis --out results/demo_methods/figures/ase_hard \
  runs/fid/hard/{grpo,ase}*
