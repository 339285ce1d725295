"""The arithmetic task."""

import pytest

from explore_rl.data import tasks


def test_arithmetic_is_deterministic_exact_and_split():
    a = tasks.make_arithmetic(50, seed=3, num_operands=3, max_digits=2, ops="+-*")
    assert a == tasks.make_arithmetic(50, seed=3, num_operands=3, max_digits=2, ops="+-*")
    for p in a:
        expr = p.question.removeprefix("What is ").removesuffix("?")
        assert int(p.answer) == eval(expr)  # Python's precedence is the stated one
    train = {p.question for p in tasks.make_arithmetic(300, seed=0)}
    test = {p.question for p in tasks.make_arithmetic(100, seed=0, split="test")}
    assert not train & test and len(train) + len(test) == 100  # 1-digit a + b: 100 in all
    with pytest.raises(ValueError, match="ops='/'"):
        tasks.make_arithmetic(1, ops="/")
