"""The jitted, donated GRPO update (its log-probs from `scoring.score`).

`train_step` = one optimizer step: gradients accumulated over micro-batches of whole
groups, every micro-batch's loss divided by the whole batch's normaliser (so they sum to
the full batch's loss exactly), then AdamW (clip by global norm, warm-up). A non-finite
loss or gradient skips the update and keeps the params (counted in the metrics).

Micro-batches (`plan_micro_batches`) are either `micro_batches` equal parts of the groups
in order, or cut by a token budget (`micro_batch_tokens`, verl's dynamic batch size):
groups sorted by their longest response, each micro-batch as many groups as fit the budget
at its own length, its rows cut to that length (bucketed), so the padding past a
micro-batch's longest response is not computed.

Dimension letters: Q prompts, G rollouts per prompt, B = Q x G rows, L prompt length,
T response length, n groups in a micro-batch.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import struct
from jaxtyping import Array, Bool, Float, Int

from explore_rl import parallel
from explore_rl.models import family, lora
from explore_rl.models.presets import ModelConfig
from explore_rl.rl import losses
from explore_rl.rl.scoring import score
from explore_rl.sampling import shapes


@struct.dataclass
class TrainState:
    step: Int[Array, ""]
    params: dict  # with LoRA adapters: the frozen base and the adapters beside its weights
    opt_state: optax.OptState  # of what trains (`lora.split`): the adapters, or every weight
    skipped: Int[Array, ""]  # updates skipped for a non-finite loss or gradient


def _group_rows(groups: Int[Array, " n"], g: int) -> Int[Array, "n G"]:
    """The batch rows of `groups` (a group's G rows are consecutive)."""
    return groups[:, None] * g + jnp.arange(g)


@struct.dataclass
class Batch:
    """One rollout batch, rows grouped by prompt (row b answers prompt b // G)."""

    prompts: Int[Array, "Q L"]
    prompt_mask: Bool[Array, "Q L"]
    tokens: Int[Array, "B T"]
    mask: Bool[Array, "B T"]
    advantages: Float[Array, " B"]
    behaviour_logp: Float[Array, "B T"]  # mu, from the sampler
    old_logp: Float[Array, "B T"]  # pi_old, from `score` before the update
    weights: Float[Array, " B"]  # explorers' per-row loss weights (1 = plain)
    ref_logp: Float[Array, "B T"] | None = None  # frozen reference policy, for the KL term

    @property
    def group_size(self) -> int:
        return self.tokens.shape[0] // self.prompts.shape[0]

    def take(self, groups: Int[Array, " n"], live: Bool[Array, " n"], length: int) -> Batch:
        """Groups `groups` (where `live`; the others kept as shape, with no token in any
        normaliser, loss or metric), their rows cut to `length` response tokens."""
        g = self.group_size
        rows = _group_rows(groups, g).reshape(-1)
        keep = jnp.repeat(live, g)
        tokens = lambda x: None if x is None else x[rows, :length]  # noqa: E731
        return Batch(
            prompts=self.prompts[groups],
            prompt_mask=self.prompt_mask[groups],
            tokens=tokens(self.tokens),
            mask=tokens(self.mask) & keep[:, None],
            advantages=self.advantages[rows],
            behaviour_logp=tokens(self.behaviour_logp),
            old_logp=tokens(self.old_logp),
            weights=jnp.where(keep, self.weights[rows], 0.0),
            ref_logp=tokens(self.ref_logp),
        )


@dataclasses.dataclass(frozen=True)
class OptimConfig:
    """The optimizer and how an update's batch is cut: the config's `optim` section, whose
    defaults are these (configs/base.py reads them from here)."""

    lr: float = 1e-6  # AdamW learning rate
    warmup_steps: int = 0  # linear warm-up of the learning rate (optimizer steps)
    # then half a cosine from lr to 0 over this many optimizer steps (verl's SFT trainer:
    # cosine); 0 = lr held after the warm-up
    decay_steps: int = 0
    weight_decay: float = 0.01  # AdamW decoupled weight decay
    b1: float = 0.9  # Adam beta1
    b2: float = 0.999  # Adam beta2
    eps: float = 1e-8  # Adam epsilon
    max_grad_norm: float = 1.0  # clip by global norm
    micro_batches: int = 1  # gradient accumulation within a minibatch (whole groups)
    # or micro-batches cut by a token budget per batch shard (verl's dynamic batch size:
    # groups sorted by length, rows cut to each micro-batch's longest); 0 = by count
    micro_batch_tokens: int = 0


@functools.cache
def make_optimizer(c: OptimConfig) -> optax.GradientTransformation:
    """AdamW after global-norm clipping. One object per config: `train_step` takes the
    optimizer as a static argument (hashed by identity), so a new run, an evaluation or a
    resume in the same process reuses the compiled update instead of compiling again."""
    lr = _schedule(c)
    return optax.chain(
        optax.clip_by_global_norm(c.max_grad_norm),
        optax.adamw(lr, b1=c.b1, b2=c.b2, eps=c.eps, weight_decay=c.weight_decay),
    )


def _schedule(c: OptimConfig):
    """The learning rate per optimizer step: warm-up, then held or decayed (`decay_steps`).
    A held rate with no warm-up stays a number: a schedule adds a step count to the
    optimizer's state, which checkpoints of such runs do not have."""
    warmup = optax.linear_schedule(0.0, c.lr, c.warmup_steps) if c.warmup_steps else None
    if not c.decay_steps:
        return warmup or c.lr
    cosine = optax.cosine_decay_schedule(c.lr, c.decay_steps)
    return optax.join_schedules([warmup, cosine], [c.warmup_steps]) if warmup else cosine


def init_state(params: dict, optimizer: optax.GradientTransformation) -> TrainState:
    """A train state owning `params` (train_step donates it: keep no other reference);
    moments for what trains only (LoRA: the adapters, `lora.split`)."""
    return TrainState(
        step=jnp.zeros((), jnp.int32),
        params=params,
        opt_state=optimizer.init(lora.split(params)[0]),
        skipped=jnp.zeros((), jnp.int32),
    )


def group_slice(batch: Batch, m: int, i: int) -> Batch:
    """Part i of m equal parts of the batch, whole groups each (they keep their prompt)."""
    q = batch.prompts.shape[0]
    groups = jnp.arange(i * (q // m), (i + 1) * (q // m))
    return batch.take(groups, jnp.ones(q // m, bool), batch.tokens.shape[1])


@dataclasses.dataclass(frozen=True)
class MicroBatch:
    """The groups one gradient pass takes and the response tokens it keeps of each row."""

    groups: np.ndarray  # [n] group indices; where `live` is False, a repeat that fills the shape
    live: np.ndarray  # [n]
    length: int


def plan_micro_batches(
    lengths: np.ndarray, oc: OptimConfig, prompt_len: int, t: int, shards: int = 1
) -> list[MicroBatch]:
    """How one optimizer step's Q groups (response `lengths` [Q, G], of at most `t`
    tokens) are cut.

    `micro_batch_tokens` 0: `micro_batches` equal parts in order, every row whole. Else
    verl's dynamic batch size with whole groups: the groups sorted by their longest
    response, each micro-batch at its first (longest) group's length bucket (the fine
    grid of `shapes.bucket`) takes as many groups as fit `micro_batch_tokens` per shard
    at that length (a group costs its prompt once and its G rows: L + G x length), at
    least one per shard and no more than the step's groups need, a multiple of `shards`
    (the batch axes' devices); its last micro-batch is filled out with groups not `live`.
    The group count depends on the length bucket only, so each bucket is one shape (two
    programs: the first micro-batch's starts the gradient sum).
    """
    q, g = lengths.shape
    if not oc.micro_batch_tokens:
        parts = np.split(np.arange(q), oc.micro_batches)
        return [MicroBatch(p, np.ones(len(p), bool), t) for p in parts]
    longest = lengths.max(axis=1)
    order = np.argsort(-longest, kind="stable")
    plan, i = [], 0
    while i < q:
        length = min(shapes.bucket(max(int(longest[order[i]]), 1), fine=True), t)
        fits = oc.micro_batch_tokens // (prompt_len + g * length)
        n = min(max(fits, 1), -(-q // shards)) * shards
        taken = order[i : i + n]
        live = np.arange(n) < len(taken)
        plan.append(MicroBatch(np.resize(taken, n), live, length))
        i += n
    return plan


def score_batch(params, cfg: ModelConfig, batch: Batch, plan: list[MicroBatch], temperature):
    """`score`'s log-probs [B, T] of every row of `batch`, one micro-batch of `plan` (which
    covers every group) at a time, so scoring never holds more than the update does."""
    out = jnp.zeros(batch.tokens.shape, jnp.float32)
    for mb in plan:
        out = _score_into(
            params, out, batch, jnp.asarray(mb.groups), jnp.asarray(mb.live), temperature,
            cfg, mb.length,
        )  # fmt: skip
    return out


@functools.partial(jax.jit, static_argnames=("cfg", "length"), donate_argnames=("out",))
def _score_into(params, out, batch: Batch, groups, live, temperature, cfg, length):
    mb = batch.take(groups, live, length)
    logp, _ = score(params, cfg, mb.prompts, mb.prompt_mask, mb.tokens, mb.mask, temperature)
    g = batch.group_size
    rows = jnp.where(live[:, None], _group_rows(groups, g), out.shape[0])
    return out.at[rows.reshape(-1), :length].set(logp, mode="drop")


def _loss(params, cfg, lc: losses.LossConfig, mb: Batch, n):
    logp, entropy = score(
        params, cfg, mb.prompts, mb.prompt_mask, mb.tokens, mb.mask, lc.score_temperature
    )

    def here(v):
        # Past a row's end the stored log-probs are whatever its scoring left (0 where a
        # micro-batch cut it shorter): there they are logp's own, so no ratio or KL term
        # of a masked token overflows (exp of it would turn its zero cotangent into NaN).
        return None if v is None else jnp.where(mb.mask, v, jax.lax.stop_gradient(logp))

    x = losses.LossInputs(
        logp=logp,
        old_logp=here(mb.old_logp),
        advantages=mb.advantages,
        mask=mb.mask,
        behaviour_logp=here(mb.behaviour_logp),
        ref_logp=here(mb.ref_logp),
        entropy=entropy,
        weights=mb.weights,
    )
    return losses.policy_loss(lc, x, n)


# The clip ranges enter the compiled update as values, not constants: runs or controls that
# differ only in them (clip-higher vs GRPO, an eps sweep in a notebook) share one program.
_TRACED_CLIPS = ("eps_low", "eps_high", "gspo_eps_low", "gspo_eps_high")


def train_step(
    state: TrainState,
    batch: Batch,
    cfg: ModelConfig,
    lc: losses.LossConfig,
    oc: OptimConfig,
    optimizer: optax.GradientTransformation,
    lengths: np.ndarray | None = None,
):
    """One optimizer step on `batch`; returns the new state and metrics (donates `state`).

    `lengths` [Q, G]: the rows' response lengths, for a token budget's plan (default: read
    from `batch.mask`, which a run of several processes cannot: its trainer passes them).
    """
    clips = jnp.asarray([getattr(lc, k) for k in _TRACED_CLIPS], jnp.float32)
    program = dataclasses.replace(lc, **dict.fromkeys(_TRACED_CLIPS, 0.0))
    q, t = batch.prompts.shape[0], batch.tokens.shape[1]
    if lengths is None and oc.micro_batch_tokens:
        lengths = np.asarray(jax.device_get(batch.mask)).sum(axis=1).reshape(q, -1)
    if lengths is None:  # equal parts at full length need no lengths
        lengths = np.full((q, batch.group_size), t)
    n = _normaliser(batch, clips, program)
    grads, totals = None, None
    for mb in plan_micro_batches(lengths, oc, batch.prompts.shape[1], t, parallel.batch_shards()):
        grads, totals = _accumulate(
            state.params, grads, totals, batch, jnp.asarray(mb.groups), jnp.asarray(mb.live),
            n, clips, cfg, program, mb.length,
        )  # fmt: skip
    return _apply(state, grads, totals, optimizer)


def _with_clips(lc, clips):
    return dataclasses.replace(lc, **dict(zip(_TRACED_CLIPS, clips)))


@functools.partial(jax.jit, static_argnames=("lc",))
def _normaliser(batch: Batch, clips, lc):
    x = losses.LossInputs(
        logp=batch.old_logp,
        old_logp=batch.old_logp,
        advantages=batch.advantages,
        mask=batch.mask,
        weights=batch.weights,
    )
    return losses.normaliser(_with_clips(lc, clips), x)


@functools.partial(
    jax.jit, static_argnames=("cfg", "lc", "length"), donate_argnames=("grads", "totals")
)
def _accumulate(params, grads, totals, batch, groups, live, n, clips, cfg, lc, length):
    """Add one micro-batch's gradient (its loss over the whole batch's normaliser) and its
    metrics, token-weighted: (grads, totals). The first one starts both. Gradients of what
    trains only: a LoRA run's frozen base gets none (no base-sized buffer is made)."""
    mb = batch.take(groups, live, length)
    lc = _with_clips(lc, clips)
    trainable, frozen = lora.split(params)
    loss_of = lambda t: _loss(lora.join(t, frozen), cfg, lc, mb, n)  # noqa: E731
    (loss, metrics), g = jax.value_and_grad(loss_of, has_aux=True)(trainable)
    tokens = jnp.sum(losses.active_mask(mb.mask, mb.weights)).astype(jnp.float32)
    # metrics are token means of the micro-batch (maxima for losses.MAX_METRICS)
    metrics = {
        k: v if k in losses.MAX_METRICS else v.astype(jnp.float32) * tokens
        for k, v in metrics.items()
    }
    new = {"loss": loss.astype(jnp.float32), "tokens": tokens, **metrics}
    g = parallel.constrain_params(g, family.axes)  # the accumulator lives where the params do
    if grads is None:
        return g, new
    combine = {k: jnp.maximum if k in losses.MAX_METRICS else jnp.add for k in new}
    totals = {k: combine[k](totals[k], v) for k, v in new.items()}
    return parallel.constrain_params(jax.tree.map(jnp.add, grads, g), family.axes), totals


@functools.partial(jax.jit, static_argnames=("optimizer",), donate_argnames=("state",))
def _apply(state, grads, totals, optimizer):
    loss, tokens = totals["loss"], jnp.maximum(totals["tokens"], 1.0)
    metrics = {
        k: v if k in losses.MAX_METRICS else v / tokens
        for k, v in totals.items()
        if k not in ("loss", "tokens")
    }
    grad_norm = optax.global_norm(grads)
    finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)

    trainable, frozen = lora.split(state.params)

    def apply(_):
        updates, opt_state = optimizer.update(grads, state.opt_state, trainable)
        return optax.apply_updates(trainable, updates), opt_state

    # A cond, not a select: the skipped branch returns the old state untouched, and the
    # taken one updates the donated buffers in place (a select would hold both copies).
    trainable, opt_state = jax.lax.cond(finite, apply, lambda _: (trainable, state.opt_state), None)
    state = state.replace(  # the out shardings: the new state where the old one was
        step=state.step + 1,
        params=parallel.constrain_params(lora.join(trainable, frozen), family.axes),
        opt_state=parallel.constrain_params(opt_state, family.axes),
        skipped=state.skipped + (~finite).astype(jnp.int32),
    )
    metrics.update(
        {"train/loss": loss, "train/grad_norm": grad_norm, "train/skipped_updates": state.skipped}
    )
    return state, metrics
