"""Verifiable math rewards: equivalence of an extracted answer (`answers`) to the
reference, and a pool that never hangs.

Equivalence: equal after light normalisation, or equal as numbers, or equal by
math-verify (sympy) on the two answers read as LaTeX: 1/2, 0.5 and \\frac{1}{2} agree.

`Verifier` scores in worker processes (spawned, so the JAX parent is never forked), each
item under its own timer; an item over time scores 0 and is counted. A worker first imports
and exercises the verifier (math-verify and sympy take seconds to import on a slow machine)
and only then takes items, so an item's clock never counts a cold start; the pool waits for
its workers to be warm before it hands out a batch. If a worker ignores its timer (stuck in
C code) or dies, the pool is killed and rebuilt, warm again: a run never waits forever.
A reward function that raises scores 0 and is counted; each worker's address space is
capped (`memory_mb`), so an item that allocates without bound raises MemoryError there.
Workers ignore SIGINT: Ctrl-C is the trainer's (it finishes the step, scoring included).

    with Verifier(workers=2, timeout=5.0) as v:
        scores = v.score([(response, reference), ...])  # .rewards, .timeouts, .errors
"""

from __future__ import annotations

import dataclasses
import logging
import math
import multiprocessing
import multiprocessing.popen_spawn_posix
import queue
import re
import resource
import signal
import sys
import time
import types
from collections.abc import Callable, Sequence

from explore_rl.answers import extract_answer, last_boxed


def _normalise(s: str) -> str:
    s = s.strip().strip("$").strip()
    s = re.sub(r"\\text\{([^}]*)\}", r"\1", s)
    s = s.replace("\\!", "").replace("\\,", "").replace("\\ ", "").replace(" ", "")
    return s.rstrip(".").replace("dfrac", "frac").replace("tfrac", "frac")


def _as_number(s: str) -> float | None:
    try:
        return float(s.replace(",", ""))
    except ValueError:
        return None


def equivalent(pred: str | None, ref: str) -> bool:
    """Whether the extracted answer `pred` equals the reference answer `ref`."""
    if pred is None:
        return False
    a, b = _normalise(pred), _normalise(ref)
    if a == b:
        return True
    x, y = _as_number(a), _as_number(b)
    if x is not None and y is not None:
        return math.isclose(x, y, rel_tol=1e-9, abs_tol=1e-9)
    from math_verify import parse, verify

    # Timers are ours (the worker's), so math-verify's own signal timers are off.
    gold = parse(f"${b}$", parsing_timeout=None)
    target = parse(f"${a}$", parsing_timeout=None)
    return bool(gold and target and verify(gold, target, timeout_seconds=None))


def correct(response: str, reference: str, methods: Sequence[str] = ("boxed", "last_number")):
    """The binary reward: the response's extracted answer equals the reference."""
    return equivalent(extract_answer(response, methods), reference)


def math_reward(response: str, problem, extractors: Sequence[str]) -> float:
    """`correct` as a float, for a problem with an `answer` (the registered "math" reward)."""
    return float(correct(response, problem.answer, extractors))


def format_reward(response: str) -> float:
    """1 when the response puts an answer in \\boxed{} (the instruction's format)."""
    return float(last_boxed(response) is not None)


# ----------------------------------------------------------------------------- the pool


class _ItemTimeout(Exception):
    pass


def _on_alarm(signum, frame):
    raise _ItemTimeout


def _init_worker(ready, memory_bytes: int):
    """Runs in each worker (also one the pool starts to replace a dead worker) before it
    takes any item: the imports and sympy's first-call caches are paid here, not on an
    item's clock. Ctrl-C and SIGTERM are the trainer's to handle (it finishes the step,
    which needs the workers, even when a terminal or SLURM signals every process of the
    run), and an item that allocates without bound meets the memory limit."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    logging.getLogger("math_verify").setLevel(logging.ERROR)
    signal.signal(signal.SIGALRM, _on_alarm)
    equivalent("1/2", "0.5")  # goes through math-verify's parse and verify
    ready.put(time.monotonic())  # (starts the queue's feeder thread)
    if memory_bytes:  # after the imports and threads: the limit is for the items
        resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))


def _score_one(fn, args, timeout: float) -> tuple[list[float], bool, bool]:
    """([reward], timed out, raised) for one item, under a real-time timer in the worker."""
    return _score_batch(lambda items: [fn(*items[0])], [args], timeout)


def _number(x) -> float:
    """A reward as a float: a number of any kind (numpy's, a 0-d array); a string is the
    function's error, not a number read from its text."""
    if isinstance(x, (str, bytes)):
        raise TypeError(f"a reward must be a number, not {type(x).__name__} {x!r}")
    return float(x)


def _score_batch(fn, items: list, timeout: float) -> tuple[list[float], bool, bool]:
    """(rewards, timed out, raised) of one call `fn(items)` -> a reward per item, under a
    real-time timer in the worker; over time or raising, each item scores 0."""
    signal.setitimer(signal.ITIMER_REAL, timeout)
    try:
        rewards = [_number(x) for x in fn(items)]
        if len(rewards) != len(items):
            raise ValueError(f"{len(rewards)} rewards for {len(items)} items")
        return rewards, False, False
    except _ItemTimeout:
        return [0.0] * len(items), True, False
    except Exception:  # a crash on odd input (MemoryError included) scores 0, counted
        return [0.0] * len(items), False, True
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)


