"""Rollouts: group-shared prefill + KV-cache decode in jitted `lax.while_loop` segments.

Prompts are left-padded to a bucketed length L. The P distinct prompt rows (one per prompt
and steering route) are prefilled once and stay in the cache as a shared prefix. By default
row b of the B = P x G decode rows continues prompt row b // G, so a group of G rollouts
costs one prefill and reads its prompt's keys once per step, not G times. Any other layout
(routes interleaved inside groups, uneven counts) names each row's prompt row in
`prefill_rows`: each prompt row is still prefilled once and its keys are gathered per row.
A layout the sampler would get wrong (rows sharing a prefill with different steering
vectors) is an error, never a silently different result. Appended embeddings (EDEN) come
after the shared prompt and run per row. Every row then writes slot t at step t: shapes
never change. Positions come from the masks, so padding and masked slots take none. The
decode runs in a few segments (`decode`), each attending only the response slots filled by
its end rounded up to a power-of-two window (`rollout.decode_window`), not all T.

Each sampled token records mu, its log-prob under the distribution it was drawn from:
temperature tau[b, t] (a traced [B, T] table: a new schedule does not recompile), then
top-k, then top-p on the renormalised top-k set (transformers' order), renormalised.
tau = 0 is greedy (mu = 0). Sampling is inverse-CDF with one uniform per row and step:
exact up to float32 rounding of the cumulative sums, and no noise for the whole vocabulary
(drawing V uniforms per row costs more than the rest of the draw). Top-p / top-k look at
the 256 most likely tokens and sort the full vocabulary only when a row needs more.

    rollout = sample(params, cfg, prompts, prompt_mask, rng, temperature,   # [P x G, T]
                     SamplingConfig(max_new_tokens=512, top_p=1.0, stop_ids=tok.stop_ids))

Dimension letters: P prompt (prefill) rows, B decode rows, L prompt length, T new tokens, E
appended slots, V vocab, D model.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct
from jaxtyping import Array, Bool, Float, Int

from explore_rl import parallel
from explore_rl.models import transformer
from explore_rl.models.presets import ModelConfig
from explore_rl.models.transformer import Interventions
from explore_rl.sampling.shapes import grouped_rows


@dataclasses.dataclass(frozen=True)
class SamplingConfig:
    """Static sampling settings (changing one recompiles; the temperature table does not)."""

    max_new_tokens: int
    top_p: float = 1.0
    top_k: int = 0  # 0: no top-k
    stop_ids: tuple[int, ...] = ()  # empty: always generate max_new_tokens

    def __post_init__(self):
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p={self.top_p}: must be in (0, 1]")
        if self.top_k < 0:
            raise ValueError(f"top_k={self.top_k}: must be >= 0 (0: no top-k)")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens={self.max_new_tokens}: need at least 1")

    @property
    def truncates(self) -> bool:
        return self.top_p < 1.0 or self.top_k > 0


@struct.dataclass
class Samples:
    tokens: Int[Array, "B T"]
    mask: Bool[Array, "B T"]  # real response tokens, the stop token included
    logprobs: Float[Array, "B T"]  # mu: log-prob under the distribution really sampled
    entropy: Float[Array, "B T"]  # entropy of the temperature-1 distribution
    sampling_entropy: Float[Array, "B T"]  # entropy of the distribution really sampled
    finished: Bool[Array, " B"]  # stopped on a stop id (False: hit max_new_tokens)
    # Block `readout_layer`'s output at each response token's position (a row's last
    # token, its stop or its T-th, is never fed back, so its entry stays zero).
    readout: Float[Array, "B T D"] | None = None

    @property
    def lengths(self) -> Int[Array, " B"]:
        return jnp.sum(self.mask, axis=1)


@struct.dataclass
class _Choice:
    token: Int[Array, " B"]
    logprob: Float[Array, " B"]
    entropy: Float[Array, " B"]
    sampling_entropy: Float[Array, " B"]


# Rows of a top-p / top-k draw are first cut to this many most likely tokens; only when
# one row's top-p set is larger does the draw sort the whole vocabulary (slow on CPU).
_SHORTLIST = 256
_BLOCK = 256  # inverse-CDF block: cumulative sums over V / 256 blocks, then 256 tokens


def _entropy(logp: Float[Array, "B V"]) -> Float[Array, " B"]:
    return -jnp.sum(jnp.where(logp > -jnp.inf, jnp.exp(logp) * logp, 0.0), axis=-1)


def _inverse_cdf(weights: Float[Array, "B V"], u: Float[Array, " B"]) -> Int[Array, " B"]:
    """Draw index i with probability w_i / sum(w), from one uniform per row.

    Two levels (block sums, then inside the chosen block) instead of one cumulative sum
    over V: XLA's long cumsum is slow on CPU, and short sums round less.
    """
    b, v = weights.shape
    pad = -v % _BLOCK
    w = jnp.pad(weights, ((0, 0), (0, pad))).reshape(b, -1, _BLOCK)
    cb = jnp.cumsum(jnp.sum(w, axis=-1), axis=-1)
    target = u * cb[:, -1]
    # Clamp to the last block / token with mass, in case rounding puts target at the end.
    last_block = jnp.max(
        jnp.where(
            cb > jnp.concatenate([jnp.zeros((b, 1)), cb[:, :-1]], 1), jnp.arange(cb.shape[1]), 0
        ),
        axis=-1,
    )
    j = jnp.minimum(jnp.sum(cb <= target[:, None], axis=-1), last_block)
    before = jnp.where(j > 0, jnp.take_along_axis(cb, jnp.maximum(j - 1, 0)[:, None], 1)[:, 0], 0.0)
    inside = jnp.take_along_axis(w, j[:, None, None], axis=1)[:, 0]
    last_token = jnp.max(jnp.where(inside > 0, jnp.arange(_BLOCK), 0), axis=-1)
    k = jnp.minimum(
        jnp.sum(jnp.cumsum(inside, axis=-1) <= (target - before)[:, None], -1), last_token
    )
    return j * _BLOCK + k


def _sorted_choice(vals, order, log_z, u, top_p: float, top_k: int):
    """Draw from the top-k, then top-p, of a distribution given in descending order.

    vals [B, K]: scaled logits, descending; order [B, K]: their token ids; log_z [B]: the
    log-normaliser over the whole vocabulary. Also says per row whether the K tokens held
    the whole top-p set (else the caller must retry with the full vocabulary).
    """
    logp = vals - log_z[:, None]
    p = jnp.exp(logp)
    keep = jnp.arange(p.shape[-1]) < top_k if top_k > 0 else jnp.ones_like(p, bool)
    p_k = jnp.where(keep, p, 0.0)
    if top_k > 0:  # top-p acts on the renormalised top-k set
        p_k = p_k / jnp.sum(p_k, axis=-1, keepdims=True)
    covered = jnp.sum(p_k, axis=-1) >= top_p
    keep &= (jnp.cumsum(p_k, axis=-1) - p_k) < top_p  # the token crossing top_p stays
    kept = jnp.where(keep, p, 0.0)
    q_logp = jnp.where(keep, logp - jnp.log(jnp.sum(kept, axis=-1))[:, None], -jnp.inf)
    j = _inverse_cdf(kept, u)
    pick = lambda x: jnp.take_along_axis(x, j[:, None], axis=-1)[:, 0]  # noqa: E731
    return (pick(order), pick(q_logp), _entropy(q_logp)), covered


def _truncated(scaled: Float[Array, "B V"], u, top_p: float, top_k: int):
    """(token, mu, entropy) from softmax(scaled) cut to top-k, then to top-p."""
    v = scaled.shape[-1]
    log_z = jax.nn.logsumexp(scaled, axis=-1)
    short = min(v, max(top_k, _SHORTLIST))
    vals, order = jax.lax.top_k(scaled, short)  # ties: the lower token id first
    result, covered = _sorted_choice(vals, order, log_z, u, top_p, top_k)
    if short == v or top_k > 0:
        return result

    def full_vocabulary(_):
        order = jnp.argsort(-scaled, axis=-1, stable=True)
        vals = jnp.take_along_axis(scaled, order, axis=-1)
        full = _sorted_choice(vals, order, log_z, u, top_p, top_k)[0]
        # Only the rows that need it: a row's draw never depends on the rows beside it.
        return jax.tree.map(lambda a, b: jnp.where(covered, a, b), result, full)

    return jax.lax.cond(jnp.all(covered), lambda _: result, full_vocabulary, None)


def _argmax(x: Float[Array, "B V"]) -> Int[Array, " B"]:
    # The first maximum; XLA's variadic argmax reduction is ~3x slower on CPU.
    top = jnp.max(x, axis=-1, keepdims=True)
    return jnp.min(jnp.where(x == top, jnp.arange(x.shape[-1]), x.shape[-1]), axis=-1)


def _log_normaliser_and_entropy(z: Float[Array, "B V"]):
    """log sum exp z and the entropy of softmax(z), in one pass over the vocabulary:
    H = log Z - E_p[z]."""
    top = jnp.max(z, axis=-1, keepdims=True)
    e = jnp.exp(z - top)
    total = jnp.sum(e, axis=-1)
    log_z = top[:, 0] + jnp.log(total)
    mean_z = jnp.sum(jnp.where(e > 0, e * z, 0.0), axis=-1) / total
    return log_z, log_z - mean_z, e


def choose(
    logits: Float[Array, "B V"],
    tau: Float[Array, " B"],
    u: Float[Array, " B"],
    config: SamplingConfig,
) -> _Choice:
    """One token per row at temperature tau (0: greedy), with its exact log-prob mu."""
    logits = logits.astype(jnp.float32)
    greedy = tau <= 0.0
    scaled = logits / jnp.where(greedy, 1.0, tau)[:, None]
    if config.truncates:
        token, mu, ent = _truncated(scaled, u, config.top_p, config.top_k)
    else:
        log_z, ent, weights = _log_normaliser_and_entropy(scaled)
        token = _inverse_cdf(weights, u)
        mu = jnp.take_along_axis(scaled, token[:, None], axis=-1)[:, 0] - log_z
    best = jax.lax.cond(
        jnp.any(greedy), _argmax, lambda x: jnp.zeros(x.shape[0], jnp.int32), logits
    )
    return _Choice(
        token=jnp.where(greedy, best, token).astype(jnp.int32),
        logprob=jnp.where(greedy, 0.0, mu),
        entropy=_log_normaliser_and_entropy(logits)[1],
        sampling_entropy=jnp.where(greedy, 0.0, ent),
    )


@struct.dataclass
class _State:
    step: Int[Array, ""]
    cache: transformer.KVCache
    position: Int[Array, " B"]  # RoPE position of the next token
    done: Bool[Array, " B"]
    out: Samples


def decode_step(params, cfg, cache, token, position, live, steer, temperature, u, config):
    """One decode step, the one of both loops (`decode` and the slot engine's): feed each
    live row's latest `token` [B] at its `position` [B], draw the next at its `temperature`
    and uniform `u` [B]. Returns the forward's output (new cache, readout) and the draw."""
    o = transformer.hidden_states(
        params, cfg, token[:, None], position[:, None], live[:, None], cache, steer
    )
    return o, choose(transformer.lm_logits(params, cfg, o.hidden[:, 0]), temperature, u, config)


def record(out: Samples, rows, t, choice: _Choice, live, stop_ids) -> tuple[Samples, Array]:
    """`out` with each live entry's draw written at (rows, t) (t one position or one per
    entry) and rows that drew a stop id finished; and which entries stopped. Entries not
    live write nothing: their place keeps the empty rollout's zeros."""
    n = out.tokens.shape[0]
    write = jnp.where(live, rows, n)  # out of range: dropped
    put = lambda a, v: a.at[write, t].set(v, mode="drop")  # noqa: E731
    stopped = live & jnp.isin(choice.token, jnp.asarray(stop_ids, jnp.int32))
    out = out.replace(
        tokens=put(out.tokens, choice.token),
        mask=put(out.mask, jnp.ones_like(live)),
        logprobs=put(out.logprobs, choice.logprob),
        entropy=put(out.entropy, choice.entropy),
        sampling_entropy=put(out.sampling_entropy, choice.sampling_entropy),
        finished=out.finished.at[jnp.where(stopped, rows, n)].set(True, mode="drop"),
    )
    return out, stopped


def _record(state: _State, choice: _Choice, stop_ids) -> _State:
    rows = jnp.arange(state.done.shape[0])
    out, stopped = record(state.out, rows, state.step, choice, ~state.done, stop_ids)
    return state.replace(done=state.done | stopped, out=out)


def steering(iv: Interventions | None, rows) -> Interventions | None:
    """Steering and readout of `rows`, without appended slots (those run once, per row)."""
    if iv is None:
        return None
    steer = None if iv.steer is None else iv.steer[rows]
    return Interventions(steer=steer, steer_layer=iv.steer_layer, readout_layer=iv.readout_layer)


def _gather_prefix(cache: transformer.KVCache, rows: Int[Array, " B"]) -> transformer.KVCache:
    """The prompt cache of P prefills laid out one per decode row (row b sees prefill
    rows[b]): for layouts that are not G contiguous rows per prompt."""
    take = lambda xs: [x[rows] for x in xs]  # noqa: E731
    return cache.replace(k=take(cache.k), v=take(cache.v), mask=cache.mask[rows])


def prefill_prompts(params, cfg, prompts, prompt_mask, iv, rows):
    """Each of the P prompt rows once, under the steering vector of the first decode row
    mapped to it (`rows[b]`: the prompt row of decode row b; rows sharing a prefill must
    share their steering, `sample` checks it). Returns the filled prompt cache [P] and
    each prompt's last hidden state [P, D]."""
    p = prompts.shape[0]
    first = jnp.argmax(rows[None, :] == jnp.arange(p)[:, None], axis=1)  # a prefill's vector
    pre = transformer.hidden_states(
        params,
        cfg,
        prompts,
        transformer.positions_from_mask(prompt_mask),
        prompt_mask,
        transformer.init_cache(cfg, p, prompts.shape[1]),
        steering(iv, first),
    )
    return pre.cache, pre.hidden[:, -1]


def append_slots(params, cfg, cache, iv, extra_embeds, extra_mask, last, used):
    """Run each row's appended slots (EDEN) against its prompt in `cache`: the cache with
    them filled, the last hidden state (the final real slot's where a row has one) and the
    positions taken, updated."""
    slots = transformer.hidden_states(
        params,
        cfg,
        None,
        None,
        None,
        cache,
        iv.replace(extra_embeds=extra_embeds, extra_mask=extra_mask),
    )
    em = extra_mask.astype(bool)
    final = jnp.max(jnp.where(em, jnp.arange(em.shape[1]), 0), axis=1)
    slot_last = jnp.take_along_axis(slots.extra_hidden, final[:, None, None], axis=1)[:, 0]
    last = jnp.where(jnp.any(em, axis=1)[:, None], slot_last, last)
    return slots.cache, last, used + jnp.sum(em, axis=1).astype(jnp.int32)


def prefill(params, cfg, prompts, prompt_mask, iv, batch: int, n_new: int, rows=None):
    """Prefill the P prompts once each; row b of the batch decodes from prompt rows[b]
    (default b // (B / P): groups of G contiguous rows, whose keys the decode then reads
    once per group).

    Returns the decode cache (the prompts as its shared prefix, n_new slots per row, any
    appended slots filled), the last hidden state per row, and the positions taken so far.
    """
    grouped = rows is None
    rows = grouped_rows(prompts.shape[0], batch) if grouped else rows
    prompt_cache, prompt_last = prefill_prompts(params, cfg, prompts, prompt_mask, iv, rows)
    prefix = prompt_cache if grouped else _gather_prefix(prompt_cache, rows)
    n_extra = 0 if iv is None or iv.extra_embeds is None else iv.extra_embeds.shape[1]
    cache = transformer.init_cache(cfg, batch, n_new, n_extra, prefix=prefix)
    last = prompt_last[rows]
    used = jnp.sum(prompt_mask, axis=1)[rows].astype(jnp.int32)
    if n_extra:
        cache, last, used = append_slots(
            params, cfg, cache, steering(iv, slice(None)), iv.extra_embeds, iv.extra_mask,
            last, used,
        )  # fmt: skip
    return cache, last, used


def check_prefill_rows(
    n_prompts: int, batch: int, rows: np.ndarray | None, steer: np.ndarray | None
) -> None:
    """Refuse a layout the sampler would get wrong: every row must name one of the
    prompts, and rows that continue one prefill must carry the same steering vector (a
    prefill runs once, under one vector). Host-side, on concrete arrays."""
    if rows is None:
        rows = grouped_rows(n_prompts, batch)
    elif rows.shape != (batch,) or rows.min() < 0 or rows.max() >= n_prompts:
        raise ValueError(
            f"prefill_rows must give each of the {batch} rows a prompt in [0, {n_prompts})"
        )
    if steer is None:
        return
    first = np.argmax(rows[None, :] == np.arange(n_prompts)[:, None], axis=1)
    differ = np.any(steer != steer[first][rows], axis=-1)
    if differ.any():
        b = int(np.flatnonzero(differ)[0])
        raise ValueError(
            f"rows {int(first[rows[b]])} and {b} continue prompt row {int(rows[b])} but carry "
            "different steering vectors: give each (prompt, route) its own prefill row "
            "(prefill_rows)"
        )


def sample(
    params: dict,
    cfg: ModelConfig,
    prompts: Int[Array, "P L"],
    prompt_mask: Bool[Array, "P L"],
    rng: jax.Array,
    temperature: Float[Array, "B T"],
    config: SamplingConfig,
    interventions: Interventions | None = None,
    prefill_rows: Int[Array, " B"] | None = None,
    window: int = 0,
) -> Samples:
    """Sample `config.max_new_tokens` tokens for each of the B rows of `temperature`.

    Row b continues prompt row `prefill_rows[b]` (default b // G, G = B / P: a group of G
    rollouts shares one prefill and reads its prompt's keys once per step). Each of the P
    prompt rows is prefilled once, so give one row per distinct (prompt, steering route).
    `interventions` are per row: appended slots [B, E, D] with their mask, a steering
    vector [B, D] (rows sharing a prompt row must share it: checked, an error otherwise),
    and `readout_layer` to record that block's output at every response token. `window`:
    the decode's attention window (`decode`; 0: every response slot).
    """
    steer = None if interventions is None else interventions.steer
    concrete = not any(
        isinstance(x, jax.core.Tracer) for x in (prefill_rows, steer) if x is not None
    )
    if concrete:
        check_prefill_rows(
            prompts.shape[0],
            temperature.shape[0],
            None if prefill_rows is None else np.asarray(prefill_rows),
            None if steer is None else np.asarray(steer),
        )
    state, uniforms = start(
        params, cfg, prompts, prompt_mask, rng, temperature, config, interventions, prefill_rows
    )
    return decode(params, cfg, state, temperature, uniforms, config, interventions, window)


def row_uniforms(rng: jax.Array, rows: int, n_new: int) -> Float[Array, "T B"]:
    """The one uniform of each (response position, row) draw. A row's randomness is keyed
    by its index and token position alone, so any schedule of the rows (the rollout
    engine's slots) draws the same tokens."""
    return jax.random.uniform(rng, (n_new, rows))


@functools.partial(jax.jit, static_argnames=("cfg", "config"))
def start(
    params, cfg, prompts, prompt_mask, rng, temperature, config, interventions, prefill_rows
) -> tuple[_State, Float[Array, "T B"]]:
    """The prefill and each row's first token: the decode loop's initial state."""
    b, n_new = temperature.shape
    if n_new != config.max_new_tokens:
        raise ValueError(
            f"temperature table has {n_new} positions, max_new_tokens is {config.max_new_tokens}"
        )
    prompt_mask = prompt_mask.astype(bool)
    cache, last, position = prefill(
        params, cfg, prompts, prompt_mask, interventions, b, n_new, prefill_rows
    )
    u = row_uniforms(rng, b, n_new)
    readout = interventions is not None and interventions.readout_layer is not None
    state = _State(
        step=jnp.zeros((), jnp.int32),
        cache=cache,
        position=position,
        done=jnp.zeros((b,), bool),
        out=empty_samples(cfg, b, n_new, readout),
    )
    first = choose(transformer.lm_logits(params, cfg, last), temperature[:, 0], u[0], config)
    state = _record(state, first, config.stop_ids)
    return state.replace(out=_on_rows(state.out)), u


def empty_samples(cfg, rows: int, n_new: int, readout: bool) -> Samples:
    empty = jnp.zeros((rows, n_new), jnp.float32)
    return Samples(
        tokens=jnp.zeros((rows, n_new), jnp.int32),
        mask=jnp.zeros((rows, n_new), bool),
        logprobs=empty,
        entropy=empty,
        sampling_entropy=empty,
        finished=jnp.zeros((rows,), bool),
        readout=jnp.zeros((rows, n_new, cfg.d_model), cfg.jnp_dtype) if readout else None,
    )


def window_for(base: int, reach: int, n_new: int) -> int:
    """The response slots a decode attends (`rollout.decode_window`) when it writes below
    slot `reach`: the least base x 2^j >= reach, at most n_new; base 0: all n_new."""
    if base < 0:
        raise ValueError(f"window={base}: must be >= 0 (0: every response slot)")
    if not base:
        return n_new
    w = base
    while w < reach:
        w *= 2
    return min(w, n_new)


def window_view(cache: transformer.KVCache, window: int) -> transformer.KVCache:
    """`cache` with only its first `window` response slots (the decode's attention reads
    and writes those; the prefix and appended slots stay whole)."""
    return cache.replace(
        k=[x[:, :, :window] for x in cache.k],
        v=[x[:, :, :window] for x in cache.v],
        mask=cache.mask[:, :window],
    )


def window_merge(
    whole: transformer.KVCache, part: transformer.KVCache, window: int
) -> transformer.KVCache:
    """`part` (a `window_view` decoded on) with the response slots beyond it from `whole`."""
    return part.replace(
        k=[x.at[:, :, :window].set(y) for x, y in zip(whole.k, part.k)],
        v=[x.at[:, :, :window].set(y) for x, y in zip(whole.v, part.v)],
        mask=whole.mask.at[:, :window].set(part.mask),
    )


def decode(
    params, cfg, state: _State, temperature, uniforms, config, interventions, window: int = 0
) -> Samples:
    """Every row from its first token until all have stopped or the table ends. Takes
    (donates) `state`: its cache is updated in place.

    In host-side segments, as the slot engine's chunks: the segment of window W runs the
    steps that write response slots below W and attends only those, W = `window_for`:
    window, 2 window, 4 window, ... up to T (window 0: one segment of all T, the single
    loop this used to be). A step then reads under twice the slots filled, not all T. One
    compiled segment a window, the window 0 program being the last: at most
    ceil(log2(T / window)) + 1 programs a call shape, each compiled when a call first
    reaches it; the host reads `done` between segments and stops once every row has
    stopped, and only then gathers the rollout's rows from their devices (one program
    more). The tokens are window 0's and the floats agree to rounding, for the engine's
    reason (its docstring). Host-side because the in-graph ways (a traced trip
    count over tiles, a switch over static prefixes) were slower (docs/benchmarks_log.md)."""
    n_new, w = temperature.shape[1], 0
    while True:
        w = window_for(window, w + 1, n_new)
        state = decode_segment(params, cfg, state, temperature, uniforms, config, interventions, w)
        # a segment of window w runs steps 0 .. w - 1; the last step is T - 2
        if w >= n_new - 1 or bool(np.all(np.asarray(state.done))):
            return _gathered(state.out)


@functools.partial(jax.jit, static_argnames=("cfg", "config", "window"), donate_argnames=("state",))
def decode_segment(
    params, cfg, state: _State, temperature, uniforms, config, interventions, window: int
) -> _State:
    """The decode steps that write response slots below `window` (step t writes slot t),
    attending those slots only; ends early when every row has stopped."""
    n_new = temperature.shape[1]
    steer = steering(interventions, slice(None))
    whole = state.cache
    if window < n_new:
        state = state.replace(cache=window_view(whole, window))

    def cond(s: _State):
        return (s.step + 1 < n_new) & (s.step < window) & ~jnp.all(s.done)

    def body(s: _State):
        live, t = s.out.mask[:, s.step], s.step + 1
        o, c = decode_step(
            params, cfg, s.cache, s.out.tokens[:, s.step], s.position, live, steer,
            temperature[:, t], uniforms[t], config,
        )  # fmt: skip
        if o.readout is not None:  # block output at the position of response token t - 1
            # (a row's last token, its stop, is never fed back: its entry stays zero)
            fed = jnp.where(s.done[:, None], 0, o.readout[:, 0])
            readout = s.out.readout.at[:, s.step].set(fed)
            s = s.replace(out=s.out.replace(readout=readout))
        s = s.replace(step=t, cache=o.cache, position=s.position + 1)
        return _record(s, c, config.stop_ids)

    state = jax.lax.while_loop(cond, body, state)
    if window < n_new:
        state = state.replace(cache=window_merge(whole, state.cache, window))
    # the host reads `done` between segments: whole on every device; `out` stays on its
    # rows' devices until `decode` gathers it once, at the end
    return state.replace(done=parallel.replicated(state.done), out=_on_rows(state.out))


def _on_rows(out: Samples) -> Samples:
    """`out` with its rows where the mesh in use puts a batch's (`parallel.constrain`):
    `start` and every segment return it so, one sharding from segment to segment."""
    return jax.tree.map(lambda x: parallel.constrain(x, "batch", *[None] * (x.ndim - 1)), out)


# A rollout whole on every device, for the host (on one device: the arrays as they are).
_gathered = jax.jit(parallel.replicated)


def greedy(
    params: dict,
    cfg: ModelConfig,
    tokens: Int[Array, "B L"],
    mask: Bool[Array, "B L"],
    max_new_tokens: int,
    stop_ids: tuple[int, ...] = (),
) -> Samples:
    """Greedy continuation of each left-padded prompt (temperature 0)."""
    b = tokens.shape[0]
    return sample(
        params,
        cfg,
        tokens,
        mask,
        jax.random.key(0),
        jnp.zeros((b, max_new_tokens)),
        SamplingConfig(max_new_tokens, stop_ids=stop_ids),
    )
