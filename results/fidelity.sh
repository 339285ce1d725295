#!/usr/bin/env bash
# GRPO vs EAD vs EDEN vs the temperature control (T = 1.2, scored at 1.2), and on the demo
# setting the clip controls (clip-higher, GSPO), after the fidelity fixes: 4 optimizer
# steps per rollout batch in every config, EAD's paper indexing, the tempered policy
# trained on-policy. The same rollout budget per run (4 prompts x 8 rollouts x 32 tokens a
# step), seeds 0, 1, 2; held-out Pass@1 / Pass@8 from 8 samples per question:
#   demo: 1-digit additions, 12 steps (evaluations after steps 6 and 12)
#   hard: operands of 1-2 digits, 20 steps (evaluations after steps 10 and 20)
#   bash results/fidelity.sh
#   python -m explore_rl.evaluation.report runs/fid/demo/*; ... runs/fid/hard/*
# A run directory that already has all its steps is skipped (rerunning resumes the rest).
set -euo pipefail
methods=(grpo.py:demo ead.py:demo eden.py:demo controls.py:temperature)
clip=(controls.py:clip_higher controls.py:gspo)
run() {  # setting seed steps config [flags...]
  local setting=$1 seed=$2 steps=$3 config=$4
  shift 4
  local dir="runs/fid/$setting/$(echo "$config" | tr ':.' '__')-s$seed"
  if [ -f "$dir/metrics.jsonl" ] && [ "$(wc -l < "$dir/metrics.jsonl")" -ge "$steps" ]; then
    return
  fi
  python -m explore_rl.main --config "configs/$config" --workdir "$dir" \
    --config.seed="$seed" --config.eval.samples=8 "$@"
}
for seed in 0 1 2; do
  for config in "${methods[@]}" "${clip[@]}"; do
    run demo "$seed" 12 "$config"
  done
done
for seed in 0 1 2; do
  for config in "${methods[@]}"; do
    run hard "$seed" 20 "$config" --config.task.max_digits=2 --config.train.steps=20 \
      --config.train.eval_every=10 --config.train.checkpoint_every=10
  done
done
