"""Answer extraction, equivalence, the verifier pool's timeouts, and a run's reward
functions: ours, verl's and TRL's conventions, several with weights."""

import importlib.machinery
import json
import signal
import subprocess
import sys
import time
import types

import numpy as np
import pytest

from explore_rl import config as config_lib
from explore_rl import testing
from explore_rl.answers import after_hash, extract_answer, last_boxed, last_number
from explore_rl.rewards.math import Scores, Verifier, correct, equivalent, format_reward


def test_extraction():
    assert last_boxed(r"so \boxed{1} no, \boxed{\frac{a}{b^{2}}} done") == r"\frac{a}{b^{2}}"
    assert last_boxed(r"\fbox{7}") == "7" and last_boxed(r"\boxed{unclosed") is None
    assert after_hash("work\n#### 1,234\n") == "1,234" and after_hash("no hash") is None
    assert last_number("It costs $1,234.50, not -3 or .5 ... 42.") == "42"
    assert last_number("minus -7") == "-7" and last_number("none") is None
    assert extract_answer(r"\boxed{3} then 4") == "3"
    assert extract_answer("then 4", ("boxed", "last_number")) == "4"
    assert extract_answer("then 4", ("boxed",)) is None
    with pytest.raises(ValueError, match="'last'"):
        extract_answer("x", ("last",))
    assert format_reward(r"\boxed{2}") == 1.0 and format_reward("2") == 0.0


@pytest.mark.parametrize(
    "pred,ref",
    [
        ("1/2", "0.5"),
        ("0.5", r"\frac{1}{2}"),
        (r"\dfrac{1}{2}", "1/2"),
        ("12", "12.0"),
        ("1,234", "1234"),
        (r"2\sqrt{2}", r"\sqrt{8}"),
        (r"\text{14}", "14"),
        ("x = 3", "3"),
    ],
)
def test_equivalent_forms(pred, ref):
    assert equivalent(pred, ref)


@pytest.mark.parametrize("pred,ref", [("3", "4"), (None, "1"), ("0.5", "1/3"), ("", "0")])
def test_different_answers(pred, ref):
    assert not equivalent(pred, ref)


def test_binary_reward():
    assert correct(r"The answer is \boxed{\frac{1}{2}}.", "0.5")
    assert correct("so 3 + 4 = 7", "7") and not correct("so 3 + 4 = 8", "7")


def ignores_its_timer(*_):
    """Stands for a verifier stuck in C code, which no signal interrupts."""
    signal.signal(signal.SIGALRM, signal.SIG_IGN)
    time.sleep(60)
    return 1.0


@pytest.fixture
def busy_neighbours():
    """Two processes spinning on the CPU for the test's duration: a slow, loaded machine,
    where a cold worker importing sympy would run past a 1 s item timer."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    yield
    for p in procs:
        p.kill()
        p.wait()


@pytest.mark.slow
def test_verifier_pool_scores_and_times_out(busy_neighbours):
    with Verifier(workers=2, timeout=1.0) as v:
        start = time.monotonic()
        # (10^(10^7))! sends sympy into a computation that does not finish
        items = [(r"\boxed{(10^{10^{7}})!}", "1"), (r"\boxed{0.5}", "1/2"), ("it is 3", "4")]
        scores = v.score(items)
        assert scores.rewards == [0.0, 1.0, 0.0] and scores.timeouts == 1
        assert time.monotonic() - start < 30
    with Verifier(workers=1, timeout=0.5, fn=ignores_its_timer) as v:
        start = time.monotonic()
        scores = v.score([("a", "b")])
        assert scores.rewards == [0.0] and scores.timeouts == 1 and time.monotonic() - start < 30
        v.fn = correct  # the killed pool is rebuilt, warm, for the next batch
        assert v.score([(r"\boxed{0.5}", "1/2")]) == Scores([1.0], 0, 0)
        assert v.timeouts_total == 1 and v.warmup_s > 0


def worker_main(response, reference):
    """1 when the worker did not import its parent's main module."""
    return float(getattr(sys.modules["__main__"], "__file__", None) is None)


@pytest.mark.slow
def test_workers_skip_the_packages_entry_point_and_keep_a_users_script(tmp_path, monkeypatch):
    """Spawned workers re-import the parent's main module: `python -m explore_rl.main`'s is
    JAX and the trainer, which a worker does not need; a user's script's may hold the
    reward function itself."""
    entry = types.ModuleType("__main__")
    entry.__spec__ = importlib.machinery.ModuleSpec("explore_rl.main", None)
    monkeypatch.setitem(sys.modules, "__main__", entry)
    with Verifier(workers=1, timeout=20.0) as v:
        assert v.score([("a", "b")], worker_main) == Scores([1.0], 0, 0)
    script = tmp_path / "train.py"
    script.write_text("def reward(response, reference):\n    return 0.5\n")
    user = types.ModuleType("__main__")
    user.__file__, user.__spec__ = str(script), None
    exec(script.read_text(), user.__dict__)
    monkeypatch.setitem(sys.modules, "__main__", user)
    with Verifier(workers=1, timeout=20.0) as v:
        assert v.score([("a", "b")], user.reward) == Scores([0.5], 0, 0)


