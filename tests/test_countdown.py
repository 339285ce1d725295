"""Countdown (data/countdown.py): the SoS rules by hand, the verifier against an
independent check, the generator's problems all solvable and its splits disjoint and
stable, the canonical solutions all verified, and the task and its reward through a run's
config."""

import collections
import fractions
import itertools
import re

import pytest

from explore_rl import config as config_lib
from explore_rl.data import countdown as cd
from explore_rl.data import tasks


def independent_check(response: str, numbers, target) -> bool:
    """The rules again, in exact fractions and Python's own arithmetic: each line's two
    operands taken from what is left, its result right, non-negative and whole."""
    left = collections.Counter(numbers)
    lines = [x for x in response.splitlines() if x.strip()]
    for line in lines:
        match = re.fullmatch(r"(\d+)([-+*/])(\d+)=(\d+)", line.strip())
        if match is None:
            return False
        a, op, b, c = match.groups()
        a, b, c = int(a), int(b), int(c)
        if op == "/" and b == 0:
            return False
        value = {"+": a + b, "-": a - b, "*": a * b}[op] if op != "/" else fractions.Fraction(a, b)
        left.subtract([a, b])
        if min(left.values()) < 0 or value != c or value < 0 or value.denominator != 1:
            return False
        left[c] += 1
    return len(lines) == len(numbers) - 1 and +left == collections.Counter([target])


def brute_force_solvable(numbers, target) -> bool:
    """Every expression tree over the numbers (all used), by exhaustive recursion with
    fractions, keeping only the SoS-legal ones (no negative, whole intermediates)."""
    if len(numbers) == 1:
        return numbers[0] == target
    for i, j in itertools.permutations(range(len(numbers)), 2):
        rest = [x for k, x in enumerate(numbers) if k not in (i, j)]
        a, b = numbers[i], numbers[j]
        for value in (a + b, a - b, a * b, fractions.Fraction(a, b) if b else -1):
            if value >= 0 and fractions.Fraction(value).denominator == 1:
                if brute_force_solvable([*rest, int(value)], target):
                    return True
    return False


def test_the_rules_by_hand():
    assert (cd.apply(7, "-", 3), cd.apply(3, "-", 7)) == (4, None)  # no negative result
    assert (cd.apply(12, "/", 4), cd.apply(12, "/", 5), cd.apply(3, "/", 0)) == (3, None, None)
    assert cd.reachable((2, 3)) == {1, 5, 6}  # 3-2, 2+3, 2*3; 2-3 and 3/2 are not legal
    assert cd.reachable((2, 4)) == {2, 6, 8}  # 4-2 = 4/2, 2+4, 2*4
    numbers, target = [12, 34, 5, 8], 57
    good = "34-12=22\n22+5=27\n27*8=216"
    assert not cd.steps_reach(good, numbers, target)  # 216, not 57
    solved = "34+12=46\n46+5=51\n51+8=59"
    assert not cd.steps_reach(solved, numbers, target)
    right = "5+8=13\n34+12=46\n46+13=59"
    assert cd.steps_reach(right, numbers, 59) and independent_check(right, numbers, 59)
    for bad, why in [
        ("5+8=13\n34+12=46\n46+13=60", "arithmetic"),
        ("5+5=10\n34+12=46\n46+10=56", "a number used twice"),
        ("5+8=13\n34+12=46", "an input left unused"),
        ("5+8=13\n34+12=46\n46+13=59\n59-0=59", "a number never given"),
        ("5-8=-3\n34+12=46\n46+13=59", "a negative step"),
        ("5+8=13\n34+12=46\nso 46+13=59", "a line that is not a step"),
        ("", "no answer"),
    ]:
        assert not cd.steps_reach(bad, numbers, 59), why
        assert not independent_check(bad, numbers, 59), why
    assert cd.steps_reach(" 5 + 8 = 13 \n\n34+12=46\n46+13=59\n", numbers, 59)  # spacing


