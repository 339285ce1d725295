"""Tasks: the embedded arithmetic questions, and JSONL datasets with presets.

The embedded default task: arithmetic questions with exact integer answers.

Deterministic from a seed. Each expression belongs to one split by a hash of its text
(20% test), so train and test never share a question; within a split, questions repeat only
once the split's distinct questions are used up (e.g. 1-digit + 1-digit has 100 in all).

    make_arithmetic(8, seed=0, num_operands=2, min_digits=1, max_digits=2, ops="+-")

Dataset files (the `jsonl` task) are rows of fields: JSONL, a JSON array of objects,
Parquet, or a Hugging Face `datasets` folder written by `save_to_disk`. Datasets name their
question and answer fields differently, nest them (verl's `reward_model.ground_truth`: a
dotted path), and some keep the answer inside a solution; a `JsonlSpec` says where to
look, and `JSONL_PRESETS` covers the benchmark files in the project's `data/` folder:

    read_problems("data/gsm8k/test.jsonl", JSONL_PRESETS["gsm8k"])
    read_problems("train.parquet", JsonlSpec("extra_info.question", "reward_model.ground_truth"))
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import inspect
import itertools
import json
import logging
import math
import operator
import os
import zlib

import numpy as np

from explore_rl.registry import Registry
from explore_rl.rewards.math import after_hash, last_boxed

# `task.name` -> f(task section, seed) -> (train problems, {benchmark: problems}); a new
# task may be its own module explore_rl/data/<name>.py. A task that takes `shard` returns
# only the training problems of the rows that shard owns, each with its `row` (`load`).
TASKS = Registry("task.name", package="explore_rl.data")
register, get = TASKS.register, TASKS.get


@dataclasses.dataclass(frozen=True)
class Shard:
    """The rows of a dataset one process of a run reads: row i when i % count == index
    (interleaved, so every shard sees the whole file's mix)."""

    index: int = 0
    count: int = 1

    def owns(self, row: int) -> bool:
        return row % self.count == self.index


WHOLE = Shard()  # one process: every row


_OPS = {"+": operator.add, "-": operator.sub, "*": operator.mul}
_SPLITS = ("train", "test")


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

    @property
    def id(self) -> str:
        """Stable across runs and processes (a hash of question and answer; the prefix is
        not part of it), so an explorer can keep per-problem memory."""
        digest = hashlib.sha1(f"{self.question}\x00{self.answer}".encode())
        return digest.hexdigest()[:16]


def _operand(rng: np.random.Generator, min_digits: int, max_digits: int) -> int:
    digits = int(rng.integers(min_digits, max_digits + 1))
    low = 0 if digits == 1 else 10 ** (digits - 1)
    return int(rng.integers(low, 10**digits))


def make_arithmetic(
    n: int,
    seed: int = 0,
    split: str = "train",
    num_operands: int = 2,
    min_digits: int = 1,
    max_digits: int = 1,
    ops: str = "+",
    style: str = "expression",
) -> list[Problem]:
    """n questions with exact answers. style "expression": "What is a + b * c?" with the
    usual precedence (Python's); "word": a one-step word problem per operator (two
    operands; subtraction never goes below zero)."""
    if style not in ("expression", "word"):
        raise ValueError(f"style={style!r}: allowed expression, word")
    if style == "word" and num_operands != 2:
        raise ValueError(f"style='word' takes num_operands=2, got {num_operands}")
    if split not in _SPLITS:
        raise ValueError(f"split={split!r}: allowed {sorted(_SPLITS)}")
    if not ops or set(ops) - set(_OPS):
        raise ValueError(f"ops={ops!r}: use characters from {''.join(_OPS)}")
    if not 1 <= min_digits <= max_digits:
        raise ValueError(
            f"digits must satisfy 1 <= min_digits <= max_digits, got {min_digits}..{max_digits}"
        )
    if num_operands < 2:
        raise ValueError(f"num_operands={num_operands}: need at least 2")
    # Questions repeat only once every distinct one of the split is taken; draws that
    # would repeat are skipped until i = 100 n, a point the loop jumps to when it knows
    # there is nothing new left (small spaces such as 1-digit sums have under 100).
    distinct = _distinct_count(split, num_operands, min_digits, max_digits, ops, style, 20 * n)
    problems, seen, i = [], set(), 0
    while len(problems) < n:
        if len(seen) == distinct and i < 100 * n:
            i = 100 * n
        rng = np.random.default_rng([seed, i])
        i += 1
        nums, signs = _draw(rng, num_operands, min_digits, max_digits, ops, style)
        expr = _expression(nums, signs)
        if split_of(expr) != split or (expr in seen and i <= 100 * n):
            continue
        seen.add(expr)
        question = f"What is {expr}?" if style == "expression" else _word(rng, nums, signs[0])
        problems.append(Problem(question, str(_evaluate(nums, signs))))
    return problems


def _draw(rng, num_operands, min_digits, max_digits, ops, style):
    nums = [_operand(rng, min_digits, max_digits) for _ in range(num_operands)]
    signs = [ops[int(k)] for k in rng.integers(0, len(ops), num_operands - 1)]
    if style == "word" and signs[0] == "-" and nums[0] < nums[1]:
        nums.reverse()
    return nums, signs


def _expression(nums: list[int], signs: list[str]) -> str:
    return " ".join([str(nums[0])] + [f"{s} {x}" for s, x in zip(signs, nums[1:])])


@functools.cache
def _distinct_count(split, num_operands, min_digits, max_digits, ops, style, limit) -> float:
    """How many distinct expressions `make_arithmetic` can draw for `split`; inf, without
    enumerating, when the space has over `limit` expressions (20 n: a split then holds far
    more than the n asked for, so it is never used up; inf only means no shortcut)."""
    numbers = [
        x
        for d in range(min_digits, max_digits + 1)
        for x in range(0 if d == 1 else 10 ** (d - 1), 10**d)
    ]
    if len(numbers) ** num_operands * len(ops) ** (num_operands - 1) > limit:
        return math.inf
    found = set()
    for nums in itertools.product(numbers, repeat=num_operands):
        for signs in itertools.product(sorted(set(ops)), repeat=num_operands - 1):
            nums_ = list(nums)
            if style == "word" and signs[0] == "-" and nums_[0] < nums_[1]:
                nums_.reverse()
            expr = _expression(nums_, list(signs))
            if split_of(expr) == split:
                found.add(expr)
    return len(found)


_NAMES = ("Tom", "Ana", "Li", "Sara", "Omar", "Maya")
_ITEMS = ("apples", "marbles", "books", "stickers", "coins", "pencils")
_WORD = {
    "+": "{name} has {a} {item} and gets {b} more. How many {item} does {name} have now?",
    "-": "{name} has {a} {item} and gives away {b}. How many {item} does {name} have left?",
    "*": "{name} buys {a} bags with {b} {item} in each. How many {item} is that in all?",
}


def _word(rng: np.random.Generator, nums: list[int], sign: str) -> str:
    name = _NAMES[int(rng.integers(len(_NAMES)))]
    item = _ITEMS[int(rng.integers(len(_ITEMS)))]
    return _WORD[sign].format(name=name, item=item, a=nums[0], b=nums[1])


def split_of(text: str) -> str:
    return "test" if zlib.crc32(text.encode()) % 10 < 2 else "train"


def _evaluate(nums: list[int], signs: list[str]) -> int:
    # Multiplication binds first, then + and - left to right.
    terms, pending = [nums[0]], []
    for s, x in zip(signs, nums[1:]):
        if s == "*":
            terms[-1] *= x
        else:
            pending.append(s)
            terms.append(x)
    total = terms[0]
    for s, x in zip(pending, terms[1:]):
        total = _OPS[s](total, x)
    return total


@dataclasses.dataclass(frozen=True)
class JsonlSpec:
    question_field: str = "question"
    answer_field: str = "answer"
    # How the reference answer is taken from the answer field: "field" (as is), "hash"
    # (after '####'), "boxed" (last \boxed{}), "list" (first element of a list).
    answer_from: str = "field"


JSONL_PRESETS = {
    "gsm8k": JsonlSpec("question", "answer", "hash"),
    "math500": JsonlSpec("problem", "answer"),
    "aime24": JsonlSpec("problem", "answer"),
    "amc23": JsonlSpec("question", "answer"),
    "minerva_math": JsonlSpec("problem", "solution", "boxed"),
    "olympiadbench": JsonlSpec("question", "final_answer", "list"),
    "gaokao2023en": JsonlSpec("question", "answer"),
}


def _reference(value, how: str) -> str | None:
    if how == "list":
        value = value[0] if isinstance(value, list) and value else None
    if value is None:
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)  # AMC's 27.0 is the integer 27
    text = str(value).strip()
    if how == "hash":
        return after_hash(text)
    if how == "boxed":
        return last_boxed(text)
    return text.strip("$").strip() or None


