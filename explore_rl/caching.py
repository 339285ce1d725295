"""The user's cache folder: compiled XLA programs and converted model files.

Both are pure functions of their inputs, so they are kept across runs and shared by every
process on the machine (tests, sweeps, notebooks):

- `xla/`: JAX's persistent compilation cache. An identical program (same shapes, flags,
  JAX version and device) compiles once per machine; later processes load it. Every
  program is kept, however fast it compiled: a run's ~100 small ones (eager array
  operations, a random initialisation's draws) take longer to compile than to read back
  (a warm smoke run: 7.7 -> 5.4 s; BENCHMARKS.md, "The cache keeps every program").
- `gguf/<sha256>/`: a GGUF file converted once to an HF folder (dequantized float32
  safetensors, config.json, tokenizer.json); later loads memory-map it.
- `base/<recipe>/`: a supervised run's final weights as an HF folder, a run's starting
  point (`train.base_model`).
- `runs/<digest>/`: a run directory's checkpoint given as `model.path`, as an HF folder
  (`modes.export.resolve`), named by a digest of the step's files and the run's model.
- `digests/`: each file's sha256 (`file_digest`), remembered per path, size and mtime.

Where: `$EXPLORE_RL_CACHE_DIR`, else `$XDG_CACHE_HOME/explore_rl`, else
`~/.cache/explore_rl`. JAX's own `JAX_COMPILATION_CACHE_DIR`, when set, wins for `xla/`.
Deleting the folder is always safe.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import tempfile
from collections.abc import Callable

import jax


def cache_dir(*parts: str) -> str:
    root = os.environ.get("EXPLORE_RL_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "explore_rl"
    )
    return os.path.join(root, *parts)


def enable_compilation_cache(write: bool = True) -> str | None:
    """Turn on JAX's persistent compilation cache (idempotent); the folder it uses, or None
    when it cannot be created (then programs compile as usual). `write=False`: programs are
    read from the cache, never written to it, so this process never serializes one: the
    test suite's worker processes (each runs many tests), where jaxlib 0.10.2's CPU
    `executable.serialize()` segfaulted three times on an empty cache (never seen in a
    command-line run)."""
    folder = jax.config.jax_compilation_cache_dir or cache_dir("xla")
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError:
        return None
    jax.config.update("jax_compilation_cache_dir", folder)
    minimum = 0.0 if write else float("inf")
    jax.config.update("jax_persistent_cache_min_compile_time_secs", minimum)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    return folder


def build_once(final: str, build: Callable[[str], None]) -> str:
    """`final`, a folder that `build(tmp)` fills: built in a temporary sibling and renamed
    into place, so a reader never sees half a folder and concurrent builders are harmless
    (the first rename wins, the others' copies are dropped)."""
    if os.path.isdir(final):
        return final
    parent = os.path.dirname(final)
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".building-", dir=parent)
    try:
        build(tmp)
        os.rename(tmp, final)
    except OSError:
        if not os.path.isdir(final):
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def build_alone(final: str, build: Callable[[str], None]) -> str:
    """`build_once` of `final`, one process at a time (its lock beside it, `locked`): a
    build too costly to race (an SFT run, a checkpoint's export) is made once while the
    others wait for it, then read."""
    if os.path.isdir(final):
        return final
    os.makedirs(os.path.dirname(final), exist_ok=True)
    with locked(final + ".lock"):
        return build_once(final, build)  # built while this one waited: returned as it is


@contextlib.contextmanager
def locked(path: str):
    """While held, no other process holds `path`'s lock: processes that would build the
    same cached folder wait for one build rather than racing (an advisory `flock`, which
    the kernel drops when its holder dies)."""
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def file_digest(path: str) -> str:
    """The file's sha256, computed once per (path, size, mtime) and remembered in the cache:
    hashing a 4 GB GGUF or a big dataset at every start would cost seconds."""
    st = os.stat(path)
    key = hashlib.sha1(f"{os.path.realpath(path)}:{st.st_size}:{st.st_mtime_ns}".encode())
    memo = cache_dir("digests", key.hexdigest())
    if os.path.exists(memo):
        with open(memo) as f:
            return f.read().strip()
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 24):
            h.update(chunk)
    os.makedirs(os.path.dirname(memo), exist_ok=True)
    with open(memo + ".tmp", "w") as f:
        f.write(h.hexdigest())
    os.replace(memo + ".tmp", memo)
    return h.hexdigest()
