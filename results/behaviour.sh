#!/bin/bash
# The demo and every method's smoke config on a tree, their run directories in OUT, to
# compare two trees' behaviour (a refactor changes no number):
#   bash results/behaviour.sh /tmp/old runs/old && bash results/behaviour.sh . runs/new
#   python results/compare_metrics.py runs/old runs/new
set -u
TREE=$(cd "$1" && pwd); OUT=$(mkdir -p "$2" && cd "$2" && pwd); PY=${PYTHON:-python}
cd "$TREE"
for spec in grpo.py:demo grpo.py:smoke ead.py:smoke eden.py:smoke ase.py:smoke extra.py:smoke; do
  name=${spec/.py:/-}
  rm -rf "$OUT/$name"
  PYTHONPATH=$TREE $PY -m explore_rl.main --config "configs/$spec" --workdir "$OUT/$name" \
    > "$OUT/$name.log" 2>&1
  echo "$spec rc=$?"
done
