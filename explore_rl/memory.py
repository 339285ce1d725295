"""Hand freed host memory back to the OS between the phases of a step, and on a CPU
between the update's optimizer steps.

glibc keeps freed heap pages resident. The rollout's caches and a compile's LLVM heap are
freed before the update, yet still count toward RSS when the update's gradient buffers
arrive on top of them. `malloc_trim(0)` returns those pages (a few ms). On the peer GRPO
step it lowers the peak RSS from 4.18 to 3.89 GiB (BENCHMARKS.md). Where libc has no
malloc_trim (macOS, musl) these functions do nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util

import jax

_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"


def _libc():
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None


_LIBC = _libc()
_TRIM = getattr(_LIBC, "malloc_trim", None)
_listening = False


def trim() -> None:
    """Return the heap's free pages to the OS."""
    if _TRIM is not None:
        _TRIM(0)


def settle(tree) -> None:
    """On a CPU backend, wait for `tree` and return the heap's free pages to the OS.

    On a CPU the heap is the device's memory, and glibc keeps the pages one optimizer step
    freed resident while the next step's buffers may take fresh ones: on SmolLM2-135M the
    RSS grew by ~0.4 GiB at some steps and stayed so until the next trim. Trimming between
    the steps hands them back, so such a growth lasts one step (BENCHMARKS.md, "One
    optimizer step's heap"). Elsewhere the heap is not the device's memory: nothing is
    awaited."""
    if _TRIM is not None and jax.default_backend() == "cpu":
        jax.block_until_ready(tree)
        trim()


def trim_after_compiles() -> None:
    """Trim after every XLA compile, before its executable first runs (idempotent)."""
    global _listening
    if _TRIM is None or _listening:
        return
    jax.monitoring.register_event_duration_secs_listener(
        lambda event, duration, **kw: trim() if event == _COMPILE_EVENT else None
    )
    _listening = True
