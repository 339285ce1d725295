"""Countdown (Stream of Search, Gandhi et al. 2024, Sec. 3): reach a target from a few
numbers with + - * /, each number used once, every intermediate result a non-negative
integer (division only where it is exact), every number used. Many problems have several
solutions; which one a policy finds is where exploration shows.

A question is the numbers and the target; an answer is one step a line, each combining
two numbers still available (the inputs and the results so far), the last result the
target:

    question  "12 34 5 8 -> 57"
    answer    "34-12=22\\n22+5=27\\n..."

Problems are drawn as the SoS generator draws them (`countdown_generate.py`): inputs
uniform in [1, max_input], a target uniform in [min_target, max_target], drawn again
until some solution exists (an exhaustive search over what the numbers make, memoised).
Each problem's split follows a hash of its question (`tasks.split_of`), so train and test
never share one, whatever the seed.

`Problem.solution`, the supervised target, is one canonical solution: the first chain
(((a o b) o c) o d, the running result one operand of each step) without division in a
fixed search order. Problems that need a division or two separate pairs ((a o b) o (c o d))
have none: a model fine-tuned on the solutions has seen one strategy, and finds the others
only by exploring (`family`: "chain" or "other"). `Spec.other_share` gives a few of the
training problems without a chain a solution by another strategy (`other_solution`), so
that SFT leaves the model a small probability of the strategies the test's "other"
problems need rather than none.

    make_countdown(8, seed=0, split="test", settings=Spec(inputs=3))
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import itertools
import math
import re

import numpy as np

from explore_rl.data.tasks import SPLITS, Problem, register, split_of

_QUESTION = re.compile(r"^\s*((?:\d+ )*\d+) -> (\d+)\s*$")
_STEP = re.compile(r"^\s*(\d+)\s*([-+*/])\s*(\d+)\s*=\s*(\d+)\s*$")


@dataclasses.dataclass(frozen=True)
class Spec:
    """`task.countdown`: the difficulty knobs."""

    # numbers per problem: 3 puts the lab's base model where exploration matters
    # (BENCHMARKS.md, the lab's regime); SoS: 4
    inputs: int = 3
    max_input: int = 20  # inputs uniform in [1, max_input] (SoS: 99)
    min_target: int = 10  # targets uniform in [min_target, max_target] (SoS: 10-100)
    max_target: int = 100
    # the problems' draw, not the run's seed: every seed and method of a study sees one split
    problems_seed: int = 0
    # the share of the training problems' solutions (SFT's examples) that solve a problem
    # without a division-free chain by another strategy (`other_solution`); 0: chains only
    other_share: float = 0.0

    def __post_init__(self):
        if not 2 <= self.inputs <= 6:
            raise ValueError(f"config: task.countdown.inputs={self.inputs}: must be in [2, 6]")
        if self.max_input < 1 or not 0 <= self.min_target <= self.max_target:
            raise ValueError(
                f"config: task.countdown needs max_input >= 1 and 0 <= min_target <= "
                f"max_target, got {self.max_input}, {self.min_target}, {self.max_target}"
            )
        if not 0 <= self.other_share < 1:
            raise ValueError(
                f"config: task.countdown.other_share={self.other_share}: must be in [0, 1)"
            )


# the settings that draw the problems (`other_share` only chooses which get a solution)
_DRAW = ("inputs", "max_input", "min_target", "max_target", "problems_seed")


def apply(a: int, op: str, b: int) -> int | None:
    """a op b under the SoS rules: None for a negative result or an inexact division."""
    if op == "+":
        return a + b
    if op == "-":
        return a - b if a >= b else None
    if op == "*":
        return a * b
    return a // b if b and a % b == 0 else None


@functools.cache
def reachable(numbers: tuple[int, ...]) -> frozenset[int]:
    """Every value the (sorted) numbers make, each used once, all of them used."""
    if len(numbers) == 1:
        return frozenset(numbers)
    out = set()
    for i, j in itertools.combinations(range(len(numbers)), 2):
        rest = numbers[:i] + numbers[i + 1 : j] + numbers[j + 1 :]
        for x, y in ((numbers[i], numbers[j]), (numbers[j], numbers[i])):
            for op in "+-*/":
                value = apply(x, op, y)
                if value is not None:
                    out |= reachable(tuple(sorted((*rest, value))))
    return frozenset(out)


def chain_solution(numbers, target: int) -> list[str] | None:
    """The first division-free chain reaching `target` (module docstring), as lines."""
    for order in dict.fromkeys(itertools.permutations(sorted(numbers))):
        for ops in itertools.product("+-*", repeat=len(order) - 1):
            lines, acc = [], order[0]
            for x, op in zip(order[1:], ops):
                a, b = (x, acc) if op == "-" and x > acc else (acc, x)
                value = apply(a, op, b)
                lines.append(f"{a}{op}{b}={value}")
                acc = value
            if acc == target:
                return lines
    return None


def other_solution(numbers, target: int) -> list[str]:
    """The first solution in a fixed search order (pairs of the numbers still available in
    index order, each both ways, + - * /), as lines: for a problem without a division-free
    chain, a solution by another strategy (a division, or two separate pairs)."""

    def search(available: list[int]) -> list[str] | None:
        if len(available) == 1:
            return [] if available[0] == target else None
        for i, j in itertools.combinations(range(len(available)), 2):
            rest = available[:i] + available[i + 1 : j] + available[j + 1 :]
            for a, b in ((available[i], available[j]), (available[j], available[i])):
                for op in "+-*/":
                    value = apply(a, op, b)
                    if value is None or target not in reachable(tuple(sorted((*rest, value)))):
                        continue
                    tail = search([*rest, value])
                    if tail is not None:
                        return [f"{a}{op}{b}={value}", *tail]
        return None

    lines = search(list(numbers))
    if lines is None:
        raise ValueError(f"countdown: {numbers} -> {target} has no solution")
    return lines


def parse_question(question: str) -> tuple[list[int], int]:
    match = _QUESTION.match(question)
    if not match:
        raise ValueError(f"not a countdown question: {question!r}")
    return [int(x) for x in match.group(1).split()], int(match.group(2))


def steps_reach(response: str, numbers, target: int) -> bool:
    """Whether `response` solves the problem: every non-empty line a step `a op b = c`
    over two numbers still available with c right, every input used, the last result
    the target."""
    available = collections.Counter(numbers)
    lines = [line for line in response.strip().splitlines() if line.strip()]
    if len(lines) != len(numbers) - 1:
        return False
    for line in lines:
        match = _STEP.match(line)
        if not match:
            return False
        a, op, b, c = int(match.group(1)), match.group(2), int(match.group(3)), int(match[4])
        available[a] -= 1
        available[b] -= 1
        if available[a] < 0 or available[b] < 0 or apply(a, op, b) != c:
            return False
        available[c] += 1
    return +available == collections.Counter([target])


def reward(response: str, problem) -> float:
    """1 for a response that solves the problem (`steps_reach`), else 0 (SoS's and
    TinyZero's success, without TinyZero's 0.1 for the format alone)."""
    return float(steps_reach(response, *parse_question(problem.question)))


def solution_key(response: str) -> frozenset:
    """A solved response's expression tree up to the order of its lines and of each step's
    operands where the operation commutes (a+b = b+a, a*b = b*a): distinct keys are
    distinct solutions. Associativity is not folded: (a+b)+c and a+(b+c) are two trees,
    two ways the policy found. A step names values, not which earlier step made them, so a
    tree whose intermediate result equals an input number reads as the response writes
    it (one key for both readings)."""
    key = []
    for line in response.strip().splitlines():
        if match := _STEP.match(line):
            a, op, b, c = int(match[1]), match[2], int(match[3]), int(match[4])
            key.append((*(sorted((a, b)) if op in "+*" else (a, b)), op, c))
    return frozenset(collections.Counter(key).items())


def make_countdown(n: int, seed: int, split: str, settings: Spec = Spec()) -> list[Problem]:
    """n distinct solvable problems of `split`, deterministic in (seed, split, settings)."""
    if split not in SPLITS:
        raise ValueError(f"split={split!r}: allowed {list(SPLITS)}")
    s = settings
    rng = np.random.default_rng([seed, SPLITS.index(split), *(getattr(s, f) for f in _DRAW)])
    problems, seen = [], set()
    for _ in range(1000 * n + 1000):
        if len(problems) == n:
            break
        numbers = [int(x) for x in rng.integers(1, s.max_input + 1, s.inputs)]
        target = int(rng.integers(s.min_target, s.max_target + 1))
        question = f"{' '.join(map(str, numbers))} -> {target}"
        if question in seen or split_of(question) != split:
            continue
        seen.add(question)
        if target in reachable(tuple(sorted(numbers))):
            lines = chain_solution(numbers, target)
            problems.append(Problem(question, str(target), solution="\n".join(lines or ())))
    if len(problems) < n:
        raise ValueError(
            f"countdown: {len(problems)} distinct solvable {split} problems of {n} asked at "
            f"{s}: widen max_input or the target range"
        )
    return with_other_solutions(problems, s.other_share) if split == "train" else problems


def with_other_solutions(problems: list[Problem], share: float) -> list[Problem]:
    """`problems` with k of those without a chain solved by `other_solution`, k the fewest
    that make them `share` of the solved ones (k / (chains + k) >= share), spread evenly
    over the list so that a leading part of it (`rollout.pool`) holds its share of them."""
    others = [i for i, p in enumerate(problems) if not p.solution]
    chains = len(problems) - len(others)
    k = math.ceil(share * chains / (1 - share))
    if k > len(others):
        raise ValueError(
            f"countdown: other_share={share} needs {k} problems without a chain solution, "
            f"the draw has {len(others)}"
        )
    out = list(problems)
    for i in (others[j] for j in np.linspace(0, len(others) - 1, k).round().astype(int)):
        numbers, target = parse_question(out[i].question)
        out[i] = dataclasses.replace(out[i], solution="\n".join(other_solution(numbers, target)))
    return out


def family(problem: Problem) -> str:
    """ "chain" when the problem has a division-free chain solution, else "other" (its
    own, not its `solution`'s: `other_share` solves some "other" problems too)."""
    return "chain" if chain_solution(*parse_question(problem.question)) else "other"


@register("countdown", Spec, solutions=solution_key)
def countdown_task(t, seed: int):
    """Countdown problems of `task.countdown`'s difficulty: `task.train_size` training
    and `task.test_size` held-out ones."""
    del seed  # the run's: the problems follow `problems_seed`
    s = t.own
    return (
        make_countdown(t.train_size, s.problems_seed, "train", s),
        {"countdown": make_countdown(t.test_size, s.problems_seed, "test", s)},
    )
