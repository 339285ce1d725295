"""Dataset files as a task (`jsonl`): JSONL, a JSON array of objects, Parquet, or a
Hugging Face `datasets` folder written by `save_to_disk`.

Datasets name their question and answer fields differently, nest them (verl's
`reward_model.ground_truth`: a dotted path), and some keep the answer inside a solution; a
`JsonlSpec` says where to look, and `JSONL_PRESETS` covers the benchmark files in the
project's `data/` folder:

    read_problems("data/gsm8k/test.jsonl", JSONL_PRESETS["gsm8k"])
    read_problems("train.parquet", JsonlSpec("extra_info.question", "reward_model.ground_truth"))
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os

from explore_rl import stages
from explore_rl.answers import after_hash, last_boxed
from explore_rl.data.tasks import WHOLE, Problem, Shard, register


@dataclasses.dataclass(frozen=True)
class JsonlSpec:
    question_field: str = "question"
    answer_field: str = "answer"
    # How the reference answer is taken from the answer field: "field" (as is), "hash"
    # (after '####'), "boxed" (last \boxed{}), "list" (first element of a list).
    answer_from: str = "field"
    solution_field: str = ""  # a worked response (Problem.solution); "" = none
    task: str = ""  # the task that wrote the files, whose solution key they take (tasks.py)


JSONL_PRESETS = {
    "gsm8k": JsonlSpec("question", "answer", "hash"),
    "math500": JsonlSpec("problem", "answer"),
    "aime24": JsonlSpec("problem", "answer"),
    "amc23": JsonlSpec("question", "answer"),
    "minerva_math": JsonlSpec("problem", "solution", "boxed"),
    "olympiadbench": JsonlSpec("question", "final_answer", "list"),
    "gaokao2023en": JsonlSpec("question", "answer"),
    # the lab's fixed Countdown splits (data/lab.py writes them), with SFT's solutions
    "countdown": JsonlSpec("question", "answer", solution_field="solution", task="countdown"),
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
    folders. Rows of other shards are not parsed (JSONL) or not converted (Arrow). A
    library's error on bad bytes (a corrupt Parquet page, say) names the file."""
    with stages.doing(f"reading {path}"):
        yield from _read_rows(path, shard)


def _read_rows(path: str, shard: Shard):
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
        names = [spec.question_field, spec.answer_field, *filter(None, [spec.solution_field])]
        values = [field(row, f) for f in names]
        for name, value in zip(names, values):
            if value is _MISSING:
                fields = sorted(row) if isinstance(row, dict) else type(row).__name__
                raise ValueError(f"{path}: {where}: no field {name!r} (fields: {fields})")
        question, messages = _question(values[0])
        answer = _reference(values[1], spec.answer_from)
        if question and answer:
            solution = str(values[2]) if spec.solution_field else ""
            problems.append(
                Problem(
                    question,
                    answer,
                    row=i,
                    messages=messages,
                    solution=solution,
                    columns=_plain(row),
                )  # fmt: skip
            )
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


def _plain(row: dict) -> dict:
    """A row with every value JSON can hold (a Parquet timestamp or decimal as its text):
    a problem crosses processes and checkpoints as JSON."""
    return json.loads(json.dumps(row, default=str))


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


# The project's data files, data/<preset>/*.jsonl and the lab's tokenizer: the copy a
# wheel installs as explore_rl/benchmarks/, else (a clone, an editable install) data/.
_PACKAGE = os.path.dirname(os.path.dirname(__file__))
_WHEEL = os.path.join(_PACKAGE, "benchmarks")
DATA_DIR = _WHEEL if os.path.isdir(_WHEEL) else os.path.join(os.path.dirname(_PACKAGE), "data")


def preset_paths(preset: str) -> tuple[str, str]:
    """(train file or "", test file) of a preset's folder in the project's `data/`."""
    folder = os.path.join(DATA_DIR, preset)
    test = os.path.join(folder, "test.jsonl")
    if not os.path.isfile(test):
        raise ValueError(f"task.preset={preset!r}: no {test} (the project's data/ folder)")
    train = os.path.join(folder, "train.jsonl")
    return (train if os.path.isfile(train) else ""), test


def files(t) -> tuple[str, list[str]]:
    """(training file or "", test files) the task section names: its own, the gaps filled
    by its preset's."""
    train_path, test_paths = t.train_path, t.test_paths
    if t.preset and not (train_path and test_paths):  # the preset's own files fill the gaps
        preset_train, preset_test = preset_paths(t.preset)
        train_path, test_paths = train_path or preset_train, test_paths or preset_test
    return train_path, [p.strip() for p in test_paths.split(",") if p.strip()]


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
    spec = dataclasses.replace(spec, solution_field=t.solution_field or spec.solution_field)
    train_path, test_paths = files(t)
    test = {}
    for path in test_paths:
        name = benchmark_name(path)
        if name in test:
            raise ValueError(f"task.test_paths: two test sets are named {name!r} ({path})")
        test[name] = read_problems(path, JSONL_PRESETS.get(name, spec))
    return (read_problems(train_path, spec, shard=shard) if train_path else []), test
