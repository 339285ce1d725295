"""Static shapes of token batches, computed on the host with no model: the lengths
prompts and micro-batches are padded to, left padding, and which prompt row each decode
row continues. The sampler lays its batches out with them; the update, sizing and ExTra
size theirs the same way without importing the sampler."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

# Static lengths. Prompts are padded up to one of `_BUCKETS` (two a doubling), so a new
# batch rarely recompiles. The update cuts a micro-batch's rows to one of `_FINE` (four a
# doubling): its cost is linear in the length and paid every step, so padding under a
# quarter (against under a half) is worth its extra programs (the lab's longest responses,
# 17-19 tokens, cost 32 positions on the coarse grid, 20 on this one).
_BUCKETS = tuple(sorted({m * 2**e for e in range(4, 16) for m in (2, 3)} | {16}))
_FINE = tuple(m * 2**e for e in range(2, 15) for m in (4, 5, 6, 7))


def bucket(length: int, fine: bool = False) -> int:
    """The smallest bucket >= length: 16, 32, 48, 64, 96, 128, 192, 256, ...; `fine`: 16,
    20, 24, 28, 32, 40, 48, 56, 64, 80, ..."""
    sizes = _FINE if fine else _BUCKETS
    for size in sizes:
        if size >= length:
            return size
    raise ValueError(f"length {length} exceeds the largest bucket {sizes[-1]}")


def left_pad(rows: list[list[int]], pad_id: int, length: int | None = None):
    """Token lists -> (tokens [B, L], mask [B, L]) left-padded to `length` (default: the
    bucket of the longest row)."""
    if not rows or min(map(len, rows)) == 0:
        raise ValueError("every prompt needs at least one token")
    longest = max(map(len, rows))
    length = length or bucket(longest)
    if longest > length:
        raise ValueError(f"a prompt has {longest} tokens, more than the limit {length}")
    tokens = np.full((len(rows), length), pad_id, np.int32)
    mask = np.zeros((len(rows), length), bool)
    for i, r in enumerate(rows):
        tokens[i, length - len(r) :] = r
        mask[i, length - len(r) :] = True
    return jnp.asarray(tokens), jnp.asarray(mask)


def grouped_rows(n_prompts: int, batch: int) -> np.ndarray:
    """The default layout: row b continues prompt row b // G, G = B / P."""
    if batch % n_prompts:
        raise ValueError(
            f"{batch} rows are not a whole number of groups of the {n_prompts} prompts"
        )
    return np.arange(batch) // (batch // n_prompts)