def test_every_problem_is_solvable_and_every_canonical_solution_checks_out():
    settings = cd.Spec(inputs=4, max_input=12)
    problems = cd.make_countdown(150, seed=3, split="train", settings=settings)
    assert len(problems) == 150 and len({p.question for p in problems}) == 150
    chains = 0
    for p in problems:
        numbers, target = cd.parse_question(p.question)
        assert len(numbers) == 4 and 1 <= min(numbers) <= max(numbers) <= 12
        assert 10 <= target <= 100 and p.answer == str(target)
        assert brute_force_solvable(numbers, target), p.question
        if p.solution:  # the canonical chain: no division, the running result in each step
            chains += 1
            assert "/" not in p.solution and cd.reward(p.solution, p) == 1.0
            assert independent_check(p.solution, numbers, target)
            assert cd.family(p) == "chain"
    # the part of the solution space SFT covers on purpose: most problems, not all
    assert 0.5 < chains / len(problems) < 1.0


def test_unsolvable_draws_are_redrawn_not_kept():
    # with inputs in [1, 2] and targets in [50, 60], three numbers reach at most 8
    with pytest.raises(ValueError, match="distinct solvable train problems of 5 asked"):
        cd.make_countdown(5, 0, "train", cd.Spec(inputs=3, max_input=2, min_target=50,
                                                     max_target=60))  # fmt: skip


def test_the_splits_are_disjoint_stable_and_follow_the_seed():
    s = cd.Spec(inputs=3, max_input=15)
    train = cd.make_countdown(300, 0, "train", s)
    test = cd.make_countdown(100, 0, "test", s)
    assert {p.question for p in train}.isdisjoint(p.question for p in test)
    assert all(tasks.split_of(p.question) == "test" for p in test)
    assert cd.make_countdown(100, 0, "test", s) == test  # the same problems on every run
    assert cd.make_countdown(100, 1, "test", s) != test  # and other ones for another seed
    # a question's split does not depend on the seed: no seed's training set holds a test
    # question of another seed
    other_train = cd.make_countdown(300, 1, "train", s)
    assert {p.question for p in other_train}.isdisjoint(p.question for p in test)


def test_distinct_solutions_are_counted_up_to_order():
    a = "5+8=13\n34+12=46\n46+13=59"
    b = "12+34=46\n8+5=13\n13+46=59"  # the same steps, reordered and commuted
    c = "34-5=29\n29+12=41\n41+8=49"
    assert cd.solution_key(a) == cd.solution_key(b) != cd.solution_key(c)


def test_solution_keys_fold_commutativity_not_associativity():
    key = cd.solution_key
    # 3 4 5 -> 12: (3+4)+5 written four ways is one tree
    one = ["3+4=7\n7+5=12", "4+3=7\n5+7=12", " 3 + 4 = 7 \n\n 7 + 5 = 12 ", "04+3=7\n7+5=12"]
    assert len({key(r) for r in one}) == 1
    # the other associations are other trees: 3+(4+5), (3+5)+4
    assert len({key(r) for r in [one[0], "4+5=9\n3+9=12", "3+5=8\n8+4=12"]}) == 3
    # subtraction and division do not commute: 8-2 and 2-8 are not one step
    assert key("8-2=6\n6*2=12") != key("2-8=6\n6*2=12")
    assert key("8/2=4\n4*3=12") != key("2/8=4\n4*3=12")
    # a*b and b*a commute; so does the pair of independent steps' order
    assert key("2*3=6\n4*5=20\n6+20=26") == key("5*4=20\n3*2=6\n20+6=26")
    # 2 2 2 2 -> 8: (2+2)+(2+2) takes one step twice, ((2+2)+2)+2 does not
    assert key("2+2=4\n2+2=4\n4+4=8") != key("2+2=4\n4+2=6\n6+2=8")
    # the problem a study counts solutions of: its tasks' registered key
    assert tasks.solutions_of("countdown") is cd.solution_key
    assert tasks.solutions_of("arithmetic") is None