def read_rows(path: str, shard: Shard = WHOLE):
    """(row index, where, row) of each row of a dataset file or folder that `shard` owns:
    `where` is a line number for JSONL, an index for JSON arrays, Parquet and `datasets`
    folders. Rows of other shards are not parsed (JSONL) or not converted (Arrow)."""
    if os.path.isdir(path):  # datasets.save_to_disk: state.json names the Arrow files
        state = os.path.join(path, "state.json")
        if not os.path.exists(state):
            raise ValueError(f"{path}: a folder, but not a datasets save_to_disk folder")
        import pyarrow as pa

        with open(state) as f:
            files = [d["filename"] for d in json.load(f)["_data_files"]]
        first = 0
        for name in files:
            with pa.memory_map(os.path.join(path, name)) as source:
                for batch in pa.ipc.open_stream(source):
                    yield from _owned(batch, first, shard)
                    first += batch.num_rows
    elif path.endswith(".parquet"):
        import pyarrow as pa
        import pyarrow.parquet as pq

        try:
            table = pq.ParquetFile(path)
        except pa.ArrowInvalid as e:
            raise ValueError(f"{path}: not a Parquet file ({e})") from None
        first = 0
        for batch in table.iter_batches():
            yield from _owned(batch, first, shard)
            first += batch.num_rows
    elif path.endswith(".json"):
        with open(path, encoding="utf-8") as f:
            try:
                rows = json.load(f)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}: not valid JSON ({e})") from None
            except UnicodeDecodeError as e:
                raise ValueError(f"{path}: not UTF-8 text (byte {e.start}: {e.reason})") from None
        if not isinstance(rows, list):
            raise ValueError(f"{path}: a .json dataset must be an array of objects")
        yield from ((i, f"row {i}", r) for i, r in enumerate(rows) if shard.owns(i))
    else:
        with open(path, "rb") as f:  # decoded a line at a time, so a bad byte names its line
            rows = ((n, line) for n, line in enumerate(f, 1) if line.strip())
            for i, (n, line) in enumerate(rows):
                if shard.owns(i):
                    try:
                        yield i, f"line {n}", json.loads(line.decode("utf-8"))
                    except UnicodeDecodeError as e:
                        raise ValueError(
                            f"{path}:{n}: not UTF-8 text (byte {e.start}: {e.reason})"
                        ) from None
                    except json.JSONDecodeError:
                        yield i, f"line {n}", _MALFORMED


