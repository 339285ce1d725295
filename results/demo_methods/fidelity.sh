#!/usr/bin/env bash
# GRPO vs EAD vs EDEN vs the temperature control (T = 1.2, scored at 1.2), and the clip
# controls (clip-higher, GSPO) on the demo setting, after the fidelity fixes: 4 optimizer
# steps per rollout batch in every config, EAD's paper indexing, the tempered policy
# trained on-policy. The same rollout budget per run (4 prompts x 8 rollouts x 32 tokens a
# step), seeds 0, 1, 2; held-out Pass@1 / Pass@8 from 8 samples per question:
#   demo: 1-digit additions, 12 steps (evaluations after steps 6 and 12)
#   hard: operands of 1-2 digits, 12 steps (evaluations after steps 6 and 12)
#   bash results/demo_methods/fidelity.sh [demo|hard|clip]        (no argument: all three)
# A run directory that already has all its steps is skipped (rerunning resumes the rest).
set -euo pipefail
source "$(dirname "$0")/run.sh"
methods=(grpo.py:demo ead.py:demo eden.py:demo controls.py:temperature)
for part in ${1:-demo hard clip}; do
  for seed in 0 1 2; do
    case $part in
      demo) for config in "${methods[@]}"; do run demo "$seed" "$config"; done ;;
      hard) for config in "${methods[@]}"; do run hard "$seed" "$config"; done ;;
      clip) for config in controls.py:clip_higher controls.py:gspo; do
          run demo "$seed" "$config"
        done ;;
    esac
  done
done
# figures and summary.md of the settings this invocation ran
for part in ${1:-demo hard clip}; do
  case $part in
    demo) python -m explore_rl.analysis --out results/demo_methods/figures/fidelity_demo \
      runs/fid/demo/* ;;
    hard) python -m explore_rl.analysis --out results/demo_methods/figures/fidelity_hard \
      runs/fid/hard/{grpo,ead,eden,controls_py_temperature}* ;;
    clip) python -m explore_rl.analysis --out results/demo_methods/figures/fidelity_clip \
      runs/fid/demo/{grpo,controls_py_clip_higher,controls_py_gspo}* ;;
  esac
done
