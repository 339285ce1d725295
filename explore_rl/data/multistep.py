"""Multi-step arithmetic, one step a line: an expression of several operations, answered
by reducing it a step at a time (the arithmetic tasks of the controlled RL studies:
iGSM's and reasoning-gym's difficulty by operation count).

    question  "(3+5)*(7-2)"
    answer    "3+5=8\\n7-2=5\\n8*5=40"

A step `a op b = c` reduces one operation of the expression whose operands are both
numbers by now (either side first; + and * in either operand order), with c its value;
the steps reduce every operation, the last one's value is the answer. Any order of
reduction the expression allows is right, so a group of rollouts can find several.
Intermediate values stay in [0, max_value] (expressions that would not are drawn again).

`Problem.solution` (the supervised target) is the left-to-right reduction, and only for
problems of at most `solved_ops` operations: a model fine-tuned on those has seen one
order and short problems, and RL trains it on longer ones (`min_ops`..`max_ops`).
"""

from __future__ import annotations

import dataclasses
import re

import numpy as np

from explore_rl.data.tasks import SPLITS, Problem, register, split_of

_STEP = re.compile(r"^\s*(\d+)\s*([-+*])\s*(\d+)\s*=\s*(\d+)\s*$")
_TOKEN = re.compile(r"\d+|[-+*()]")


@dataclasses.dataclass(frozen=True)
class Spec:
    """`task.multistep`: the difficulty knobs."""

    min_ops: int = 2  # operations per expression, drawn uniformly in [min_ops, max_ops]
    max_ops: int = 5
    max_operand: int = 9  # numbers uniform in [1, max_operand]
    max_value: int = 999  # every intermediate value in [0, max_value] (else drawn again)
    ops: str = "+-*"  # operators drawn from
    solved_ops: int = 3  # problems of at most this many operations carry a solution (SFT)
    # the problems' draw, not the run's seed: every seed and method of a study sees one split
    problems_seed: int = 0

    def __post_init__(self):
        if not 1 <= self.min_ops <= self.max_ops <= 12:
            raise ValueError(
                f"config: task.multistep needs 1 <= min_ops <= max_ops <= 12, got "
                f"{self.min_ops}, {self.max_ops}"
            )
        if self.max_operand < 1 or self.max_value < 1 or not self.ops or set(self.ops) - set("+-*"):
            raise ValueError(
                f"config: task.multistep.ops={self.ops!r} (from '+-*'), max_operand="
                f"{self.max_operand} and max_value={self.max_value} (>= 1)"
            )


def _value(a: int, op: str, b: int) -> int:
    return a + b if op == "+" else a - b if op == "-" else a * b


def text(node, root: bool = True) -> str:
    """An expression tree (an int, or (left, op, right)) as text, every operation but the
    outermost in parentheses."""
    if isinstance(node, int):
        return str(node)
    left, op, right = node
    inner = f"{text(left, False)}{op}{text(right, False)}"
    return inner if root else f"({inner})"


def parse(question: str):
    """The expression tree of `text`'s output."""
    tokens = _TOKEN.findall(question)
    if "".join(tokens) != question.replace(" ", ""):
        raise ValueError(f"not a multistep question: {question!r}")
    pos = 0

    def atom():
        nonlocal pos
        tok, pos = tokens[pos], pos + 1
        if tok == "(":
            node = expr()
            pos += 1  # ")"
            return node
        return int(tok)

    def expr():
        nonlocal pos
        left = atom()
        if pos < len(tokens) and tokens[pos] in "+-*":
            op, pos = tokens[pos], pos + 1
            return (left, op, atom())
        return left

    return expr()


def _reduce(node, a: int, op: str, b: int, c: int):
    """`node` with one operation `a op b` over two numbers replaced by c (its value), or
    None when it has no such operation or c is wrong."""
    if isinstance(node, int):
        return None
    left, o, right = node
    if isinstance(left, int) and isinstance(right, int) and o == op:
        if (left, right) == (a, b) or (op != "-" and (left, right) == (b, a)):
            return c if _value(left, o, right) == c else None
    for i, child in ((0, left), (2, right)):
        reduced = _reduce(child, a, op, b, c)
        if reduced is not None:
            return (reduced, o, right) if i == 0 else (left, o, reduced)
    return None


def steps_reach(response: str, question: str) -> bool:
    """Whether the response reduces the question's expression step by step to its value
    (module docstring)."""
    node = parse(question)
    lines = [line for line in response.strip().splitlines() if line.strip()]
    for line in lines:
        match = _STEP.match(line)
        if not match or isinstance(node, int):
            return False
        node = _reduce(node, int(match[1]), match[2], int(match[3]), int(match[4]))
        if node is None:
            return False
    return isinstance(node, int) and bool(lines)


def reward(response: str, problem) -> float:
    """1 for a response that reduces the expression step by step to its value, else 0."""
    return float(steps_reach(response, problem.question))


def left_to_right(node) -> tuple[int, list[str]]:
    """(value, the steps of the reduction that takes the leftmost operation first)."""
    if isinstance(node, int):
        return node, []
    (a, left), op, (b, right) = left_to_right(node[0]), node[1], left_to_right(node[2])
    c = _value(a, op, b)
    return c, [*left, *right, f"{a}{op}{b}={c}"]


def _draw(rng: np.random.Generator, n_ops: int, s: Spec):
    """A random expression tree of n_ops operations (a random split of them between the
    two sides at each node)."""
    if n_ops == 0:
        return int(rng.integers(1, s.max_operand + 1))
    left = int(rng.integers(0, n_ops))
    return (
        _draw(rng, left, s),
        s.ops[int(rng.integers(len(s.ops)))],
        _draw(rng, n_ops - 1 - left, s),
    )


def _legal(node, max_value: int) -> bool:
    """Every intermediate value in [0, max_value]."""
    if isinstance(node, int):
        return True
    legal = _legal(node[0], max_value) and _legal(node[2], max_value)
    return legal and 0 <= left_to_right(node)[0] <= max_value


def make_multistep(n: int, seed: int, split: str, settings: Spec = Spec()) -> list[Problem]:
    """n distinct problems of `split`, deterministic in (seed, split, settings)."""
    if split not in SPLITS:
        raise ValueError(f"split={split!r}: allowed {list(SPLITS)}")
    s = settings
    knobs = (s.min_ops, s.max_ops, s.max_operand, s.max_value)
    rng = np.random.default_rng([seed, SPLITS.index(split), *knobs])
    problems, seen = [], set()
    for _ in range(1000 * n + 1000):
        if len(problems) == n:
            return problems
        n_ops = int(rng.integers(s.min_ops, s.max_ops + 1))
        node = _draw(rng, n_ops, s)
        question = text(node)
        if question in seen or split_of(question) != split or not _legal(node, s.max_value):
            continue
        seen.add(question)
        value, steps = left_to_right(node)
        solution = "\n".join(steps) if n_ops <= s.solved_ops else ""
        problems.append(Problem(question, str(value), solution=solution))
    raise ValueError(
        f"multistep: {len(problems)} distinct {split} problems of {n} asked at {s}: "
        "widen max_operand or the operation counts"
    )


@register("multistep", Spec)
def multistep_task(t, seed: int):
    """Expressions of `task.multistep`'s difficulty: `task.train_size` training and
    `task.test_size` held-out ones."""
    del seed  # the run's: the problems follow `problems_seed`
    s = t.own
    return (
        make_multistep(t.train_size, s.problems_seed, "train", s),
        {"multistep": make_multistep(t.test_size, s.problems_seed, "test", s)},
    )
