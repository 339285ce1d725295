"""A run's training problems when each of its processes reads only its shard.

Process p of P reads rows i % P == p of the training file (`tasks.Shard`); `join` makes of
the shards one sequence that every process sees alike: the usable rows of the whole file
in file order, so a run of P processes draws the same problems as a run of one. Only the
row numbers travel at start; a step's problems are sent by their owners when the step
draws them (`take`), a few kilobytes a step.

`gather(bytes) -> [bytes of each process]` is the run's all-gather (one process: `[b]`);
every process must call `join` and `take` alike, in the same order, as with any
collective.

    local, _ = tasks.load("jsonl", c.task, c.seed, Shard(p, P))
    problems = Problems.join(local, Shard(p, P), parallel.allgather_bytes).problems
    problems.take([7, 3])  # on every process: the same two Problems
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Sequence

import numpy as np

from explore_rl.data.tasks import WHOLE, Problem, Shard

Gather = Callable[[bytes], list[bytes]]


def alone(data: bytes) -> list[bytes]:
    """The all-gather of a run of one process."""
    return [data]


@dataclasses.dataclass(frozen=True)
class Joined:
    """What `join` learns of every shard."""

    problems: Problems
    longest: int  # the longest prompt of any shard, in tokens


class Problems(Sequence):
    """The usable rows of a dataset read in shards, indexed as the whole file's; indexing
    (an int, a slice, `take`) is collective when there are several shards."""

    def __init__(self, local: list[Problem], rows: np.ndarray, shard: Shard, gather: Gather):
        self._local = {p.row: p for p in local}
        self._rows = rows  # every shard's usable row numbers, in file order
        self._shard = shard
        self._gather = gather

    @classmethod
    def join(
        cls,
        local: list[Problem],
        shard: Shard = WHOLE,
        gather: Gather = alone,
        longest: int = 0,
        error: str | None = None,
    ) -> Joined:
        """One sequence of every process's `local` problems. An `error` of any process (its
        shard could not be read) is raised by every process, so none waits for the others
        in a later collective."""
        rows = [p.row for p in local]
        shared, foreign = len(rows) - len(set(rows)), sum(not shard.owns(r) for r in rows)
        if error is None and (shared or foreign):
            error = (
                f"of the task's training problems {shared} share a `row` and {foreign} are "
                "another shard's: a task that takes `shard` returns the rows that shard "
                "owns, each problem with its row of the dataset"
            )
        mine = {"rows": rows, "longest": longest, "error": error}
        every = [json.loads(b) for b in gather(json.dumps(mine).encode())]
        for p, part in enumerate(every):
            if part["error"]:
                raise ValueError(f"process {p}: {part['error']}")
        rows = np.sort(np.concatenate([np.asarray(e["rows"], np.int64) for e in every]))
        return Joined(cls(local, rows, shard, gather), max(e["longest"] for e in every))

    def __len__(self) -> int:
        return len(self._rows)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return self.take(range(len(self))[i])
        return self.take([i])[0]

    def take(self, indices) -> list[Problem]:
        """The problems at `indices` (of the whole file's usable rows), on every process."""
        rows = [int(self._rows[i]) for i in indices]
        if self._shard.count == 1:
            return [self._local[r] for r in rows]
        mine = {r: self._local[r].to_json() for r in rows if self._shard.owns(r)}
        found = {}
        for part in self._gather(json.dumps(mine).encode()):
            found.update({int(r): p for r, p in json.loads(part).items()})
        return [Problem.from_json(found[r]) for r in rows]


def take(problems: Sequence[Problem], indices) -> list[Problem]:
    """`problems[i]` for each of `indices`: one exchange for a `Problems`, a list indexed."""
    if isinstance(problems, Problems):
        return problems.take(indices)
    return [problems[i] for i in indices]
