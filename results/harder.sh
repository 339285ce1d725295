#!/usr/bin/env bash
# GRPO vs EAD vs EDEN where most groups carry no signal: the demo setting with operands of
# 1-2 digits (task.max_digits=2), 20 steps, held-out Pass@1 / Pass@8 (8 samples) after
# steps 10 and 20, seeds 0 and 1.
#   bash results/harder.sh && python -m explore_rl.analysis runs/hard/*
set -euo pipefail
for seed in 0 1; do
  for run in grpo.py:demo ead.py:demo eden.py:demo; do
    name=$(echo "$run" | tr ':.' '__')
    python -m explore_rl.main --config "configs/$run" --workdir "runs/hard/${name}-s$seed" \
      --config.seed=$seed --config.task.max_digits=2 --config.train.steps=20 \
      --config.train.eval_every=10 --config.train.checkpoint_every=10 --config.eval.samples=8
  done
done
