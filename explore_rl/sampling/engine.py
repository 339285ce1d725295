"""The rollout engine: a fixed number of decode slots, refilled as rows finish.

RL responses have long-tailed lengths. `sampler.sample` decodes all B rows together until
the longest stops, so most rows idle behind a few long ones, and the whole batch's KV cache
must fit at once. The engine decodes S < B slots instead: the rows wait in plan order; the
decode runs in chunks of at most N steps (one jitted `lax.while_loop`, ended early when
every slot has stopped); between chunks the finished slots take the next waiting rows.

Each of the P distinct prompt rows (problem, steering route, response prefix) is
prefilled once per call, as in `sampler.sample`, and stays resident; a row entering a
slot copies its prompt's keys, runs its appended slots (EDEN), and draws its first token.
Its steering vector, temperature row, position and response keys travel with the slot.

Exactness: token t of row b is drawn with the uniform `sampler.row_uniforms(rng)[t, b]` at
temperature `temperature[b, t]`, keyed by (row, position) and never by slot or loop step,
so for a given slot count and attention window a row's tokens, mu, entropies and
readouts are bit for bit the same whatever N or the order of refills. Across attention
windows (below) a masked slot adds an exact 0 to the softmax's sums, but a reduction over
W slots may be grouped unlike one over T (on CPU some shapes keep the bits, others move
by rounding), so the floats agree to rounding and the tokens unless that rounding
straddles a draw's boundary (the tests check both; the same holds on GPU). Across
slot counts, and against the one pass (whose groups read their shared prompt through a
differently shaped product), the batch width changes the kernels XLA picks (on CPU even
a row sum over a 49k vocabulary rounds differently for 3 rows than for 16), so mu and
entropies agree to float rounding and the tokens agree unless that rounding straddles a
draw's boundary (BENCHMARKS.md measures it).

Memory: the prompt keys P x L for the call, plus S x (L + E + T) slot keys, against
P x L + B x (E + T) for one pass. S = 0 (or >= B) is that one pass: one prefill, one decode,
each group reading its prompt's keys once per step: the fastest when everything fits.

Speed: a step's attention reads the slots' response keys up to a window W, not all T:
before each chunk the host takes the least W = W0 x 2^j (`EngineConfig.window`, W0 =
256; `sampler.window_for`) >= every live slot's position + N, at most T, and the chunk
attends (and writes) the first W slots. One program per window: at most log2(T / W0) + 1
compiles of the chunk a call shape, each compiled when first needed. The one pass does
the same in segments (`sampler.decode`: segment j runs until its rows fill W0 x 2^j).

    out, stats = engine.generate(params, cfg, prompts, prompt_mask, rng, temperature,
                                 sampling, EngineConfig(slots=32, chunk=16))

Dimension letters: P prompt rows, B rows, S slots, L prompt length, E appended slots, T new
tokens, D model.
"""

from __future__ import annotations

import dataclasses
import functools
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct
from jaxtyping import Array, Bool, Int

from explore_rl import parallel
from explore_rl.models import transformer
from explore_rl.models.presets import ModelConfig
from explore_rl.models.transformer import Interventions
from explore_rl.sampling import sampler, shapes
from explore_rl.sampling.sampler import Samples, SamplingConfig

AUTO = "auto"


@dataclasses.dataclass(frozen=True)
class EngineConfig:
    """How a batch is scheduled (results never depend on it; speed and memory do)."""

    # S decode slots; 0 or >= the batch's rows: every row at once; "auto": to be sized
    # for the device (a run's start does: `train.sizing`), not yet a schedule
    slots: int | str = 0
    chunk: int = 16  # N: most decode steps between refills
    # W0: a chunk attends the first W response slots, W the least W0 x 2^j covering every
    # live slot's position + N (at most T); the one pass's segments likewise
    # (`sampler.window_for`); 0: always all T
    window: int = 256

    def __post_init__(self):
        counted = isinstance(self.slots, int) and not isinstance(self.slots, bool)
        if not (self.slots == AUTO or (counted and self.slots >= 0)) or self.chunk < 1:
            raise ValueError(
                f"slots={self.slots!r} must be a count >= 0 (0: every row at once) or "
                f"'auto', and chunk={self.chunk} >= 1"
            )
        if self.window < 0:
            raise ValueError(f"window={self.window} must be >= 0 (0: every response slot)")


