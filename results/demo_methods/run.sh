# Shared by the comparison scripts: `run SETTING SEED CONFIG [flags]` trains
# configs/CONFIG into runs/fid/SETTING/<config>-s<SEED> unless that run has all its steps.
#   demo: the config's demo scale (1-digit additions, 12 steps)
#   hard: operands of 1-2 digits (task.max_digits=2), where most groups start without
#         signal; 12 steps, evaluations after 6 and 12
# Every run evaluates with 8 samples per question, with the diversity of correct responses,
# and keeps only its newest checkpoint (a demo run's is 1.6 GB: params and Adam moments).
run() {
  local setting=$1 seed=$2 config=$3 steps=12
  shift 3
  local extra=()
  if [ "$setting" = hard ]; then
    extra=(--config.task.max_digits=2)
  fi
  local dir="runs/fid/$setting/$(echo "$config" | tr ':.,' '___')-s$seed"
  if [ -f "$dir/metrics.jsonl" ] && [ "$(wc -l < "$dir/metrics.jsonl")" -ge "$steps" ]; then
    return
  fi
  python -m explore_rl.main --config "configs/$config" --workdir "$dir" \
    --config.seed="$seed" --config.eval.samples=8 --config.eval.diversity=True \
    --config.train.keep_checkpoints=1 "${extra[@]}" "$@"
}
