"""The arithmetic task."""

import json
import os
import re
import warnings

import numpy as np
import pytest

from explore_rl.data import arithmetic, jsonl, tasks


def test_arithmetic_is_deterministic_exact_and_split():
    a = arithmetic.make_arithmetic(50, seed=3, num_operands=3, max_digits=2, ops="+-*")
    assert a == arithmetic.make_arithmetic(50, seed=3, num_operands=3, max_digits=2, ops="+-*")
    for p in a:
        expr = p.question.removeprefix("What is ").removesuffix("?")
        assert int(p.answer) == eval(expr)  # Python's precedence is the stated one
    train = {p.question for p in arithmetic.make_arithmetic(300, seed=0)}
    test = {p.question for p in arithmetic.make_arithmetic(100, seed=0, split="test")}
    assert not train & test and len(train) + len(test) == 100  # 1-digit a + b: 100 in all
    with pytest.raises(ValueError, match="ops='/'"):
        arithmetic.make_arithmetic(1, ops="/")


def test_word_problems():
    words = arithmetic.make_arithmetic(40, seed=1, ops="+-*", max_digits=2, style="word")
    assert words == arithmetic.make_arithmetic(40, seed=1, ops="+-*", max_digits=2, style="word")
    for p in words:
        a, b = (int(x) for x in re.findall(r"\d+", p.question)[:2])
        if "more" in p.question:
            assert int(p.answer) == a + b
        elif "gives away" in p.question:
            assert int(p.answer) == a - b >= 0
        else:
            assert "in each" in p.question and int(p.answer) == a * b
    with pytest.raises(ValueError, match="num_operands=2"):
        arithmetic.make_arithmetic(1, num_operands=3, style="word")


DATA = os.path.join(os.path.dirname(__file__), "..", "data")  # the project's benchmarks
COUNTS = {
    "gsm8k": 1319,
    "math500": 500,
    "aime24": 30,
    "amc23": 40,
    "minerva_math": 272,
    "olympiadbench": 675,
    "gaokao2023en": 383,
}


def test_jsonl_presets_read_the_project_benchmarks(caplog):
    for name, n in COUNTS.items():
        problems = jsonl.read_problems(
            os.path.join(DATA, name, "test.jsonl"), jsonl.JSONL_PRESETS[name]
        )
        assert len(problems) == n, name
    gsm = jsonl.read_problems(
        os.path.join(DATA, "gsm8k", "test.jsonl"), jsonl.JSONL_PRESETS["gsm8k"]
    )
    assert gsm[0].question.startswith("Janet") and gsm[0].answer == "18"  # "#### 18"
    amc = jsonl.read_problems(
        os.path.join(DATA, "amc23", "test.jsonl"), jsonl.JSONL_PRESETS["amc23"]
    )
    assert amc[0].answer == "27"  # stored as the float 27.0
    assert "skipped 2 rows" in caplog.text and "['line 168', 'line 193']" in caplog.text


def test_jsonl_errors_name_the_line(tmp_path):
    path = tmp_path / "d.jsonl"
    spec = jsonl.JsonlSpec("q", "a", "hash")
    path.write_text('{"q": "1+1", "a": "#### 2"}\n{"q": "2+2", "a": "4"}\n')
    with pytest.raises(ValueError, match=r"d.jsonl: line 2: empty question or no hash answer"):
        jsonl.read_problems(str(path), spec, strict=True)
    assert jsonl.read_problems(str(path), spec) == [tasks.Problem("1+1", "2")]
    path.write_text('{"q": "1+1", "a": "#### 2"}\n{"q": "oops"\n')
    with pytest.raises(ValueError, match=r"d.jsonl: line 2: not valid JSON"):
        jsonl.read_problems(str(path), spec, strict=True)
    assert jsonl.read_problems(str(path), spec) == [tasks.Problem("1+1", "2")]  # skipped
    path.write_text('{"q": "oops"\n{"q": "1+1", "a": "2"}\n')
    with pytest.raises(ValueError, match=r"d.jsonl: no usable rows \(2 skipped"):
        jsonl.read_problems(str(path), spec)
    path.write_text('{"question": "1+1", "a": "2"}\n')
    with pytest.raises(
        ValueError, match=r"d.jsonl: line 1: no field 'q' \(fields: \['a', 'question'\]\)"
    ):
        jsonl.read_problems(str(path), spec)
    # bytes that are not UTF-8 (a Latin-1 export), and files that are not what they are named
    path.write_bytes('{"q": "1+1", "a": "2"}\n{"q": "caf\u00e9", "a": "1"}\n'.encode("latin-1"))
    with pytest.raises(ValueError, match=r"d.jsonl:2: not UTF-8 text \(byte 10: invalid"):
        jsonl.read_problems(str(path), spec)
    (tmp_path / "d.json").write_bytes(b'[{"q": "caf\xe9"}]')
    with pytest.raises(ValueError, match=r"d.json: not UTF-8 text \(byte 11"):
        jsonl.read_problems(str(tmp_path / "d.json"), spec)
    (tmp_path / "d.parquet").write_text('{"q": "1+1", "a": "2"}\n')
    with pytest.raises(ValueError, match=r"d.parquet: not a Parquet file \("):
        jsonl.read_problems(str(tmp_path / "d.parquet"), spec)