def _owned(batch, first: int, shard: Shard):
    """The rows of an Arrow record batch (rows first, first + 1, ...) that `shard` owns."""
    mine = [j for j in range(batch.num_rows) if shard.owns(first + j)]
    if not mine:  # a batch shorter than the shard count may hold none (Arrow cannot take [])
        return
    rows = batch.take(mine).to_pylist() if len(mine) < batch.num_rows else batch.to_pylist()
    yield from ((first + j, f"row {first + j}", r) for j, r in zip(mine, rows))


_MISSING = object()
_MALFORMED = object()  # a JSONL line that is not JSON (a torn write, a bad export)


def field(row, dotted: str):
    """The value at a dotted path ("reward_model.ground_truth"); _MISSING if absent."""
    for part in dotted.split("."):
        if not isinstance(row, dict) or part not in row:
            return _MISSING
        row = row[part]
    return row


def read_problems(
    path: str, spec: JsonlSpec, strict: bool = False, shard: Shard = WHOLE
) -> list[Problem]:
    """Problems from a dataset file or folder (`read_rows`), of the rows `shard` owns. A
    missing field is an error naming the row (the spec, not the row, is wrong); a JSONL
    line that is not JSON and a row with an empty question or answer are skipped with a
    warning naming them (an error when `strict`, or, read whole, when no row is usable):
    real files have a few (gaokao2023en line 168)."""
    if spec.answer_from not in ("field", "hash", "boxed", "list"):
        raise ValueError(f"answer_from={spec.answer_from!r}: allowed field, hash, boxed, list")
    if not os.path.exists(path):
        raise ValueError(f"{path}: no such dataset file or folder")
    problems, empty = [], []
    for i, where, row in read_rows(path, shard):
        if row is _MALFORMED:
            if strict:
                raise ValueError(f"{path}: {where}: not valid JSON")
            empty.append(f"{where} (not JSON)")
            continue
        values = [field(row, f) for f in (spec.question_field, spec.answer_field)]
        for name, value in zip((spec.question_field, spec.answer_field), values):
            if value is _MISSING:
                fields = sorted(row) if isinstance(row, dict) else type(row).__name__
                raise ValueError(f"{path}: {where}: no field {name!r} (fields: {fields})")
        question, messages = _question(values[0])
        answer = _reference(values[1], spec.answer_from)
        if question and answer:
            problems.append(Problem(question, answer, row=i, messages=messages))
        else:
            empty.append(where)
    if empty and strict:
        raise ValueError(
            f"{path}: {empty[0]}: empty question or no {spec.answer_from} answer "
            f"in {spec.answer_field!r}"
        )
    if empty:
        logging.warning(
            "%s: skipped %d rows: not JSON, or no question or answer (%s)",
            path,
            len(empty),
            empty[:10],
        )
    if not problems and shard.count == 1:  # a shard's may be empty: the run checks the sum
        raise ValueError(f"{path}: no usable rows ({len(empty)} skipped: {empty[:3]})")
    return problems


