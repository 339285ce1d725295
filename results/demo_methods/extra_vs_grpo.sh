#!/usr/bin/env bash
# GRPO vs ExTra-N (novelty) vs ExTra-R (prefix regeneration) vs ExTra where most groups
# start without signal: the "hard" setting of run.sh (operands of 1-2 digits, 12 steps, 4
# prompts x 8 rollouts x 32 tokens a step: the same rollout budget), seeds 0, 1, 2; GRPO's
# runs are fidelity.sh's. ExTra's demo scale: regeneration from step 3, line-break cuts 4
# tokens apart.
#   bash results/demo_methods/extra_vs_grpo.sh
set -euo pipefail
source "$(dirname "$0")/run.sh"
for seed in 0 1 2; do
  for config in grpo.py:demo extra.py:novelty,demo extra.py:regen,demo extra.py:demo; do
    run hard "$seed" "$config"
  done
done
python -m explore_rl.analysis --out results/demo_methods/figures/extra_hard \
  runs/fid/hard/{grpo,extra}*