@tasks.register("test_two_sums")
def two_sums(section, seed):
    """A task defined outside the package: two fixed problems, one held out."""
    return [tasks.Problem("What is 1 + 1?", "2")], {"two": [tasks.Problem("What is 2 + 2?", "4")]}


def test_tasks_are_registered_by_name():
    from configs import grpo
    from explore_rl import config as config_lib

    c = grpo.get_config("smoke")
    train, tests = config_lib.spec(c).problems()
    assert len(train) == c.task.train_size and list(tests) == ["arithmetic"]
    c.task.name = "test_two_sums"
    config_lib.spec(c)
    train, tests = config_lib.spec(c).problems()
    assert train == [tasks.Problem("What is 1 + 1?", "2")] and list(tests) == ["two"]
    c.task.name = "chess"
    with pytest.raises(ValueError, match=r"task.name='chess': known \[.*'arithmetic'.*\]"):
        config_lib.spec(c)


def _reference_arithmetic(n, seed, split):
    """The plain scan `make_arithmetic` shortcuts, for 1-digit sums: every seeded draw in
    order (digit count, then number, per operand; then the operator), repeats skipped
    until draw 100 n."""
    out, seen = [], set()
    for i in range(10**7):
        rng = np.random.default_rng([seed, i])
        nums = []
        for _ in range(2):
            digits = int(rng.integers(1, 2))
            nums.append(int(rng.integers(0, 10**digits)))
        rng.integers(0, 1, 1)  # the operator, always "+"
        expr = f"{nums[0]} + {nums[1]}"
        if tasks.split_of(expr) != split or (expr in seen and i < 100 * n):
            continue
        seen.add(expr)
        out.append(f"What is {expr}?")
        if len(out) == n:
            return out


@pytest.mark.parametrize("split,n", [("train", 150), ("test", 40)])
def test_the_exhausted_space_shortcut_equals_the_plain_scan(split, n):
    # 1-digit sums have 80 train and 20 test questions: both n use their split up
    fast = [p.question for p in arithmetic.make_arithmetic(n, seed=5, split=split)]
    assert fast == _reference_arithmetic(n, 5, split)


ROWS = [
    {"extra_info": {"question": "What is 2 + 2?"}, "reward_model": {"ground_truth": "4"}},
    {"extra_info": {"question": "What is 3 * 3?"}, "reward_model": {"ground_truth": "9"}},
]
NESTED = jsonl.JsonlSpec("extra_info.question", "reward_model.ground_truth")  # verl's fields


def _datasets_folder(path, rows):
    """The layout datasets.Dataset.save_to_disk writes (with the library when installed)."""
    try:
        import datasets

        datasets.Dataset.from_list(rows).save_to_disk(str(path))
        return
    except ImportError:
        pass

    import pyarrow as pa

    os.makedirs(path)
    table = pa.Table.from_pylist(rows)
    with pa.OSFile(str(path / "data-00000-of-00001.arrow"), "wb") as sink:
        with pa.ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table)
    state = {"_data_files": [{"filename": "data-00000-of-00001.arrow"}]}
    (path / "state.json").write_text(json.dumps(state))


