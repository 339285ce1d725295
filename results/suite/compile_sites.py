"""Which programs a process sends through JAX's compile path, from where, at what cost; and
how many of them it compiled before (the same module text, compiled again). A jitted
call whose program is not yet in the process's memory goes through this path: tracing
is not counted; lowering, the persistent cache's read or XLA's compile, and dispatching
the program's first run (asynchronous on a CPU) are.

    PYTHONPATH=results/suite python -m pytest -p compile_sites tests/test_x.py  # in the tests
    python results/suite/compile_sites.py explore_rl.main --config ...  # a command
    python results/suite/compile_sites.py report                        # the records

It wraps two of JAX's private functions (`pjit._pjit_call_impl_python`,
`compiler.compile_or_get_cached`, as in JAX 0.10.2). A module text compiled under two sets
of options (an `optimized` test's and another's) counts as a repeat, so repeats are an
upper bound. Each process writes `$COMPILE_SITES/<pid>.json` (default runs/compile_sites/)
when it exits; delete the folder before a new run. "small": under 0.1 s a call (an eager
array operation, a random draw); the site is the innermost frame in this project's code.
"""

from __future__ import annotations

import atexit
import collections
import glob
import hashlib
import json
import os
import runpy
import sys
import time
import traceback

FOLDER = os.environ.get("COMPILE_SITES", os.path.join("runs", "compile_sites"))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))) + os.sep
SMALL = 0.1


def _site() -> str:
    for f in reversed(traceback.extract_stack()):
        here = f.filename == os.path.abspath(__file__)
        if f.filename.startswith(ROOT) and "site-packages" not in f.filename and not here:
            return f"{f.filename[len(ROOT) :]}:{f.lineno}:{f.name}"
    return "?"


def record() -> None:
    """Count every trip through the compile path of this process, written at its exit."""
    from jax._src import compiler, pjit

    calls = collections.defaultdict(lambda: [0, 0.0])  # (program, small site) -> n, s
    texts = collections.defaultdict(lambda: [0, 0.0])  # module text digest -> n, s
    call, compile_ = pjit._pjit_call_impl_python, compiler.compile_or_get_cached

    def timed_call(*args, **kwargs):
        start = time.perf_counter()
        out = call(*args, **kwargs)
        seconds = time.perf_counter() - start
        site = _site() if seconds < SMALL else "(large)"
        c = calls[(kwargs.get("name", "?"), site)]
        c[0], c[1] = c[0] + 1, c[1] + seconds
        return out

    def timed_compile(backend, computation, *args, **kwargs):
        digest = hashlib.sha1(str(computation).encode()).hexdigest()
        start = time.perf_counter()
        out = compile_(backend, computation, *args, **kwargs)
        t = texts[digest]
        t[0], t[1] = t[0] + 1, t[1] + time.perf_counter() - start
        return out

    pjit._pjit_call_impl_python, compiler.compile_or_get_cached = timed_call, timed_compile

    def write():
        os.makedirs(FOLDER, exist_ok=True)
        rows = [dict(program=p, site=s, n=n, seconds=t) for (p, s), (n, t) in calls.items()]
        with open(os.path.join(FOLDER, f"{os.getpid()}.json"), "w") as f:
            json.dump(dict(calls=rows, texts=list(texts.values())), f)

    atexit.register(write)


def pytest_configure(config):
    record()


def report(folder: str = FOLDER) -> None:
    calls, texts = [], []
    for path in glob.glob(os.path.join(folder, "*.json")):
        with open(path) as f:
            d = json.load(f)
        calls += d["calls"]
        texts += d["texts"]
    if not calls:
        sys.exit(f"error: no records under {folder}: run with -p compile_sites first")
    small = [c for c in calls if c["site"] != "(large)"]
    own = [c for c in small if c["site"].startswith("explore_rl/")]

    def total(rows):
        return f"{sum(c['n'] for c in rows)} calls, {sum(c['seconds'] for c in rows):.2f} s"

    again = [(n - 1, s * (n - 1) / n) for n, s in texts if n > 1]
    print(f"compile path: {total(calls)}; small: {total(small)}, from explore_rl/: {total(own)}")
    print(
        f"module texts: {len(texts)} distinct (per process) of {sum(n for n, _ in texts)} "
        "compiled; "
        f"repeats {sum(n for n, _ in again)}, {sum(s for _, s in again):.2f} s"
    )
    sites = collections.Counter()
    for c in small:
        sites[c["site"]] += c["seconds"]
    print("small calls by site:")
    for site, seconds in sites.most_common(15):
        print(f"{seconds:8.2f} {site}")


def main() -> None:
    if len(sys.argv) < 2:
        sys.exit("usage: compile_sites.py report | compile_sites.py MODULE [ARGS...]")
    if sys.argv[1:] == ["report"]:
        return report()
    record()
    module, sys.argv = sys.argv[1], sys.argv[1:]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
