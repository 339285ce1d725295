"""Tasks: where a run's problems come from, registered by name (`task.name`).

A task is `f(task section, seed[, shard]) -> (training problems, {benchmark: problems})`,
registered with `@register("<name>")` in its own module `explore_rl/data/<name>.py`
(imported on first use): `arithmetic` (questions generated in code), `jsonl` (dataset
files, with presets for the project's benchmark files). A task whose problems have several
solutions may register a key saying which one a correct response found (`solutions`:
Countdown's expression tree); the evaluation counts each problem's distinct keys.

    train, tests = load("arithmetic", spec.task, seed=0)
"""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
import zlib
from collections.abc import Callable, Hashable

from explore_rl.registry import Registry

# `task.name` -> f(task section, seed) -> (train problems, {benchmark: problems}); a new
# task may be its own module explore_rl/data/<name>.py. A task that takes `shard` returns
# only the training problems of the rows that shard owns, each with its `row` (`load`).
TASKS = Registry("task.name", package="explore_rl.data")
get = TASKS.get
# A task's own knobs, by its name: a frozen dataclass whose defaults make the config
# section `task.<name>`; the task reads them typed, as `task.own` (`spec.TaskSpec`).
SETTINGS: dict[str, type] = {}
# A task's solution key, by its name: `f(correct response) -> key`, equal keys the same
# solution (`eval.diversity` counts each problem's distinct keys); a task without one
# has one solution per answer, and nothing to count.
SOLUTIONS: dict[str, Callable[[str], Hashable]] = {}


def register(name: str, settings: type | None = None, solutions=None):
    """Register a task function under `name`, with the settings class of its own knobs and
    its solution key (`SOLUTIONS`), where it has them."""

    def add(fn):
        if settings is not None:
            SETTINGS[name] = settings
        if solutions is not None:
            SOLUTIONS[name] = solutions
        return TASKS.register(name)(fn)

    return add


def settings_of(name: str) -> type | None:
    """The settings class of task `name` (registered, its module imported), if it has one."""
    get(name)
    return SETTINGS.get(name)


def solutions_of(name: str) -> Callable[[str], Hashable] | None:
    """The solution key of task `name` (registered, its module imported), if it has one."""
    get(name)
    return SOLUTIONS.get(name)


def defaults(name: str) -> dict:
    """Task `name`'s own config section, `task.<name>`: its settings' defaults."""
    return dataclasses.asdict(settings_of(name)())


@dataclasses.dataclass(frozen=True)
class Shard:
    """The rows of a dataset one process of a run reads: row i when i % count == index
    (interleaved, so every shard sees the whole file's mix)."""

    index: int = 0
    count: int = 1

    def owns(self, row: int) -> bool:
        return row % self.count == self.index


WHOLE = Shard()  # one process: every row


@dataclasses.dataclass(frozen=True)
class Problem:
    """A question with its reference answer. `prefix`: token ids placed in the assistant
    turn after the generation prompt (ExTra's guided prompts): the policy continues after
    them, the reward sees prefix + response, and the update treats them as prompt."""

    question: str
    answer: str
    prefix: tuple[int, ...] = ()
    # the row of the dataset it came from: the order a run's shards are joined in
    row: int = dataclasses.field(default=0, compare=False)
    # a chat from the data, (role, content) pairs (verl's `prompt`, TRL's conversational
    # datasets): the prompt as written, its own instruction and system message included;
    # `question` is then its last user message (for logs and rewards)
    messages: tuple[tuple[str, str], ...] = ()
    # a worked answer to imitate (supervised fine-tuning's target), where the task has one
    solution: str = dataclasses.field(default="", compare=False)
    # the dataset row it was read from, every column (verl's `data_source`, `extra_info`,
    # `reward_model`; TRL's dataset columns): what a reward function may read; {} for a
    # task generated in code
    columns: dict = dataclasses.field(default_factory=dict, compare=False)

    def to_json(self) -> dict:
        """Its JSON form (`from_json` reads it back): a problem sent between processes or
        kept in a checkpoint's host state."""
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, fields: dict) -> Problem:
        """A problem from `to_json`'s form (tuples came back as lists; a field absent from
        an older form takes its default)."""
        messages = tuple(tuple(m) for m in fields.get("messages", ()))
        prefix = tuple(fields.get("prefix", ()))
        return cls(**{**fields, "prefix": prefix, "messages": messages})

    @property
    def id(self) -> str:
        """Stable across runs and processes (a hash of question and answer; the prefix is
        not part of it), so an explorer can keep per-problem memory."""
        digest = hashlib.sha1(f"{self.question}\x00{self.answer}".encode())
        return digest.hexdigest()[:16]


SPLITS = ("train", "test")  # what `split_of` puts a question in


def split_of(text: str) -> str:
    return "test" if zlib.crc32(text.encode()) % 10 < 2 else "train"


def load(name: str, section, seed: int, shard: Shard = WHOLE):
    """Task `name`'s training problems of `shard` and its test sets. A task that takes
    `shard` reads only those rows (a big file is not parsed by every process); any other
    is made whole and cut here."""
    fn = get(name)
    if "shard" in inspect.signature(fn).parameters:
        return fn(section, seed, shard=shard)
    train, test = fn(section, seed)
    return [dataclasses.replace(p, row=i) for i, p in enumerate(train) if shard.owns(i)], test