def test_every_dataset_format_gives_the_same_problems(tmp_path):

    import pyarrow as pa
    import pyarrow.parquet as pq

    (tmp_path / "d.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    (tmp_path / "d.json").write_text(json.dumps(ROWS))
    pq.write_table(pa.Table.from_pylist(ROWS), str(tmp_path / "d.parquet"))
    _datasets_folder(tmp_path / "folder", ROWS)
    expected = [tasks.Problem("What is 2 + 2?", "4"), tasks.Problem("What is 3 * 3?", "9")]
    for name in ("d.jsonl", "d.json", "d.parquet", "folder"):
        assert jsonl.read_problems(str(tmp_path / name), NESTED) == expected, name
    with pytest.raises(ValueError, match=r"d.json: row 0: no field 'extra_info.q'"):
        jsonl.read_problems(str(tmp_path / "d.json"), jsonl.JsonlSpec("extra_info.q", "x"))
    with pytest.raises(ValueError, match="not a datasets save_to_disk folder"):
        jsonl.read_problems(str(tmp_path), NESTED)


def test_test_sets_are_named_by_their_files(tmp_path):

    from explore_rl import config as config_lib

    for name, q in (("aime24", "problem"), ("amc23", "question")):  # each preset's fields
        (tmp_path / f"{name}.jsonl").write_text(json.dumps({q: f"{name}?", "answer": "1"}) + "\n")
    assert jsonl.benchmark_name("data/gsm8k/test.jsonl") == "gsm8k"
    assert jsonl.benchmark_name(str(tmp_path / "aime24.jsonl")) == "aime24"
    c = config_lib.load("configs/base.py")
    c.task.name, c.task.train_path = "jsonl", str(tmp_path / "amc23.jsonl")
    c.task.test_paths = f"{tmp_path}/aime24.jsonl,{tmp_path}/amc23.jsonl"
    _, test = config_lib.spec(c).problems()
    assert sorted(test) == ["aime24", "amc23"]  # one folder, two names
    c.task.test_paths = f"{tmp_path}/aime24.jsonl,{tmp_path}/aime24.jsonl"
    with pytest.raises(ValueError, match="two test sets are named 'aime24'"):
        config_lib.spec(c).problems()


def test_a_preset_alone_reads_the_projects_benchmark_files():
    from explore_rl import config as config_lib

    c = config_lib.load("configs/grpo.py:smoke")
    c.task.preset = "gsm8k"  # the task becomes 'jsonl'; files from the project's data/
    train, test = config_lib.spec(c).problems()
    assert len(train) == 7473 and list(test) == ["gsm8k"] and len(test["gsm8k"]) == 1319
    assert test["gsm8k"][0].answer == "18"  # the preset's fields: the answer after '####'
    c.task.preset = "math500"  # a test set only
    train, test = config_lib.spec(c).problems()
    assert train == [] and len(test["math500"]) == 500
    c.task.test_paths = "data/aime24/test.jsonl"  # given paths win over the preset's
    assert list(config_lib.spec(c).problems()[1]) == ["aime24"]


@pytest.mark.slow
def test_a_preset_evaluates_from_any_directory_and_cannot_train_without_data(tmp_path):
    """`--config.task.preset=math500` with no path, run outside the clone."""
    from helpers import run_main

    args = ["--config", "configs/grpo.py:smoke", "--config.task.preset=math500"]
    out = run_main(
        "--mode", "eval", *args, "--config.eval.num_prompts=3", "--workdir", "ev", cwd=tmp_path
    )
    assert out.returncode == 0, out.stderr[-2000:]
    record = json.loads((tmp_path / "ev" / "eval.json").read_text())
    assert "eval/math500/pass@1" in record
    # what was evaluated, beside the results
    sizes = record["benchmarks"]["math500"]  # of the prompts that fit the smoke's length
    assert sizes["questions"] == 3 and 400 < sizes["of"] <= 500
    assert record["task"]["preset"] == "math500" and record["checkpoint"] is None
    assert record["sampling"] == {"samples": 2, "temperature": 0.6, "top_p": 0.95,
                                  "max_new_tokens": 8}  # fmt: skip
    lines = (tmp_path / "ev" / "eval_responses.jsonl").read_text().splitlines()
    rows = [json.loads(line) for line in lines]
    assert len({r["question"] for r in rows}) == 3 and {r["benchmark"] for r in rows} == {"math500"}
    assert rows[0]["question"].startswith("Convert the point $(0,3)$")
    out = run_main(*args, "--workdir", "tr", cwd=tmp_path)
    assert out.returncode != 0
    assert "task 'jsonl' has no training problems: set task.train_path" in out.stderr


def test_over_long_prompts_are_found_when_the_data_is_loaded(caplog):
    from explore_rl import config as config_lib
    from explore_rl.models import weights
    from explore_rl.rl.rollout import fit_prompts

    tok = weights.load_tokenizer("embedded")
    c = config_lib.load("configs/grpo.py:smoke")
    fmt = config_lib.prompt_format(c)
    questions = ("1+0?", "word " * 40 + "?", "2+0?")
    problems = [tasks.Problem(q, "1", row=i) for i, q in enumerate(questions)]
    width = max(len(tok.encode(fmt.text(tok, p.question))) for p in problems[::2])
    with caplog.at_level("WARNING"):
        kept, longest = fit_prompts(tok, problems, fmt, width, "skip", "train")
    assert kept == problems[::2] and longest == width
    assert "train: 1 of 3 prompts are longer than rollout.max_prompt_len" in caplog.text
    with pytest.raises(ValueError, match=r"train problem 1 \(of its usable rows; row 1 of the "):
        fit_prompts(tok, problems, fmt, width, "error", "train")
    with pytest.raises(ValueError, match=r"test: every prompt is longer than rollout.max_prompt"):
        fit_prompts(tok, problems, fmt, 3, "skip", "test")
    # one process's shard: none fitting is for the run to judge, with every shard's rows
    assert fit_prompts(tok, problems, fmt, 3, "skip", "train", whole=False) == ([], 0)
    c.task.template_kwargs = "{enable_thinking: false}"
    with pytest.raises(ValueError, match="task.template_kwargs=.*not JSON"):
        config_lib.spec(c)
    c.task.template_kwargs, c.task.raw_prompt = '{"enable_thinking": false}', "Q: {q}"
    with pytest.raises(ValueError, match="task.raw_prompt=.*must contain {question}"):
        config_lib.spec(c)


def test_named_files_are_read_without_naming_the_jsonl_task(tmp_path):
    """`--config.task.train_path=... --config.task.test_paths=...` as
    docs/data_and_rewards.md writes them: the files are the task (the default task,
    arithmetic, reads no file and once trained on generated questions instead, without a
    word)."""
    from explore_rl import config as config_lib

    rows = [{"question": f"{i} + 1?", "answer": str(i + 1)} for i in range(5)]
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "exam.jsonl").write_text(json.dumps(rows[0]) + "\n")
    c = config_lib.load("configs/grpo.py:smoke")
    assert c.task.name == "arithmetic"
    c.task.train_path, c.task.test_paths = (
        str(tmp_path / "train.jsonl"),
        str(tmp_path / "exam.jsonl"),
    )
    config_lib.spec(c)
    train, test = config_lib.spec(c).problems()
    assert [p.question for p in train] == [r["question"] for r in rows]
    assert list(test) == ["exam"] and test["exam"][0].answer == "1"
    c.task.train_path = str(tmp_path / "missing.jsonl")  # now checked as a file, by its key
    with pytest.raises(ValueError, match="task.train_path=.*missing.jsonl: no such file"):
        config_lib.spec(c)


