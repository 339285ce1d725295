"""Answer extraction, equivalence, and the verifier pool's timeouts."""

import json
import signal
import subprocess
import sys
import time

import pytest

from explore_rl.rewards.math import (
    Scores,
    Verifier,
    after_hash,
    correct,
    equivalent,
    extract_answer,
    format_reward,
    last_boxed,
    last_number,
)


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


def parity_of_length(response, problem):
    """A user's reward (`reward.fn = "test_rewards:parity_of_length"`): any function of the
    response and the problem."""
    return float(len(response) % 2)


def hangs(response, problem):
    time.sleep(60)
    return 1.0


def raises_on_odd_length(response, problem):
    if len(response) % 2:
        raise RuntimeError("a reward function's bug")
    return 1.0


def allocates_without_bound(*_):
    chunks = []
    while True:
        chunks.append(bytearray(1 << 28))


@pytest.mark.slow
def test_a_reward_that_raises_or_allocates_without_bound_is_counted():
    with Verifier(workers=1, timeout=20.0, memory_mb=2048) as v:
        assert v.score([("a", None), ("ab", None)], raises_on_odd_length) == Scores(
            [0.0, 1.0], 0, 1
        )
        assert v.score([("x", None)], allocates_without_bound) == Scores([0.0], 0, 1)
        assert v.score([(r"\boxed{0.5}", "1/2")]) == Scores([1.0], 0, 0)  # the workers go on
        assert v.errors_total == 2


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
    math = registry.build(c.reward)
    assert math(r"so \boxed{7}", Problem("3 + 4?", "7")) == 1.0
    assert math("so 8", Problem("3 + 4?", "7")) == 0.0
    c.reward.fn = "test_rewards:parity_of_length"
    assert registry.build(c.reward) is parity_of_length
    for bad, message in [
        ("test_rewards", "give 'module.path:name'"),
        ("no_such_module_xyz:f", "cannot import no_such_module_xyz"),
        ("test_rewards:nothing", "test_rewards has no 'nothing'"),
        ("broken_syntax:f", f"{tmp_path / 'broken_syntax.py'}:2: "),  # file and line, one line
        ("raises_at_import:f", r"raised KeyError: 'REWARD_TABLE' \(.*raises_at_import.py:3\)"),
    ]:
        c.reward.fn = bad
        with pytest.raises(ValueError, match=message):
            config_lib.spec(c)
    c.reward.fn, c.reward.name = "", "chess"
    with pytest.raises(ValueError, match=r"reward.name='chess': known \['countdown', 'math', "):
        config_lib.spec(c)


@pytest.mark.slow
def test_a_custom_reward_trains_the_smoke_config(tmp_path):
    from configs import grpo
    from explore_rl.logs import read_metrics
    from explore_rl.train import loop

    c = grpo.get_config("smoke")
    c.reward.fn = "test_rewards:parity_of_length"
    c.train.steps, c.train.eval_every, c.train.samples_to_log = 2, 0, 8
    loop.train(c, str(tmp_path))
    rows = read_metrics(str(tmp_path))
    assert [r["step"] for r in rows] == [1, 2]
    logged = [json.loads(x) for f in sorted((tmp_path / "samples").iterdir()) for x in open(f)]
    assert logged and all(s["reward"] == len(s["response"]) % 2 for s in logged)
    assert 0 < rows[0]["reward/mean"] < 1  # both parities: the groups carry signal


@pytest.mark.slow
def test_a_hanging_custom_reward_times_out_and_is_counted(tmp_path):
    from configs import grpo
    from explore_rl.logs import read_metrics
    from explore_rl.train import loop

    c = grpo.get_config("smoke")
    c.reward.fn, c.reward.timeout = "test_rewards:hangs", 0.5
    c.train.steps, c.train.eval_every = 1, 0
    loop.train(c, str(tmp_path))
    (row,) = read_metrics(str(tmp_path))
    rows = c.rollout.prompts * c.rollout.group_size
    assert row["rollout/verifier_timeouts"] == rows and row["reward/mean"] == 0.0
    c.reward.fn = "test_rewards:raises_on_odd_length"  # the run goes on, the errors counted
    loop.train(c, str(tmp_path / "raises"))
    (row,) = read_metrics(str(tmp_path / "raises"))
    assert row["rollout/reward_errors"] > 0 and row["rollout/verifier_timeouts"] == 0
