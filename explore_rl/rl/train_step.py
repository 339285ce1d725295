"""Scoring rollouts and the jitted, donated GRPO update.

Rollouts are scored with the group-shared prompt: each of the Q prompts runs forward once
and its keys become the shared prefix of its G responses (`KVCache.prefix_*`), so the
prompt costs one forward, and its gradient is the sum over the group. The log-prob of
response token t comes from the hidden state before it: the prompt's last position for
t = 0, response position t - 1 after.

`train_step` = one optimizer step: gradients accumulated over micro-batches of whole
groups (`lax.scan`), every micro-batch's loss divided by the whole batch's normaliser, then
AdamW (clip by global norm, warm-up). A non-finite loss or gradient skips the update and
keeps the params (counted in the metrics).

Dimension letters: Q prompts, G rollouts per prompt, B = Q x G rows, L prompt length,
T response length, M micro-batches.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import optax
from flax import struct
from jaxtyping import Array, Bool, Float, Int

from explore_rl import parallel
from explore_rl.models import transformer
from explore_rl.models.presets import ModelConfig
from explore_rl.rl import losses


@struct.dataclass
class TrainState:
    step: Int[Array, ""]
    params: dict
    opt_state: optax.OptState
    skipped: Int[Array, ""]  # updates skipped for a non-finite loss or gradient


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


@dataclasses.dataclass(frozen=True)
class OptimConfig:
    lr: float = 1e-6
    warmup_steps: int = 0
    weight_decay: float = 0.01
    b1: float = 0.9
    b2: float = 0.999
    eps: float = 1e-8
    max_grad_norm: float = 1.0
    micro_batches: int = 1  # gradient accumulation: groups per micro-batch = Q / M


@functools.cache
def make_optimizer(c: OptimConfig) -> optax.GradientTransformation:
    """AdamW after global-norm clipping. One object per config: `train_step` takes the
    optimizer as a static argument (hashed by identity), so a new run, an evaluation or a
    resume in the same process reuses the compiled update instead of compiling again."""
    lr = optax.linear_schedule(0.0, c.lr, c.warmup_steps) if c.warmup_steps else c.lr
    return optax.chain(
        optax.clip_by_global_norm(c.max_grad_norm),
        optax.adamw(lr, b1=c.b1, b2=c.b2, eps=c.eps, weight_decay=c.weight_decay),
    )


def init_state(params: dict, optimizer: optax.GradientTransformation) -> TrainState:
    """A train state owning `params` (train_step donates it: keep no other reference)."""
    return TrainState(
        step=jnp.zeros((), jnp.int32),
        params=params,
        opt_state=optimizer.init(params),
        skipped=jnp.zeros((), jnp.int32),
    )


def _continue_prompts(params, cfg, prompts, prompt_mask, inputs, mask, interventions=None):
    """The decoder over Q prompts (one forward each) and the B = Q x G rows continuing
    them (row b after prompt b // G, its keys read from the shared prefix): (the prompts'
    output, the rows' output), no logits."""
    q, (b, t) = prompts.shape[0], inputs.shape
    prompt_mask = prompt_mask.astype(bool)
    pre = transformer.hidden_states(
        params,
        cfg,
        prompts,
        transformer.positions_from_mask(prompt_mask),
        prompt_mask,
        transformer.init_cache(cfg, q, prompts.shape[1]),
        interventions,
    )
    start = jnp.repeat(jnp.sum(prompt_mask, axis=1), b // q)[:, None]
    cache = transformer.init_cache(cfg, b, t, prefix=pre.cache)
    out = transformer.hidden_states(
        params, cfg, inputs, start + jnp.arange(t)[None], mask.astype(bool), cache, interventions
    )
    return pre, out


def score(params: dict, cfg: ModelConfig, prompts, prompt_mask, tokens, mask, temperature=1.0):
    """log pi(token) and the entropy of pi at each response position, [B, T] each, pi =
    softmax(logits / temperature) (the score temperature: `LossConfig.score_temperature`)."""
    g = tokens.shape[0] // prompts.shape[0]
    pre, out = _continue_prompts(params, cfg, prompts, prompt_mask, tokens[:, :-1], mask[:, :-1])
    first = jnp.repeat(pre.hidden[:, -1:], g, axis=0)
    logits = transformer.lm_logits(params, cfg, jnp.concatenate([first, out.hidden], axis=1))
    logp_all = jax.nn.log_softmax(logits / temperature, axis=-1)
    logp = jnp.take_along_axis(logp_all, tokens[..., None], axis=-1)[..., 0]
    entropy = -jnp.sum(jnp.exp(logp_all) * logp_all, axis=-1)
    return logp, entropy


def readout(params: dict, cfg: ModelConfig, prompts, prompt_mask, tokens, mask, layer: int):
    """Block `layer`'s output at each response token, [B, T, D]: the scoring pass above
    with response token t as the input at its position, unsteered, stopped after that
    block (the blocks above it are not run)."""
    below = {**params, "layers": params["layers"][: layer + 1]}
    cut = dataclasses.replace(cfg, n_layers=layer + 1)
    iv = transformer.Interventions(readout_layer=layer)
    return _continue_prompts(below, cut, prompts, prompt_mask, tokens, mask, iv)[1].readout


def group_slice(batch: Batch, m: int, i) -> Batch:
    """Part i of m equal parts of the batch, whole groups each (they keep their prompt)."""

    def take(x, rows):
        size = rows // m
        return jax.lax.dynamic_slice_in_dim(x, i * size, size, axis=0)

    q, b = batch.prompts.shape[0], batch.tokens.shape[0]
    return jax.tree.map(lambda x: take(x, q if x.shape[0] == q and q != b else b), batch)


def _loss(params, cfg, lc: losses.LossConfig, mb: Batch, n):
    logp, entropy = score(
        params, cfg, mb.prompts, mb.prompt_mask, mb.tokens, mb.mask, lc.score_temperature
    )
    x = losses.LossInputs(
        logp=logp,
        old_logp=mb.old_logp,
        advantages=mb.advantages,
        mask=mb.mask,
        behaviour_logp=mb.behaviour_logp,
        ref_logp=mb.ref_logp,
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
):
    """One optimizer step on `batch`; returns the new state and metrics (donates `state`)."""
    clips = jnp.asarray([getattr(lc, k) for k in _TRACED_CLIPS], jnp.float32)
    program = dataclasses.replace(lc, **dict.fromkeys(_TRACED_CLIPS, 0.0))
    return _train_step(state, batch, clips, cfg, program, oc, optimizer)


@functools.partial(jax.jit, static_argnames=("cfg", "lc", "oc", "optimizer"), donate_argnums=0)
def _train_step(state, batch, clips, cfg, lc, oc, optimizer):
    lc = dataclasses.replace(lc, **dict(zip(_TRACED_CLIPS, clips)))
    x = losses.LossInputs(
        logp=batch.old_logp,
        old_logp=batch.old_logp,
        advantages=batch.advantages,
        mask=batch.mask,
        weights=batch.weights,
    )
    n = losses.normaliser(lc, x)
    grad_fn = jax.value_and_grad(_loss, has_aux=True)
    m = oc.micro_batches

    def accumulate(carry, i):
        (loss, metrics), grads = grad_fn(state.params, cfg, lc, group_slice(batch, m, i), n)
        total_loss, total_metrics, total_grads = carry
        add = lambda a, b: a + b  # noqa: E731
        return (
            total_loss + loss,
            jax.tree.map(add, total_metrics, metrics),
            parallel.constrain_params(jax.tree.map(add, total_grads, grads)),
        ), None

    # the gradient accumulator lives where the params do (sharded, not gathered)
    zeros = parallel.constrain_params(jax.tree.map(jnp.zeros_like, state.params))
    shapes = jax.eval_shape(lambda: grad_fn(state.params, cfg, lc, group_slice(batch, m, 0), n))
    # summed and reported in float32, whatever the compute dtype
    zero_metrics = jax.tree.map(lambda s: jnp.zeros(s.shape, jnp.float32), shapes[0][1])
    (loss, metrics, grads), _ = jax.lax.scan(accumulate, (0.0, zero_metrics, zeros), jnp.arange(m))
    metrics = jax.tree.map(lambda v: v / m, metrics)  # per-micro-batch means
    grad_norm = optax.global_norm(grads)
    finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)

    def apply(_):
        updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
        return optax.apply_updates(state.params, updates), opt_state

    # A cond, not a select: the skipped branch returns the old state untouched, and the
    # taken one updates the donated buffers in place (a select would hold both copies).
    params, opt_state = jax.lax.cond(finite, apply, lambda _: (state.params, state.opt_state), None)
    state = state.replace(  # the out shardings: the new state where the old one was
        step=state.step + 1,
        params=parallel.constrain_params(params),
        opt_state=parallel.constrain_params(opt_state),
        skipped=state.skipped + (~finite).astype(jnp.int32),
    )
    metrics.update(
        {"train/loss": loss, "train/grad_norm": grad_norm, "train/skipped_updates": state.skipped}
    )
    return state, metrics