def test_the_task_and_its_reward_through_the_config():
    from configs import grpo

    c = grpo.get_config("smoke")
    c.task.name, c.reward.name = "countdown", "countdown"
    c.task.train_size, c.task.test_size = 40, 10
    c.task.countdown = tasks.defaults("countdown")
    c.task.countdown.inputs = 4
    spec = config_lib.spec(c)
    assert spec.task.own == cd.Spec(inputs=4)
    train, tests = spec.problems()
    # the problems follow task.countdown.problems_seed, not the run's seed: one split a study
    c.seed = 5
    assert config_lib.spec(c).problems() == (train, tests)
    c.task.countdown.problems_seed = 1
    assert config_lib.spec(c).problems()[1] != tests
    assert len(train) == 40 and list(tests) == ["countdown"] and len(tests["countdown"]) == 10
    assert all(len(cd.parse_question(p.question)[0]) == 4 for p in train)
    solved = next(p for p in train if p.solution)
    (reward,) = spec.reward.fn.functions
    assert reward.fn(solved.solution, solved) == 1.0 and reward.fn("1+1=2", solved) == 0.0
    c.task.countdown.inputs = 9
    with pytest.raises(ValueError, match=r"^config: task.countdown.inputs=9: must be in"):
        config_lib.spec(c)


def test_other_share_solves_that_share_of_the_chainless_problems_by_another_strategy():
    """`other_share`: the training problems are the same draw, k of those without a chain
    get a checked solution by division or two pairs (k / solved >= share, one fewer would
    be below it), spread over the list; the test split and `family` are untouched."""
    spec = cd.Spec(inputs=4, max_input=12)
    plain = cd.make_countdown(1000, 0, "train", spec)
    mixed = cd.make_countdown(1000, 0, "train", cd.Spec(inputs=4, max_input=12, other_share=0.03))
    assert [p.question for p in plain] == [p.question for p in mixed]
    chains = sum(bool(p.solution) for p in plain)
    added = [i for i, (a, b) in enumerate(zip(plain, mixed)) if a.solution != b.solution]
    k = len(added)
    assert k / (chains + k) >= 0.03 > (k - 1) / (chains + k - 1) and k > 10
    for i in added:
        numbers, target = cd.parse_question(plain[i].question)
        assert not plain[i].solution and cd.family(mixed[i]) == "other"
        assert independent_check(mixed[i].solution, numbers, target)
        assert cd.chain_solution(numbers, target) is None  # so it divides or pairs
    assert added[0] < 100 and added[-1] > 900  # spread: a leading pool holds its share
    test = cd.make_countdown(200, 0, "test", cd.Spec(inputs=4, max_input=12, other_share=0.5))
    assert test == cd.make_countdown(200, 0, "test", spec)
    with pytest.raises(ValueError, match="other_share=0.9 needs"):
        cd.make_countdown(100, 0, "train", cd.Spec(inputs=4, other_share=0.9))
    with pytest.raises(ValueError, match=r"task.countdown.other_share=1: must be in \[0, 1\)"):
        cd.Spec(other_share=1)


def test_other_solution_finds_a_division_or_two_pairs_by_hand():
    # neither has a division-free chain: 20 / 5 = 4, 12 + 4 = 16; (2 + 3) * (3 + 3) = 30
    assert cd.chain_solution([20, 5, 12], 16) is None
    assert cd.other_solution([20, 5, 12], 16) == ["20/5=4", "12+4=16"]
    assert cd.chain_solution([2, 3, 3, 3], 30) is None
    assert cd.other_solution([2, 3, 3, 3], 30) == ["2+3=5", "3+3=6", "5*6=30"]
    with pytest.raises(ValueError, match="has no solution"):
        cd.other_solution([1, 1, 1], 50)
