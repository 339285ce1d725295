#!/usr/bin/env bash
# EDEN's "diversity before any update" on the embedded SmolLM2-135M (no training): 32
# held-out questions, 32 rollouts per side (standard, a second standard set as the null,
# anchor + noise with the demo's bank and rho 0.12), temperature 1, 32 tokens.
set -euo pipefail
python -m explore_rl.eden_analysis --config configs/eden.py:demo --prompts 32 \
  --samples 32 --out results/demo_methods/eden_diversity.json
python -m explore_rl.eden_analysis --config configs/eden.py:demo --prompts 32 \
  --samples 32 --config.task.style=word --config.rollout.max_new_tokens=64 \
  --out results/demo_methods/eden_diversity_word.json
