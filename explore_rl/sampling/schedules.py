"""Temperature tables for the sampler, as pure functions of traced values.

A table is [B, T]: one temperature per row and response position. The global training
step is an argument (traced), so a schedule that moves with training never recompiles.
Per-position schedules return [T], per-row ones [B]; `table` composes them.

    warm = cosine_warmup(step, warmup_steps=200)                  # EDEN's noisy rows
    tau = table(per_row=per_row(noisy, warm), per_position=ead(T, step))
"""

from __future__ import annotations

import jax.numpy as jnp
from jaxtyping import Array, Bool, Float


def constant(batch: int, length: int, tau: float | Array = 1.0) -> Float[Array, "B T"]:
    return jnp.full((batch, length), tau, jnp.float32)


def ead(
    length: int,
    step: int | Array,
    tau_max: float = 1.2,
    tau_min: float = 0.1,
    d0: float = 25.0,
    k: float = 1.0,
    c: int = 10,
    first: int = 1,
) -> Float[Array, " T"]:
    """Exploratory annealed decoding (EAD paper, Sec. 3 and "Global-Step-Aware Decay Rate").

    The response token at position i (0-based) is the paper's t-th token, t = i + first
    (first = 1: the paper's "t-th token"). tau_t = 1 for t < c, else
    max(1 + tau_max - exp(t / (k d_s)), tau_min), with d_s = min(d0 + 5 s, 40000) at global
    step s. The paper has k = 1; the authors' public code divides by k = 20 more (slower
    cooling): both are this function's `k`.
    """
    t = jnp.arange(length, dtype=jnp.float32) + first
    d_s = jnp.minimum(d0 + 5.0 * jnp.asarray(step, jnp.float32), 40000.0)
    annealed = jnp.maximum(1.0 + tau_max - jnp.exp(t / (k * d_s)), tau_min)
    return jnp.where(t < c, 1.0, annealed)


def cosine_warmup(
    step: int | Array, warmup_steps: int, start: float = 0.2, end: float = 1.0
) -> Float[Array, ""]:
    """start -> end along half a cosine over `warmup_steps` global steps, then end
    (EDEN's noisy-rollout temperature, EDEN paper)."""
    frac = jnp.clip(jnp.asarray(step, jnp.float32) / max(warmup_steps, 1), 0.0, 1.0)
    return end + (start - end) * 0.5 * (1.0 + jnp.cos(jnp.pi * frac))


def per_row(
    selected: Bool[Array, " B"], tau_selected: float | Array, tau_other: float | Array = 1.0
) -> Float[Array, " B"]:
    """One temperature for the selected rows (e.g. EDEN's noisy ones), another for the rest."""
    return jnp.where(selected, tau_selected, tau_other).astype(jnp.float32)


def table(
    per_row: Float[Array, " B"] | None = None,
    per_position: Float[Array, " T"] | None = None,
    batch: int | None = None,
    length: int | None = None,
) -> Float[Array, "B T"]:
    """Compose a per-row scale and a per-position schedule: tau[b, t] = row[b] * pos[t]."""
    if per_row is None and batch is None or per_position is None and length is None:
        raise ValueError("give per_row or batch, and per_position or length")
    row = jnp.ones((batch,), jnp.float32) if per_row is None else per_row
    pos = jnp.ones((length,), jnp.float32) if per_position is None else per_position
    return row[:, None] * pos[None, :]
