"""Multi-step arithmetic (data/multistep.py): the step verifier by hand (any reduction
order right, nothing else), the generator's expressions against Python's own evaluation,
its solutions all verified and only on the short problems, and its splits disjoint and
stable."""

import pytest

from explore_rl import config as config_lib
from explore_rl.data import multistep as ms
from explore_rl.data import tasks

Q = "(3+5)*(7-2)"


def test_parse_reads_back_what_text_writes():
    tree = ((3, "+", 5), "*", (7, "-", (2, "*", 1)))
    assert ms.text(tree) == "(3+5)*(7-(2*1))" and ms.parse(ms.text(tree)) == tree
    assert ms.parse("4") == 4 and ms.parse("4 + 2") == (4, "+", 2)
    with pytest.raises(ValueError, match="not a multistep question"):
        ms.parse("what is 4+2?")


@pytest.mark.parametrize(
    "response",
    [
        "3+5=8\n7-2=5\n8*5=40",  # left to right
        "7-2=5\n3+5=8\n8*5=40",  # the right side first
        "5+3=8\n7-2=5\n5*8=40",  # + and * in either operand order
        " 3 + 5 = 8 \n\n7-2=5\n8*5=40\n",
    ],
)
def test_every_reduction_order_is_right(response):
    assert ms.steps_reach(response, Q)


@pytest.mark.parametrize(
    "response,why",
    [
        ("3+5=8\n7-2=5\n8*5=41", "a wrong value"),
        ("3+5=8\n2-7=5\n8*5=40", "- in the other operand order"),
        ("8*5=40\n3+5=8\n7-2=5", "an operation before its operands are numbers"),
        ("3+5=8\n7-2=5", "an operation left unreduced"),
        ("3+5=8\n7-2=5\n8*5=40\n40+0=40", "a step past the end"),
        ("3*5=15\n7-2=5\n15*5=75", "an operation the expression does not have"),
        ("40", "the value without steps"),
        ("", "nothing"),
    ],
)
def test_anything_else_is_wrong(response, why):
    assert not ms.steps_reach(response, Q), why


def test_problems_their_values_and_solutions():
    s = ms.Spec(min_ops=2, max_ops=5, solved_ops=3)
    problems = ms.make_multistep(300, seed=0, split="train", settings=s)
    assert len({p.question for p in problems}) == 300
    by_ops = {}
    for p in problems:
        n_ops = sum(p.question.count(op) for op in "+-*")
        by_ops[n_ops] = by_ops.get(n_ops, 0) + 1
        value = eval(p.question)  # Python's own arithmetic: an independent evaluation
        assert str(value) == p.answer and 0 <= value <= s.max_value
        assert bool(p.solution) == (n_ops <= 3)  # worked solutions on short problems only
        if p.solution:
            assert len(p.solution.splitlines()) == n_ops and ms.reward(p.solution, p) == 1.0
    assert set(by_ops) == {2, 3, 4, 5}


def test_the_splits_are_disjoint_stable_and_follow_the_seed():
    train = ms.make_multistep(300, 0, "train")
    test = ms.make_multistep(100, 0, "test")
    assert {p.question for p in train}.isdisjoint(p.question for p in test)
    assert ms.make_multistep(100, 0, "test") == test != ms.make_multistep(100, 1, "test")


def test_the_task_and_its_reward_through_the_config():
    from configs import grpo

    c = grpo.get_config("smoke")
    c.task.name, c.reward.name = "multistep", "multistep"
    c.task.train_size, c.task.test_size = 30, 10
    c.task.multistep = tasks.defaults("multistep")
    c.task.multistep.max_ops = 3
    spec = config_lib.spec(c)
    train, tests = spec.problems()
    # the problems follow task.multistep.problems_seed, not the run's seed: one split a study
    c.seed = 5
    assert config_lib.spec(c).problems() == (train, tests)
    c.task.multistep.problems_seed = 1
    assert config_lib.spec(c).problems()[1] != tests
    assert len(train) == 30 and len(tests["multistep"]) == 10
    (reward,) = spec.reward.fn.functions
    assert all(p.solution and reward.fn(p.solution, p) == 1.0 for p in train)
    c.task.multistep.ops = "+/"
    with pytest.raises(ValueError, match=r"^config: task.multistep.ops='\+/'"):
        config_lib.spec(c)