def test_weights_a_random_init_leaves_unread_are_said(tmp_path):
    """The smoke scale's `model.random_init` with a model path: its weights are not read."""
    from explore_rl import config as config_lib
    from explore_rl.data import lab

    c = config_lib.load("configs/grpo.py:smoke")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        config_lib.spec(c)  # the embedded model's tokenizer: nothing to say
    c.model.path = lab.FOLDER  # a tokenizer folder: no weights to leave unread
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        config_lib.spec(c)
    (tmp_path / "config.json").write_text("{}")  # a checkpoint's folder
    c.model.path = str(tmp_path)
    with pytest.warns(UserWarning, match=f"model.path={tmp_path} only the tokenizer is read"):
        config_lib.spec(c)


def test_a_verl_parquet_with_chat_prompts_is_read_as_messages(tmp_path):
    """verl's RL data: `prompt` a chat list (its own instruction inside), the answer in
    `reward_model.ground_truth`. The prompt is those messages through the chat template
    (was: the string of the list, and every reward 0)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from explore_rl import config as config_lib
    from explore_rl.rl import rollout

    chat = [
        {"role": "system", "content": "You are a careful solver."},
        {"role": "user", "content": "What is 3 + 4? Output the answer within \\boxed{}."},
    ]
    rows = [{"data_source": "toy", "prompt": chat, "reward_model": {"ground_truth": "7"}}]
    pq.write_table(pa.Table.from_pylist(rows * 3), str(tmp_path / "train.parquet"))
    c = config_lib.load("configs/grpo.py:smoke")
    c.task.train_path = str(tmp_path / "train.parquet")
    c.task.question_field, c.task.answer_field = "prompt", "reward_model.ground_truth"
    train, _ = config_lib.spec(c).problems()
    p = train[0]
    assert p.question == chat[1]["content"] and p.answer == "7"
    assert p.messages == tuple((m["role"], m["content"]) for m in chat)
    _, tok = config_lib.resolve(c).model.config()
    tokens, mask = rollout.encode(tok, [p], config_lib.prompt_format(c), 512)
    text = tok.decode([t for t, m in zip(tokens[0].tolist(), mask[0].tolist()) if m], False)
    assert text == tok.apply_chat_template(chat)  # as written: no instruction, no 2nd system
    assert "careful solver" in text and "Put the final answer" not in text
