#!/usr/bin/env bash
# The GPU checks, one call on a lent GPU machine (about 10 minutes on one H200), most needed
# first: each step has its own time limit inside one overall budget (GPU_BUDGET_S), a failed
# or stopped step is named and the next one runs. Every step prints one JSON line, all into
# OUT_DIR/gpu.jsonl (their logs into OUT_DIR/gpu.log); record them in BENCHMARKS.md with
# the device named.
#   bash results/gpu.sh [OUT_DIR]     # TOKENIZER=<folder>: the demo's tokenizer, random
#                                      # weights, where the embedded GGUF is not installed
# 1. The papers' lengths on the 1.5B shape (`bench long`): one update of 8 rows x (1024 + 4096)
#    tokens, random weights, bfloat16, the paper configs' memory settings (blockwise
#    attention, remat, chunked log-probs, layers scanned): tokens/s, MFU and the measured
#    peak against the start-up estimate. Mostly compiles: unrolled, at 4 of its 28 layers
#    the update compiled in 27 s, the prefill in 12 s on an H200, too slow at 28 (BENCHMARKS);
#    scanned (`--modes scan`), the 28-layer update compiles in ~1/3 of the unrolled time
#    on a CPU (`bench depth`).
# 2. The forward benchmark in bfloat16; the start-up memory estimate against the device's
#    measured peak on the demo (bfloat16, then float32); the scale benchmark (random-weight
#    0.5B / 1.5B shapes, 64 prompts x 8 rollouts, 512-token prompts, 1024 new tokens).
set -uo pipefail
out=${1:-${OUT:-results}}
mkdir -p "$out"
budget=${GPU_BUDGET_S:-600}
start=$SECONDS
# A program compiled twice in one process (bench long's XLA memory analysis) loads the
# second time.
export JAX_COMPILATION_CACHE_DIR=${JAX_COMPILATION_CACHE_DIR:-/tmp/explore_rl-xla}
export PYTHONUNBUFFERED=1
failed=()

step() {  # name, seconds at most, command...
    local name=$1 limit=$2 left
    shift 2
    left=$((budget - (SECONDS - start)))
    ((limit > left)) && limit=$left
    if ((limit < 20)); then
        failed+=("$name (no time left)")
        return
    fi
    echo "== $name (${limit}s at most): $*" | tee -a "$out/gpu.log"
    local t0=$SECONDS
    if timeout "$limit" "$@" 2>>"$out/gpu.log" | tail -n 1 >>"$out/gpu.jsonl"; then
        echo "   done in $((SECONDS - t0))s: $(tail -c 400 "$out/gpu.jsonl")"
    else
        failed+=("$name (exit after $((SECONDS - t0))s)")
        tail -n 15 "$out/gpu.log"
    fi
}

python3 - <<'EOF' | tee -a "$out/gpu.jsonl"
import json, jax
from explore_rl.bench.common import matmul_peak
d = jax.devices()[0]
print(json.dumps({"bench": "device", "device": d.device_kind, "jax": jax.__version__,
                  "bf16_matmul_tflops": {n: round(matmul_peak("bfloat16", n) / 1e12, 1)
                                         for n in (2048, 8192)}}))
EOF
step long 420 python3 -m explore_rl.bench long --preset qwen2.5-math-1.5b --layers 0 \
    --prompt-len 1024 --lengths 4096 --modes scan --rows 8 --dtype bfloat16 --reps 2
step forward 40 python3 -m explore_rl.bench forward --dtype bfloat16 --batch 64 --length 512 \
    ${TOKENIZER:+--model $TOKENIZER --random-init smollm2-135m}
memory=(python3 -m explore_rl.bench memory --config configs/grpo.py:demo --steps 2
    --random-init smollm2-135m ${TOKENIZER:+--set model.path=$TOKENIZER})
step memory_bfloat16 100 "${memory[@]}" --set model.param_dtype=bfloat16 --set model.dtype=bfloat16
step memory_float32 90 "${memory[@]}"
step scale 240 python3 -m explore_rl.bench scale
echo "gpu.sh: $((SECONDS - start))s; failed or stopped: ${failed[*]:-none}" | tee -a "$out/gpu.log"
