"""Where the suite's time goes: each test's wall time, its process's CPU time and JAX's own
compile timers (tracing, lowering to MLIR, XLA compiling) in the test process. A test that
runs the CLI in a subprocess shows wall time and little else.

    PYTHONPATH=results/suite python -m pytest -n 2 --dist loadscope -p suite_profile
    python results/suite/suite_profile.py  # its modules, slowest first

Each worker appends a line a test to `$SUITE_PROFILE` (default runs/suite_profile/), one
file a process; delete the folder before a new run.
"""

from __future__ import annotations

import collections
import glob
import json
import os
import sys
import time

FOLDER = os.environ.get("SUITE_PROFILE", os.path.join("runs", "suite_profile"))
TIMERS = {
    "compile": "/jax/core/compile/backend_compile_duration",
    "trace": "/jax/core/compile/jaxpr_trace_duration",
    "lower": "/jax/core/compile/jaxpr_to_mlir_module_duration",
}


def pytest_configure(config):
    import pytest
    from jax import monitoring

    totals = collections.Counter()

    def listen(event, seconds, **_):
        totals[event] += seconds
        totals["programs"] += event == TIMERS["compile"]

    monitoring.register_event_duration_secs_listener(listen)
    os.makedirs(FOLDER, exist_ok=True)
    path = os.path.join(FOLDER, f"{os.getpid()}.jsonl")

    class Recorder:
        @pytest.hookimpl(hookwrapper=True)
        def pytest_runtest_protocol(self, item, nextitem):
            totals.clear()
            wall, cpu = time.time(), time.process_time()
            yield
            row = dict(test=item.nodeid, wall=time.time() - wall, cpu=time.process_time() - cpu)
            row.update({k: totals[e] for k, e in TIMERS.items()}, programs=totals["programs"])
            with open(path, "a") as f:
                f.write(json.dumps(row) + "\n")

    config.pluginmanager.register(Recorder())


def main(folder: str = FOLDER) -> None:
    rows = []
    for path in glob.glob(os.path.join(folder, "*.jsonl")):
        with open(path) as f:
            rows += [json.loads(line) for line in f]
    if not rows:
        sys.exit(f"error: no profile under {folder}: run the suite with -p suite_profile first")
    keys = ["wall", "cpu", *TIMERS, "programs"]
    modules = collections.defaultdict(collections.Counter)
    for r in rows:
        modules[r["test"].split("::")[0]].update({k: r[k] for k in keys} | {"tests": 1})
    total = sum(modules.values(), collections.Counter())
    head = ("seconds", "cpu", "compile", "trace", "lower", "programs")
    print(" ".join(f"{h:>8}" for h in head), "tests module")
    for name, m in [("all", total), *sorted(modules.items(), key=lambda kv: -kv[1]["wall"])]:
        print(
            " ".join(f"{m[k]:8.1f}" for k in keys[:-1]),
            f"{m['programs']:8d} {m['tests']:5d} {name}",
        )


if __name__ == "__main__":
    main(*sys.argv[1:])
