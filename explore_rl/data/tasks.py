"""The embedded default task: arithmetic questions with exact integer answers.

Deterministic from a seed. Each expression belongs to one split by a hash of its text
(20% test), so train and test never share a question; within a split, questions repeat only
once the split's distinct questions are used up (e.g. 1-digit + 1-digit has 100 in all).

    make_arithmetic(8, seed=0, num_operands=2, min_digits=1, max_digits=2, ops="+-")
"""

from __future__ import annotations

import dataclasses
import itertools
import operator
import zlib

import numpy as np

_OPS = {"+": operator.add, "-": operator.sub, "*": operator.mul}
_SPLITS = ("train", "test")


@dataclasses.dataclass(frozen=True)
class Problem:
    question: str
    answer: str


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
) -> list[Problem]:
    """n questions "What is a + b?" with exact answers, evaluated left to right with
    the usual precedence (Python's), so the answer is what the question says."""
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
    problems, seen = [], set()
    for i in itertools.count():
        rng = np.random.default_rng([seed, i])
        nums = [_operand(rng, min_digits, max_digits) for _ in range(num_operands)]
        signs = [ops[int(k)] for k in rng.integers(0, len(ops), num_operands - 1)]
        expr = " ".join([str(nums[0])] + [f"{s} {x}" for s, x in zip(signs, nums[1:])])
        if split_of(expr) != split or (expr in seen and i < 100 * n):
            continue
        seen.add(expr)
        problems.append(Problem(f"What is {expr}?", str(_evaluate(nums, signs))))
        if len(problems) == n:
            return problems


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
