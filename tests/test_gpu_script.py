"""results/gpu.sh runs end to end at tiny shapes on a CPU (GPU_DRY_RUN=1): every step
gives its JSON line, none fails, and results/tools/gpu_table.py makes the table of them,
so the one call on a lent GPU is spent measuring, not debugging."""

import importlib.util
import json
import os
import subprocess
import sys

import pytest
from helpers import subprocess_env

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
spec = importlib.util.spec_from_file_location(
    "gpu_table", os.path.join(ROOT, "results", "tools", "gpu_table.py")
)
gpu_table = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gpu_table)


@pytest.mark.slow
def test_the_gpu_script_dry_run_gives_every_result_and_the_table(tmp_path):
    env = subprocess_env(
        GPU_DRY_RUN="1",
        PYTHON=sys.executable,
    )
    env["JAX_COMPILATION_CACHE_DIR"] = str(tmp_path / "xla")
    done = subprocess.run(
        ["bash", "results/gpu.sh", str(tmp_path)], cwd=ROOT, env=env, capture_output=True,
        text=True, timeout=3000,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    with open(tmp_path / "gpu.jsonl") as f:
        lines = f.readlines()
    results = [json.loads(line) for line in lines]
    benches = [r["bench"] for r in results]
    assert benches == ["device", "long", "sample", "memory", "long", "memory", "gpu.sh"]
    assert results[-1]["failed"] == [], (tmp_path / "gpu.log").read_text()[-3000:]
    fused, portable = (r["runs"][0] for r in results if r["bench"] == "long")
    assert fused["mode"] == "scan-fused" and fused["attention"].startswith("fused (XLA's")
    assert portable["attention"] == "blockwise"
    assert results[0]["fused_kernel"] != "ok"  # no cuDNN on a CPU: said, not raised
    table = gpu_table.table(lines)
    assert len(table.splitlines()) == 2 + 7  # header, rule, one row a result
    assert "of the bandwidth bound" in table and "MFU" in table
