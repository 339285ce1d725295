#!/usr/bin/env bash
# EAD at test time (EAD paper, Fig. 9: Maj@N of an untrained model): the embedded
# SmolLM2-135M on the 32 held-out demo questions, 16 samples each, fixed temperature 1.0
# vs 0.6 vs the EAD schedule at step 0 (tau_max 1.2, tau_min 0.1, d0 25, k = 1).
set -euo pipefail
common=(--mode eval --config.eval.samples=16 --config.eval.top_p=1.0)
python -m explore_rl.main --config configs/grpo.py:demo --workdir runs/tt/fixed-1.0 \
  "${common[@]}" --config.eval.temperature=1.0
python -m explore_rl.main --config configs/grpo.py:demo --workdir runs/tt/fixed-0.6 \
  "${common[@]}" --config.eval.temperature=0.6
python -m explore_rl.main --config configs/ead.py:demo --workdir runs/tt/ead \
  "${common[@]}" --config.eval.temperature=1.0 --config.exploration.ead.at_eval=True
for d in runs/tt/*; do echo "$d $(python -c "import json; r = json.load(open('$d/eval.json')); \
  print({k.split('/')[-1]: round(v, 3) for k, v in r.items() if k.startswith('eval/average/') \
  and k.split('/')[-1] in ('mean@16', 'pass@1', 'pass@4', 'pass@16', 'maj@16')})")"; done
