"""Answer extraction, equivalence, and the verifier pool's timeouts."""

import signal
import subprocess
import sys
import time

import pytest

from explore_rl.rewards.math import (
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
        rewards, timeouts = v.score(items)
        assert rewards == [0.0, 1.0, 0.0] and timeouts == 1
        assert time.monotonic() - start < 30
    with Verifier(workers=1, timeout=0.5, fn=ignores_its_timer) as v:
        start = time.monotonic()
        rewards, timeouts = v.score([("a", "b")])
        assert rewards == [0.0] and timeouts == 1 and time.monotonic() - start < 30
        v.fn = correct  # the killed pool is rebuilt, warm, for the next batch
        assert v.score([(r"\boxed{0.5}", "1/2")]) == ([1.0], 0)
        assert v.timeouts_total == 1 and v.warmup_s > 0