def _question(value) -> tuple[str, tuple[tuple[str, str], ...]]:
    """(question text, chat messages) of a question field: a string, or a chat given as a
    list of {"role", "content"} (its question: the last user message's content)."""
    chat = (
        isinstance(value, list)
        and value
        and all(isinstance(m, dict) and {"role", "content"} <= m.keys() for m in value)
    )
    if not chat:
        return str(value).strip(), ()
    messages = tuple((str(m["role"]), str(m["content"])) for m in value)
    users = [content for role, content in messages if role == "user"]
    return (users[-1] if users else messages[-1][1]).strip(), messages


def load(name: str, section, seed: int, shard: Shard = WHOLE):
    """Task `name`'s training problems of `shard` and its test sets. A task that takes
    `shard` reads only those rows (a big file is not parsed by every process); any other
    is made whole and cut here."""
    fn = get(name)
    if "shard" in inspect.signature(fn).parameters:
        return fn(section, seed, shard=shard)
    train, test = fn(section, seed)
    return [dataclasses.replace(p, row=i) for i, p in enumerate(train) if shard.owns(i)], test


def benchmark_name(path: str) -> str:
    """A test set's name: its file's stem ("data/aime24.jsonl" -> "aime24"), or its
    folder's when the stem is a split name ("data/gsm8k/test.jsonl" -> "gsm8k")."""
    path = path.rstrip("/")
    stem = os.path.splitext(os.path.basename(path))[0]
    if stem in (
        "test",
        "train",
        "validation",
        "val",
        "dev",
        "data",
    ) and os.path.dirname(path):
        return os.path.basename(os.path.dirname(path))
    return stem


@register("arithmetic")
def arithmetic_task(t, seed: int):
    """Arithmetic questions generated in code (`make_arithmetic`), test split held out."""
    kw = dict(
        num_operands=t.num_operands,
        min_digits=t.min_digits,
        max_digits=t.max_digits,
        ops=t.ops,
        style=t.style,
    )
    return (
        make_arithmetic(t.train_size, seed, "train", **kw),
        {"arithmetic": make_arithmetic(t.test_size, seed, "test", **kw)},
    )


# The project's benchmark files (a clone or an editable install): data/<preset>/*.jsonl.
DATA_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(__file__))), "data")


def preset_paths(preset: str) -> tuple[str, str]:
    """(train file or "", test file) of a preset's folder in the project's `data/`."""
    folder = os.path.join(DATA_DIR, preset)
    test = os.path.join(folder, "test.jsonl")
    if not os.path.isfile(test):
        raise ValueError(f"task.preset={preset!r}: no {test} (the project's data/ folder)")
    train = os.path.join(folder, "train.jsonl")
    return (train if os.path.isfile(train) else ""), test


@register("jsonl")
def jsonl_task(t, seed: int, shard: Shard = WHOLE):
    """Problems from dataset files (JSONL, JSON array, Parquet, `datasets` folder):
    `train_path`, and `test_paths` (comma-separated; each named by `benchmark_name`, read
    with the preset of that name when there is one); checked by `config.validate`. A
    preset alone reads its own files from the project's `data/` (`task.preset=math500`
    evaluates on MATH500; its training set is empty unless the folder has `train.jsonl`
    or `train_path` is given). Of the training file, the rows of `shard`; the test sets
    whole."""
    spec = JSONL_PRESETS.get(t.preset) or JsonlSpec(t.question_field, t.answer_field, t.answer_from)
    train_path, test_paths = t.train_path, t.test_paths
    if t.preset and not (train_path and test_paths):  # the preset's own files fill the gaps
        preset_train, preset_test = preset_paths(t.preset)
        train_path, test_paths = train_path or preset_train, test_paths or preset_test
    test = {}
    for path in filter(None, (p.strip() for p in test_paths.split(","))):
        name = benchmark_name(path)
        if name in test:
            raise ValueError(f"task.test_paths: two test sets are named {name!r} ({path})")
        test[name] = read_problems(path, JSONL_PRESETS.get(name, spec))
    return (read_problems(train_path, spec, shard=shard) if train_path else []), test