@dataclasses.dataclass(frozen=True)
class EngineStats:
    """What one call did. A decode step feeds one token to every slot; it is useful when
    the slot's row has not stopped (the first token of a row comes from its prefill)."""

    rows: int
    slots: int
    useful_tokens: int  # response tokens up to each row's stop, the stop token included
    steps: int  # decode steps run
    prefill_s: float  # prompts, appended slots and first tokens
    decode_s: float
    refills: int  # rows that entered a slot another row had left

    @property
    def occupancy(self) -> float:
        """Useful share of the slot-steps run (1.0 when there were none)."""
        slot_steps = self.slots * self.steps
        return (self.useful_tokens - self.rows) / slot_steps if slot_steps else 1.0

    def metrics(self) -> dict[str, float]:
        return {
            "rollout/useful_tokens": self.useful_tokens,
            "rollout/slot_occupancy": self.occupancy,
            "rollout/refills": self.refills,
            "time/prefill_s": self.prefill_s,
            "time/decode_s": self.decode_s,
        }


def merge_metrics(stats: list[EngineStats]) -> dict[str, float]:
    """The metrics of several calls (DAPO's generation batches) as one step's."""
    slot_steps = sum(s.slots * s.steps for s in stats)
    useful_feeds = sum(s.useful_tokens - s.rows for s in stats)
    out = {k: sum(s.metrics()[k] for s in stats) for k in stats[0].metrics()}
    out["rollout/slot_occupancy"] = useful_feeds / slot_steps if slot_steps else 1.0
    return out


@struct.dataclass
class _Slots:
    row: Int[Array, " S"]  # the row each slot decodes; B when empty
    cache: transformer.KVCache  # S rows; index [S]: the response slot the next feed writes
    position: Int[Array, " S"]  # RoPE position of the token fed next
    token: Int[Array, " S"]  # the token fed next (the row's latest)
    done: Bool[Array, " S"]  # nothing to feed: stopped, full, or empty
    out: Samples  # every row of the batch, in plan order


def generate(
    params: dict,
    cfg: ModelConfig,
    prompts: Int[Array, "P L"],
    prompt_mask: Bool[Array, "P L"],
    rng: jax.Array,
    temperature,
    config: SamplingConfig,
    engine: EngineConfig = EngineConfig(),
    interventions: Interventions | None = None,
    prefill_rows: Int[Array, " B"] | None = None,
) -> tuple[Samples, EngineStats]:
    """`sampler.sample`'s rollout of every row of `temperature` [B, T] (same arguments,
    same result), scheduled over `engine.slots` decode slots; and what the call did."""
    b, n_new = temperature.shape
    if engine.slots == AUTO:
        raise ValueError("rollout.slots='auto' is sized when a run starts; give a count here")
    steer = None if interventions is None else interventions.steer
    sampler.check_prefill_rows(
        prompts.shape[0],
        b,
        None if prefill_rows is None else np.asarray(prefill_rows),
        None if steer is None else np.asarray(steer),
    )
    args = (params, cfg, prompts, prompt_mask, rng, temperature, config, interventions)
    if not engine.slots or engine.slots >= b:
        return _one_pass(*args, prefill_rows, engine.window)
    rows = shapes.grouped_rows(prompts.shape[0], b) if prefill_rows is None else prefill_rows
    return _slotted(*args, jnp.asarray(rows, jnp.int32), engine)


def _one_pass(
    params, cfg, prompts, prompt_mask, rng, temperature, config, iv, prefill_rows, window
):
    clock = time.perf_counter()
    state, u = sampler.start(
        params, cfg, prompts, prompt_mask, rng, temperature, config, iv, prefill_rows
    )
    jax.block_until_ready(state)
    prefill_s, clock = time.perf_counter() - clock, time.perf_counter()
    out = sampler.decode(params, cfg, state, temperature, u, config, iv, window)
    jax.block_until_ready(out)
    lengths = np.asarray(out.lengths)
    stats = EngineStats(
        rows=len(lengths),
        slots=len(lengths),
        useful_tokens=int(lengths.sum()),
        steps=max(int(lengths.max()) - 1, 0),
        prefill_s=prefill_s,
        decode_s=time.perf_counter() - clock,
        refills=0,
    )
    return out, stats