def takes_three(response, problem, extra):
    return 0.0


def hangs(response, problem):
    time.sleep(60)
    return 1.0


def raises_on_odd_length(response, problem):
    if len(response) % 2:
        raise RuntimeError("a reward function's bug")
    return 1.0


def returns_a_string(response, problem):
    return "1.0"


def allocates_without_bound(*_):
    chunks = []
    while True:
        chunks.append(bytearray(1 << 28))


@pytest.mark.slow
def test_a_reward_that_raises_allocates_without_bound_or_is_a_string_is_counted():
    with Verifier(workers=1, timeout=20.0, memory_mb=2048) as v:
        assert v.score([("a", None), ("ab", None)], raises_on_odd_length) == Scores(
            [0.0, 1.0], 0, 1
        )
        assert v.score([("x", None)], allocates_without_bound) == Scores([0.0], 0, 1)
        # a string is the function's error, not a number read from its text
        assert v.score([("x", None)], returns_a_string) == Scores([0.0], 0, 1)
        assert v.score([(r"\boxed{0.5}", "1/2")]) == Scores([1.0], 0, 0)  # the workers go on
        assert v.errors_total == 3


def test_reward_registry_and_config_errors(tmp_path, monkeypatch):
    from configs import grpo
    from explore_rl import config as config_lib
    from explore_rl.data.tasks import Problem
    from explore_rl.rewards import registry

    (tmp_path / "broken_syntax.py").write_text("def f(response, problem):\n    return (1\n")
    (tmp_path / "raises_at_import.py").write_text(
        "import os\n\nTABLE = os.environ['REWARD_TABLE']\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delenv("REWARD_TABLE", raising=False)
    c = grpo.get_config("smoke")
    (math,) = registry.build(c.reward).functions
    assert math.fn(r"so \boxed{7}", Problem("3 + 4?", "7")) == 1.0
    assert math.fn("so 8", Problem("3 + 4?", "7")) == 0.0
    c.reward.fn = testing.PARITY  # a user's function: any f(response, problem)
    assert registry.build(c.reward) == registry.Reward(
        (registry.Function("parity_of_length", testing.parity_of_length),)
    )
    for bad, message in [
        ("test_rewards", "give 'module.path:name'"),
        ("no_such_module_xyz:f", "cannot import no_such_module_xyz"),
        ("test_rewards:nothing", "test_rewards has no 'nothing'"),
        ("broken_syntax:f", f"{tmp_path / 'broken_syntax.py'}:2: "),  # file and line, one line
        ("raises_at_import:f", r"raised KeyError: 'REWARD_TABLE' \(.*raises_at_import.py:3\)"),
        ("test_rewards:takes_three", r"takes \(response, problem, extra\): give f\(response"),
        ("math, math", "two functions are named 'math'"),
    ]:
        c.reward.fn = bad
        with pytest.raises(ValueError, match=message):
            config_lib.spec(c)
    c.reward.fn = f"math, {testing.PARITY}"
    for weights, message in [("1", "give 2 finite numbers"), ("1, x", "not numbers"),
                             ("1, nan", "give 2 finite numbers")]:  # fmt: skip
        c.reward.weights = weights
        with pytest.raises(ValueError, match=f"reward.weights='{weights}': {message}"):
            config_lib.spec(c)
    c.reward.fn, c.reward.name, c.reward.weights = "", "chess", ""
    with pytest.raises(
        ValueError, match=r"reward.name='chess': known \['countdown', 'data_source', 'math', "
    ):
        config_lib.spec(c)


def verl_score(data_source, solution_str, ground_truth, extra_info=None):
    """verl's custom reward (`custom_reward_function`): every argument read, a dict whose
    "score" is the reward."""
    if data_source != "toy":
        return {"score": -1.0}
    return {"score": float(solution_str.strip() == ground_truth) + extra_info["bonus"]}


def trl_length(prompts, completions, level, **kwargs):
    """TRL's reward: batched, conversational (chat prompts and completions), a dataset
    column as a keyword list; None where it gives no reward."""
    assert all(p[-1]["role"] == "user" for p in prompts)
    return [
        None if lv == "skip" else float(len(c[0]["content"])) for c, lv in zip(completions, level)
    ]


def trl_drops_one(completions, **kwargs):
    return [1.0] * (len(completions) - 1)


def trl_hangs(completions, **kwargs):
    time.sleep(60)


def trl_another_task(completions, **kwargs):
    """TRL's reward for another task's rows: None for each of these."""
    return [None] * len(completions)


@pytest.mark.slow
def test_verl_and_trl_functions_are_called_as_written_and_summed_with_weights():
    from configs import grpo
    from explore_rl.data.tasks import Problem
    from explore_rl.rewards import registry

    row = {"data_source": "toy", "extra_info": {"bonus": 0.5}, "level": "easy",
           "reward_model": {"ground_truth": "7"}}  # fmt: skip
    easy = Problem("3 + 4?", "7", messages=(("user", "3 + 4?"),), columns=row)
    other = Problem("1 + 1?", "2", messages=(("user", "1 + 1?"),),
                    columns={**row, "data_source": "other", "level": "skip"})  # fmt: skip
    items = [("7", easy), ("8 ", easy), ("2", other)]
    c = grpo.get_config("smoke")
    c.reward.fn = "test_rewards:verl_score, test_rewards:trl_length"
    c.reward.weights = "1, 0.5"
    reward = registry.build(c.reward)
    assert reward.describe() == "1 x verl_score (verl), 0.5 x trl_length (trl)"
    # two workers: the batched function is called twice (2 items, then 1), order kept
    with Verifier(workers=2, timeout=2.0) as v:
        scored = reward.score(v, items)
        assert scored.by_function["verl_score"].tolist() == [1.5, 0.5, -1.0]
        assert scored.by_function["trl_length"].tolist()[:2] == [1.0, 2.0]
        assert np.isnan(scored.by_function["trl_length"][2])  # None: no reward, not 0
        # verl 1.5 + 0.5 x 1, 0.5 + 0.5 x 2, -1 (TRL's None adds nothing)
        assert scored.total.tolist() == [2.0, 1.5, -1.0]
        assert scored.correct.tolist() == [True, True, False]  # the first function's > 0
        assert (scored.timeouts, scored.errors) == (0, 0)
        dropped = registry.Function("trl_drops_one", trl_drops_one, "trl").score(v, items)
        assert dropped == Scores([0.0, 0.0, 0.0], 0, 3)  # a wrong count: each item an error
        start = time.monotonic()
        hung = registry.Function("trl_hangs", trl_hangs, "trl").score(v, items)
        assert hung == Scores([0.0, 0.0, 0.0], 3, 0) and time.monotonic() - start < 30


@pytest.mark.slow
def test_reward_functions_of_three_conventions_train_a_verl_parquet(tmp_path, capsys, recwarn):
    """A verl-style Parquet file (chat prompts, data_source, extra_info, reward_model) and
    one function of each convention, weighted: every logged response's reward is the
    weighted sum worked by hand, and each function's mean is logged; a TRL function that
    rewards none of a batch (another task's) adds nothing, its mean is NaN, and numpy
    prints no warning of an empty mean."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from configs import grpo
    from explore_rl.logs import read_metrics
    from explore_rl.train import loop

    rows = [
        {"data_source": "toy", "prompt": [{"role": "user", "content": f"What is {a} + 4?"}],
         "reward_model": {"ground_truth": str(a + 4)}, "extra_info": {"bonus": 0.5},
         "level": "easy"}
        for a in range(8)
    ]  # fmt: skip
    pq.write_table(pa.Table.from_pylist(rows), str(tmp_path / "train.parquet"))
    c = grpo.get_config("smoke")
    c.task.train_path = str(tmp_path / "train.parquet")
    c.task.question_field, c.task.answer_field = "prompt", "reward_model.ground_truth"
    c.reward.fn = f"{testing.PARITY}, test_rewards:verl_score, test_rewards:trl_length, "
    c.reward.fn += "test_rewards:trl_another_task"
    c.reward.weights = "1, 2, 0.5, 3"
    c.train.steps, c.train.eval_every, c.train.samples_to_log = 2, 0, 8
    loop.train(config_lib.spec(c), str(tmp_path / "run"))
    said = capsys.readouterr().err
    assert (
        "reward: 1 x parity_of_length, 2 x verl_score (verl), 0.5 x trl_length (trl), "
        "3 x trl_another_task (trl)" in said
    )
    metrics = read_metrics(str(tmp_path / "run"))
    assert [r["step"] for r in metrics] == [1, 2]
    logged = [
        json.loads(x) for f in sorted((tmp_path / "run" / "samples").iterdir()) for x in open(f)
    ]
    assert logged
    for s in logged:
        text = s["response"]
        by_hand = len(text) % 2 + 2 * (float(text.strip() == s["answer"]) + 0.5) + 0.5 * len(text)
        assert s["reward"] == pytest.approx(by_hand, rel=1e-6)
        assert s["rewards"]["trl_length"] == len(text)  # each function's own, unweighted
    for m in metrics:
        parts = [m[f"reward/{n}/mean"] for n in ("parity_of_length", "verl_score", "trl_length")]
        assert m["reward/mean"] == pytest.approx(parts[0] + 2 * parts[1] + 0.5 * parts[2], 1e-5)
        assert m["reward/accuracy"] == pytest.approx(parts[0])  # correct: the first's > 0
        assert 0 < parts[0] < 1  # both parities: the groups carry signal
        assert np.isnan(m["reward/trl_another_task/mean"])
    assert not [str(w.message) for w in recwarn if issubclass(w.category, RuntimeWarning)]


@pytest.mark.slow
def test_a_hanging_custom_reward_times_out_and_is_counted(tmp_path):
    from configs import grpo
    from explore_rl.logs import read_metrics
    from explore_rl.train import loop

    c = grpo.get_config("smoke")
    c.reward.fn, c.reward.timeout = "test_rewards:hangs", 0.5
    c.train.steps, c.train.eval_every = 1, 0
    loop.train(config_lib.spec(c), str(tmp_path))
    (row,) = read_metrics(str(tmp_path))
    rows = c.rollout.prompts * c.rollout.group_size
    assert row["rollout/verifier_timeouts"] == rows and row["reward/mean"] == 0.0
    c.reward.fn = "test_rewards:raises_on_odd_length"  # the run goes on, the errors counted
    loop.train(config_lib.spec(c), str(tmp_path / "raises"))
    (row,) = read_metrics(str(tmp_path / "raises"))
    assert row["rollout/reward_errors"] > 0 and row["rollout/verifier_timeouts"] == 0


VERL_FILE = """
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return {"score": float(solution_str.strip() == ground_truth)}


def other(response, problem):
    return 0.5
"""


def test_a_reward_file_by_path_is_called_by_its_parameters(tmp_path):
    """`reward.fn=path/to/file.py[:function]` (verl's custom_reward_function.path, its
    name `compute_score` by default): called by its parameters as a module's function is;
    a missing file or function is one line naming it."""
    from configs import grpo
    from explore_rl.data.tasks import Problem
    from explore_rl.rewards import registry

    path = tmp_path / "my_reward.py"
    path.write_text(VERL_FILE)
    c = grpo.get_config("smoke")
    c.reward.fn = f"{path}, {path}:other"
    reward = registry.build(c.reward)
    assert reward.describe() == "1 x compute_score (verl), 1 x other"
    verl, ours = reward.functions
    problem = Problem("3 + 4?", "7")
    assert registry.call_verl(verl.fn, "7", problem) == 1.0 and ours.fn("x", problem) == 0.5
    for fn, message in [
        (f"{tmp_path}/nope.py", "no such file"),
        (f"{path}:missing", "has no 'missing'"),
    ]:
        c.reward.fn = fn
        with pytest.raises(ValueError, match=f"^config: reward.fn=.*: .*{message}"):
            registry.build(c.reward)


def test_verls_default_reward_dispatches_on_the_rows_data_source():
    """`reward.name=data_source`: verl's default_compute_score routing, each math source's
    answer read where verl's scorer reads it; a source it has no scorer for raises."""
    from explore_rl.data.tasks import Problem
    from explore_rl.rewards.registry import by_data_source

    def row(source):
        return Problem("q", "0.5", columns={"data_source": source})

    assert by_data_source("so #### 0.5", row("openai/gsm8k")) == 1.0
    assert by_data_source("\\boxed{1/2} #### 3", row("openai/gsm8k")) == 0.0  # after ####
    for source in ("HuggingFaceH4/MATH-500", "lighteval/MATH", "math_dapo", "aime24", "numina_x"):
        assert by_data_source("it is \\boxed{\\frac{1}{2}}", row(source)) == 1.0, source
        assert by_data_source("it is 0.5", row(source)) == 0.0, source  # boxed only
    with pytest.raises(NotImplementedError, match="data_source='my/own'"):
        by_data_source("\\boxed{0.5}", row("my/own"))


@pytest.mark.slow
def test_a_reward_file_is_loaded_by_the_spawned_workers(tmp_path):
    """The reward workers are spawned: a file's function reaches them by its path."""
    from configs import grpo
    from explore_rl.data.tasks import Problem
    from explore_rl.rewards import registry

    path = tmp_path / "my_reward.py"
    path.write_text(VERL_FILE)
    c = grpo.get_config("smoke")
    c.reward.fn, c.reward.name = f"{path}, data_source", "math"
    reward = registry.build(c.reward)
    gsm8k = Problem("q", "7", columns={"data_source": "openai/gsm8k"})
    with Verifier(workers=1, timeout=20.0) as v:
        scored = reward.score(v, [("7", gsm8k), ("#### 7", gsm8k)])
    assert scored.by_function["compute_score"].tolist() == [1.0, 0.0]
    assert scored.by_function["data_source"].tolist() == [0.0, 1.0]
    assert scored.errors == 0