class _Launch(multiprocessing.popen_spawn_posix.Popen):
    """Starts a worker without the parent's main module when that is one of the package's
    own entry points (`python -m explore_rl.main`). Spawn re-imports the parent's `__main__`
    in every worker, so that functions defined there unpickle; explore_rl.main's imports
    are JAX and the whole trainer, seconds of CPU a worker beside a run that is compiling.
    The entry points define no reward function; a user's script keeps its main."""

    def _launch(self, process_obj):
        main = sys.modules["__main__"]
        name = getattr(getattr(main, "__spec__", None), "name", None) or ""
        if name.startswith("explore_rl."):  # swapped only while the launch pickles its
            sys.modules["__main__"] = types.ModuleType("__main__")  # preparation data
        try:
            super()._launch(process_obj)
        finally:
            sys.modules["__main__"] = main


class _Worker(multiprocessing.context.SpawnProcess):
    """A worker ignores SIGTERM, so the pool ends it (at close, or stuck in an item) with
    SIGKILL."""

    _Popen = staticmethod(_Launch)

    def terminate(self):
        self.kill()


class _Spawn(multiprocessing.context.SpawnContext):
    Process = _Worker


@dataclasses.dataclass(frozen=True)
class Scores:
    rewards: list[float]
    timeouts: int  # items over the per-item timeout (or lost with a stuck worker): 0
    errors: int  # items whose reward function raised: 0


class Verifier:
    """Scores (prediction, reference) pairs in a process pool with per-item timeouts."""

    def __init__(
        self,
        workers: int = 2,
        timeout: float = 5.0,
        fn: Callable = correct,
        warmup_timeout: float = 120.0,
        memory_mb: int = 4096,
    ):
        if workers < 1 or timeout <= 0 or memory_mb < 0:
            raise ValueError(
                f"workers={workers} must be >= 1, timeout={timeout} > 0, memory_mb={memory_mb} >= 0"
            )
        self.workers, self.timeout, self.fn = workers, timeout, fn
        self.warmup_timeout = warmup_timeout
        self.memory_bytes = memory_mb * 2**20  # each worker's address space; 0 = no limit
        self.timeouts_total = self.errors_total = 0
        self.warmup_s = 0.0  # how long the last (re)start took to have every worker warm
        self._pool, self._ready, self._started, self._warm = None, None, 0.0, False

    def _start(self):
        """Spawn a fresh pool; its workers warm up in the background (see `_wait_warm`)."""
        ctx = _Spawn()
        self._ready, self._started = ctx.Queue(), time.monotonic()
        self._warm = False
        self._pool = ctx.Pool(
            self.workers, initializer=_init_worker, initargs=(self._ready, self.memory_bytes)
        )

    def _wait_warm(self):
        try:  # workers report when they became warm (CLOCK_MONOTONIC is system-wide)
            warm_at = [self._ready.get(timeout=self.warmup_timeout) for _ in range(self.workers)]
        except queue.Empty:
            self.close()
            raise RuntimeError(
                f"verifier workers not ready after {self.warmup_timeout:.0f}s "
                "(importing math-verify); is the machine overloaded?"
            ) from None
        self._warm, self.warmup_s = True, max(warm_at) - self._started

    def close(self):
        if self._pool is not None:
            self._pool.terminate()
            self._pool.join()
            self._pool = None

    def __enter__(self):
        self._start()  # workers warm up while the caller loads its model
        return self

    def __exit__(self, *exc):
        self.close()

    def score(
        self, items: Sequence[tuple], fn: Callable | None = None, batched: bool = False
    ) -> Scores:
        """Rewards for argument tuples of `fn` (default: the pool's), with how many items
        timed out and how many raised. `batched`: `fn` takes a list of items and returns a
        reward for each (a judge, a reward model, TRL's reward functions), called once per
        worker on its share of `items`, timed `timeout` per item; a call over time or
        raising scores each of its items 0, counted per item."""
        fn = fn or self.fn
        if not items:
            return Scores([], 0, 0)
        if self._pool is None:
            self._start()
        if not self._warm:
            self._wait_warm()
        per_call = -(-len(items) // self.workers) if batched else 1
        calls = [items[i : i + per_call] for i in range(0, len(items), per_call)]
        jobs = [
            self._pool.apply_async(_score_batch, (fn, list(c), self.timeout * len(c)))
            if batched
            else self._pool.apply_async(_score_one, (fn, c[0], self.timeout))
            for c in calls
        ]
        # Each call has its own timer; the batch as a whole gets the time its share of
        # items needs plus slack (a worker replaced mid-batch warms up again, hence the
        # last warm-up time), after which unfinished items count as timed out.
        slack = 2 + self.warmup_s
        deadline = (
            time.monotonic() + self.timeout * (len(items) / self.workers + per_call + 1) + slack
        )
        rewards, timeouts, errors, stuck = [], 0, 0, False
        for job, c in zip(jobs, calls):
            try:
                got, late, raised = job.get(timeout=max(deadline - time.monotonic(), 0.01))
            except multiprocessing.TimeoutError:
                got, late, raised, stuck = [0.0] * len(c), True, False, True
            rewards += got
            timeouts += late * len(c)
            errors += raised * len(c)
        if stuck:  # a worker ignored its timer or died: start from fresh processes
            self.close()
        self.timeouts_total += timeouts
        self.errors_total += errors
        return Scores(rewards, timeouts, errors)
