"""The embedded default task: arithmetic questions with exact integer answers.

Deterministic from a seed. Each expression belongs to one split by a hash of its text
(20% test, `tasks.split_of`), so train and test never share a question; within a split,
questions repeat only once the split's distinct questions are used up (e.g. 1-digit +
1-digit has 100 in all).

    make_arithmetic(8, seed=0, num_operands=2, min_digits=1, max_digits=2, ops="+-")
"""

from __future__ import annotations

import functools
import itertools
import math
import operator

import numpy as np

from explore_rl.data.tasks import SPLITS, Problem, register, split_of

_OPS = {"+": operator.add, "-": operator.sub, "*": operator.mul}


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
    if split not in SPLITS:
        raise ValueError(f"split={split!r}: allowed {sorted(SPLITS)}")
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
