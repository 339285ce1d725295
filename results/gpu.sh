#!/usr/bin/env bash
# The GPU checks, one call on a lent GPU machine (fits in about 8 minutes on one H100/H200):
# the scale benchmark (random-weight 0.5B / 1.5B shapes, bfloat16, 64 prompts x 8 rollouts,
# 512-token prompts, 1024 new tokens), the forward benchmark in bfloat16, and the start-up
# memory estimate against the device's measured peak on the demo (float32, then bfloat16).
# Each prints one JSON line; record them in BENCHMARKS.md with the device named.
#   bash results/gpu.sh [OUT_DIR]
set -euo pipefail
out=${1:-${OUT:-results}}
mkdir -p "$out"
python -m explore_rl.bench forward --dtype bfloat16 --batch 64 --length 512 | tee "$out/gpu_forward.json"
python -m explore_rl.bench scale | tee "$out/gpu_scale.json"
memory="python -m explore_rl.bench memory --config configs/grpo.py:demo --random-init smollm2-135m --steps 2"
$memory | tee "$out/gpu_memory_float32.json"
$memory --set model.param_dtype=bfloat16 --set model.dtype=bfloat16 | tee "$out/gpu_memory_bfloat16.json"
# The papers' lengths on a 1.5B shape (random weights, bfloat16 activations): one update of
# 8 rows x (1024 + 4096) tokens with the paper configs' memory settings, its tokens/s, MFU
# and measured peak against the start-up estimate.
python -m explore_rl.bench long --preset qwen2.5-math-1.5b --layers 0 --prompt-len 1024 \
    --lengths 4096 --modes long --rows 8 --dtype bfloat16 --reps 2 | tee "$out/gpu_long.json"