def _slotted(params, cfg, prompts, prompt_mask, rng, temperature, config, iv, rows, engine):
    b, n_new = temperature.shape
    clock = time.perf_counter()
    prompt_mask = jnp.asarray(prompt_mask, bool)
    prompt_cache, prompt_last = _prefill_prompts(params, cfg, prompts, prompt_mask, iv, rows)
    n_extra = 0 if iv is None or iv.extra_embeds is None else iv.extra_embeds.shape[1]
    readout = iv is not None and iv.readout_layer is not None
    slots = _empty(cfg, engine.slots, prompt_cache.mask.shape[1], n_new, n_extra, b, readout)
    u = sampler.row_uniforms(rng, b, n_new)
    jax.block_until_ready((prompt_cache, slots))
    prefill_s, decode_s = time.perf_counter() - clock, 0.0
    waiting, steps, refills, first = 0, 0, 0, True
    free, index = np.ones(engine.slots, bool), np.zeros(engine.slots, np.int64)
    while True:
        enter = np.full(engine.slots, -1, np.int32)
        for s in np.flatnonzero(free)[: b - waiting]:
            enter[s], waiting = waiting, waiting + 1
        index[enter >= 0] = 0
        live = ~free | (enter >= 0)
        if (enter >= 0).any():
            refills += 0 if first else int(np.sum(enter >= 0))
            first = False
            clock = time.perf_counter()
            slots = _enter(
                params, cfg, slots, jnp.asarray(enter), prompt_cache, prompt_last,
                rows, temperature, u, config, iv,
            )  # fmt: skip
            jax.block_until_ready(slots)
            prefill_s += time.perf_counter() - clock
        clock = time.perf_counter()
        # end the chunk early once enough slots are free for the rows still waiting
        wanted = min(b - waiting, max(1, engine.slots // 8)) if b > waiting else engine.slots + 1
        # a live slot at response slot i writes slots i .. i + N - 1 in this chunk
        reach = int(index[live].max(initial=0)) + engine.chunk
        slots, ran = _chunk(
            params, cfg, slots, jnp.asarray(wanted), temperature, u, config, iv, engine.chunk,
            sampler.window_for(engine.window, reach, n_new),
        )  # fmt: skip
        free = np.asarray(slots.done)
        decode_s += time.perf_counter() - clock
        steps += int(ran)
        index += int(ran)  # exact for the slots still live, the only ones read
        if waiting == b and free.all():
            break
    out = slots.out
    stats = EngineStats(
        rows=b,
        slots=engine.slots,
        useful_tokens=int(np.asarray(out.mask).sum()),
        steps=steps,
        prefill_s=prefill_s,
        decode_s=decode_s,
        refills=refills,
    )
    return out, stats


_prefill_prompts = jax.jit(sampler.prefill_prompts, static_argnames=("cfg",))


@functools.partial(jax.jit, static_argnums=(0, 1, 2, 3, 4, 5, 6))
def _empty(cfg, n_slots, prompt_len, n_new, n_extra, rows, readout) -> _Slots:
    prefix = transformer.init_cache(cfg, n_slots, prompt_len)
    cache = transformer.init_cache(cfg, n_slots, n_new, n_extra, prefix=prefix)
    return _Slots(
        row=jnp.full((n_slots,), rows, jnp.int32),
        cache=cache.replace(index=jnp.zeros((n_slots,), jnp.int32)),
        position=jnp.zeros((n_slots,), jnp.int32),
        token=jnp.zeros((n_slots,), jnp.int32),
        done=jnp.ones((n_slots,), bool),
        out=sampler.empty_samples(cfg, rows, n_new, readout),
    )


@functools.partial(jax.jit, static_argnames=("cfg", "config"), donate_argnames=("slots",))
def _enter(
    params, cfg, slots: _Slots, enter, prompt_cache, prompt_last, rows, temperature, u,
    config, iv,
) -> _Slots:  # fmt: skip
    """Put row enter[s] into each slot s with enter[s] >= 0: its prompt's keys, its
    appended slots, its first token."""
    b, n_new = temperature.shape
    new = enter >= 0
    row = jnp.where(new, enter, slots.row)
    r = jnp.minimum(row, b - 1)  # empty slots read row B - 1; nothing of theirs is kept
    p = rows[r]

    def pick(fresh, old):
        return jnp.where(new.reshape((-1,) + (1,) * (old.ndim - 1)), fresh, old)

    c = slots.cache
    cache = c.replace(
        prefix_k=[pick(x[p], o) for x, o in zip(prompt_cache.k, c.prefix_k)],
        prefix_v=[pick(x[p], o) for x, o in zip(prompt_cache.v, c.prefix_v)],
        prefix_mask=pick(prompt_cache.mask[p], c.prefix_mask),
        mask=c.mask & ~new[:, None],
        index=jnp.where(new, 0, c.index),
    )
    last = prompt_last[p]
    used = jnp.sum(prompt_cache.mask, axis=1)[p].astype(jnp.int32)
    if c.extra_k is not None:
        filled, last, used = sampler.append_slots(
            params, cfg, cache, sampler.steering(iv, r), iv.extra_embeds[r],
            iv.extra_mask[r], last, used,
        )  # fmt: skip
        cache = cache.replace(
            extra_k=[pick(x, o) for x, o in zip(filled.extra_k, c.extra_k)],
            extra_v=[pick(x, o) for x, o in zip(filled.extra_v, c.extra_v)],
            extra_mask=pick(filled.extra_mask, c.extra_mask),
        )
    first = sampler.choose(
        transformer.lm_logits(params, cfg, last), temperature[r, 0], u[0, r], config
    )
    out, stopped = sampler.record(slots.out, row, 0, first, new, config.stop_ids)
    return slots.replace(
        row=row,
        cache=cache,
        position=jnp.where(new, used, slots.position),
        token=jnp.where(new, first.token, slots.token),
        done=jnp.where(new, stopped | (n_new == 1), slots.done),
        out=out,
    )


@functools.partial(
    jax.jit, static_argnames=("cfg", "config", "n_steps", "window"), donate_argnames=("slots",)
)
def _chunk(
    params, cfg, slots: _Slots, wanted, temperature, u, config, iv, n_steps: int, window: int
):
    """At most n_steps decode steps of every slot whose row has not stopped; ends early
    when none is left or `wanted` slots are free. The steps attend (and write) the first
    `window` response slots only: every live slot's writes must fall below it; a finished
    slot's write beyond it is dropped (its row is done, and a row entering clears it).
    Returns the slots and the steps run."""
    b, n_new = temperature.shape
    whole = slots.cache
    slots = slots.replace(cache=sampler.window_view(whole, window))

    def cond(carry):
        i, s = carry
        return (i < n_steps) & ~jnp.all(s.done) & (jnp.sum(s.done) < wanted)

    def body(carry):
        i, s = carry
        live, r, fed = ~s.done, jnp.minimum(s.row, b - 1), s.cache.index
        t = jnp.minimum(fed + 1, n_new - 1)  # a live slot's fed token is never the last
        o, c = sampler.decode_step(
            params, cfg, s.cache, s.token, s.position, live, sampler.steering(iv, r),
            temperature[r, t], u[t, r], config,
        )  # fmt: skip
        out, stopped = sampler.record(s.out, s.row, t, c, live, config.stop_ids)
        if o.readout is not None:  # block output at the position of the fed token
            write = jnp.where(live, s.row, b)
            out = out.replace(readout=out.readout.at[write, fed].set(o.readout[:, 0], mode="drop"))
        s = s.replace(
            cache=o.cache.replace(index=jnp.where(live, t, fed)),
            position=jnp.where(live, s.position + 1, s.position),
            token=jnp.where(live, c.token, s.token),
            done=s.done | stopped | (live & (t == n_new - 1)),
            out=out,
        )
        return i + 1, s

    ran, slots = jax.lax.while_loop(cond, body, (jnp.zeros((), jnp.int32), slots))
    # what the host reads between chunks (`done`) and at the end, whole on every device.
    # Unlike the one pass's rows, `out` is whole on every device inside the loop already
    # (a slot writes whichever row it holds), so pinning it gathers nothing
    return slots.replace(
        cache=sampler.window_merge(whole, slots.cache, window),
        done=parallel.replicated(slots.done),
        out=parallel.replicated(slots.out),
    ), ran
