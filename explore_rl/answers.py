"""Answer extraction: the final answer a text states, as a string (no grading).

Data loaders read a reference answer out of a worked solution with it, and the math
reward reads a response's answer before comparing (`rewards.math`). Methods, tried in the
configured order, the first that finds something wins:
- "boxed": the content of the last \\boxed{...} (or \\fbox{...}), braces balanced;
- "hash": what follows the last "####" (GSM8K solutions);
- "last_number": the last number in the text (commas removed).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

EXTRACTORS = ("boxed", "hash", "last_number")
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?|-?\.\d+")


def last_boxed(text: str) -> str | None:
    """Content of the last \\boxed{...} / \\fbox{...}, with nested braces."""
    start = max(text.rfind("\\boxed{"), text.rfind("\\fbox{"))
    if start < 0:
        return None
    i = text.index("{", start) + 1
    depth, j = 1, i
    while j < len(text) and depth:
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        j += 1
    return text[i : j - 1].strip() if depth == 0 else None


def after_hash(text: str) -> str | None:
    """What follows the last '####' (GSM8K), up to the end of its line."""
    if "####" not in text:
        return None
    return text.rsplit("####", 1)[1].strip().split("\n")[0].strip() or None


def last_number(text: str) -> str | None:
    """The last number in `text`, commas removed."""
    found = _NUMBER.findall(text)
    return found[-1].replace(",", "") if found else None


_EXTRACT: dict[str, Callable[[str], str | None]] = {
    "boxed": last_boxed,
    "hash": after_hash,
    "last_number": last_number,
}


def extract_answer(text: str, methods: Sequence[str] = ("boxed", "last_number")) -> str | None:
    """The first answer `methods` (names of `EXTRACTORS`, in order) find in `text`."""
    for m in methods:
        if m not in _EXTRACT:
            raise ValueError(f"answer extractor {m!r}: allowed {EXTRACTORS}")
        found = _EXTRACT[m](text)
        if found:
            return found
    return None
