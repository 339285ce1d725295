"""`startup`: seconds from command to first rollout (`--mode sample`, 2 prompts x 2 samples x
8 tokens of the embedded model) in fresh processes sharing a new, empty cache folder: the
first converts the GGUF and compiles, the second reads both from the cache (`caching`).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import time

HELP = "command to first rollout, cold and warm cache"


def add_arguments(p) -> None:
    p.add_argument("--config", default="configs/base.py")


_LOADED = re.compile(r"^loaded .* in ([0-9.]+)s$", re.M)


def run(args) -> dict:
    command = [
        sys.executable, "-m", "explore_rl.main", "--mode", "sample", "--config", args.config,
        "--config.sample.num_prompts=2", "--config.sample.samples_per_prompt=2",
        "--config.sample.max_new_tokens=8",
    ]  # fmt: skip
    out = {"bench": "startup", "command": " ".join(command[1:])}
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, EXPLORE_RL_CACHE_DIR=cache, JAX_COMPILATION_CACHE_DIR="")
        for run in ("cold", "warm"):
            start = time.perf_counter()
            done = subprocess.run(command, env=env, capture_output=True, text=True)
            if done.returncode:
                raise RuntimeError(f"{' '.join(command)} failed:\n{done.stderr[-2000:]}")
            out[f"{run}_s"] = round(time.perf_counter() - start, 2)
            out[f"{run}_load_s"] = float(_LOADED.search(done.stdout).group(1))
    return out
