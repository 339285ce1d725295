"""Policy-gradient losses with three log-prob streams, registered by name.

Per response token: mu (behaviour: what the sampler really drew from), pi_old (the clean
policy before the update, at the score temperature) and pi_theta (being optimised). A per-token loss
(`POLICY_LOSSES`) is reduced to a scalar by an aggregation (`AGGREGATIONS`); entropy bonus,
KL to a frozen reference and the truncated importance weight (TIS) wrap around both.

Aggregations divide by a normaliser of the *whole* batch (`normaliser(mask)`), passed in,
so gradient accumulation over micro-batches sums to exactly the full-batch loss.

Rows with loss weight 0 (e.g. EDEN's filtered noisy rollouts) are dropped: their tokens
count in no normaliser. Other weights scale the row's loss (EDEN's gamma).

Every choice here that the papers leave open (normalisers, TIS level, the score
temperature, dual clip) is written down, with verl's choice beside it, in
docs/conventions.md.

Dimension letters: B rows, T response tokens.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import struct
from jaxtyping import Array, Bool, Float

from explore_rl.registry import Registry


@dataclasses.dataclass(frozen=True)
class LossConfig:
    """The policy loss: the config's `rl` section holds these fields with these defaults
    (configs/base.py reads them from here), but for the two the run derives
    (`score_temperature` from `rl.score_temperature`, `max_response_len`)."""

    policy: str = "ppo_clip"  # ppo_clip | gspo
    aggregation: str = "token_mean"  # token_mean | seq_mean_token_mean | seq_mean_token_sum_norm
    eps_low: float = 0.2  # ratio clip below 1
    eps_high: float = 0.28  # ratio clip above 1: clip-higher (DAPO); 0.2 = symmetric PPO
    dual_clip: float = 0.0  # c > 1 bounds the loss of negative advantages (Ye et al. 2020); 0 off
    gspo_eps_low: float = 3e-4  # policy=gspo: sequence-ratio clip (Zheng et al. 2025)
    gspo_eps_high: float = 4e-4
    tis_cap: float = 0.0  # c_IS of w = min(c_IS, pi_old / mu); 0 = no TIS
    tis_level: str = "token"  # token: each token's loss x its own w_t (verl) | row_mean
    score_temperature: float = 1.0  # pi_old and pi_theta are softmax(logits / this)
    entropy_coef: float = 0.0  # alpha: loss -= alpha * entropy
    kl_coef: float = 0.0  # beta: loss += beta * KL(pi_theta || pi_ref), pi_ref the initial policy
    kl_estimator: str = "k3"  # k1 | k3
    max_response_len: int = 0  # Dr.GRPO's constant normaliser; 0 = T of the batch

    def __post_init__(self):
        for field, table in (
            ("policy", POLICY_LOSSES),
            ("aggregation", AGGREGATIONS),
            ("kl_estimator", KL_ESTIMATORS),
            ("tis_level", TIS_LEVELS),
        ):
            if getattr(self, field) not in table:
                raise ValueError(f"{field}={getattr(self, field)!r}: allowed {sorted(table)}")
        if self.policy == "gspo" and self.aggregation != "seq_mean_token_mean":
            raise ValueError(
                "policy='gspo' is a sequence-level objective: use aggregation='seq_mean_token_mean'"
            )
        if self.dual_clip and self.dual_clip <= 1.0:
            raise ValueError(f"dual_clip={self.dual_clip}: must be > 1 (or 0 for off)")
        if not self.score_temperature > 0:
            raise ValueError(f"score_temperature={self.score_temperature}: must be > 0")


@struct.dataclass
class LossInputs:
    logp: Float[Array, "B T"]  # log pi_theta of each response token
    old_logp: Float[Array, "B T"]  # log pi_old
    advantages: Float[Array, " B"]
    mask: Bool[Array, "B T"]
    behaviour_logp: Float[Array, "B T"] | None = None  # log mu (for TIS)
    ref_logp: Float[Array, "B T"] | None = None  # log pi_ref (for KL)
    entropy: Float[Array, "B T"] | None = None  # entropy of pi_theta per token
    weights: Float[Array, " B"] | None = None  # per-row loss weights from explorers


# ----------------------------------------------------------------------------- per-token

PolicyLoss = Callable[["LossInputs", "LossConfig"], tuple[Array, Array, Array]]
POLICY_LOSSES = Registry("rl.policy")


def register(name: str):
    """Register a per-token policy loss as `rl.policy = name`.

    The contract: `f(x: LossInputs, c: LossConfig) -> (loss, clipped_low, clipped_high)`,
    each [B, T]: the loss of every response token (before masking, row weights and
    aggregation, which `policy_loss` applies: padding may hold anything finite), and
    whether that token's ratio was clipped below 1 - eps (with A < 0) or above 1 + eps
    (with A > 0), for the `policy/clip_frac_*` metrics. It must be differentiable in
    `x.logp` and treat `x.old_logp` as a constant. A sequence-level loss gives every token
    of a row the row's value (see `gspo`).
    """

    return POLICY_LOSSES.register(name)


@register("ppo_clip")
def ppo_clip(x: LossInputs, c: LossConfig):
    """-min(rho A, clip(rho, 1 - eps_low, 1 + eps_high) A), rho = pi_theta / pi_old
    (Schulman et al. 2017, Eq. 7; asymmetric clip-higher from DAPO, Yu et al. 2025, Eq. 10),
    optionally dual-clipped at -c A for A < 0 (Ye et al. 2020, Eq. 4)."""
    ratio = jnp.exp(x.logp - x.old_logp)
    a = x.advantages[:, None]
    clipped = jnp.clip(ratio, 1.0 - c.eps_low, 1.0 + c.eps_high)
    loss = jnp.maximum(-a * ratio, -a * clipped)
    if c.dual_clip:
        loss = jnp.where(a < 0, jnp.minimum(loss, -a * c.dual_clip), loss)
    low = (a < 0) & (ratio < 1.0 - c.eps_low)
    high = (a > 0) & (ratio > 1.0 + c.eps_high)
    return loss, low, high


@register("gspo")
def gspo(x: LossInputs, c: LossConfig):
    """Sequence-level ratio s = exp(mean_t log(pi_theta / pi_old)), clipped to
    [1 - eps_low, 1 + eps_high] (Zheng et al. 2025, GSPO, Eq. 5-7). Written per token as
    GSPO-token's s_t = sg[s] pi_theta(y_t) / sg[pi_theta(y_t)] (Eq. 13-14; verl's form):
    every token carries the row's value, so `seq_mean_token_mean` gives GSPO's sequence
    mean and the same gradient, and a per-token weight (TIS) scales that token's own
    gradient term."""
    n = jnp.maximum(jnp.sum(x.mask, axis=1), 1)
    log_s = jnp.sum(jnp.where(x.mask, x.logp - x.old_logp, 0.0), axis=1) / n
    log_s_t = jax.lax.stop_gradient(log_s)[:, None] + x.logp - jax.lax.stop_gradient(x.logp)
    s_t = jnp.exp(log_s_t)
    a = x.advantages[:, None]
    loss = jnp.maximum(-a * s_t, -a * jnp.clip(s_t, 1.0 - c.gspo_eps_low, 1.0 + c.gspo_eps_high))
    low = (a < 0) & (s_t < 1.0 - c.gspo_eps_low)
    high = (a > 0) & (s_t > 1.0 + c.gspo_eps_high)
    return loss, low, high


SUPERVISED = ("nll",)  # losses of given responses (--mode sft), not of sampled ones


@register("nll")
def nll(x: LossInputs, c: LossConfig):
    """-log pi_theta(y_t): supervised fine-tuning's loss on the given response tokens
    (the ratio and the advantages play no part; nothing is clipped)."""
    none = jnp.zeros_like(x.mask)
    return -x.logp, none, none


def kl_k1(logp, ref_logp):
    """log pi_theta - log pi_ref (Schulman 2020, "Approximating KL divergence", k1)."""
    return logp - ref_logp


def kl_k3(logp, ref_logp):
    """exp(r) - r - 1, r = log pi_ref - log pi_theta: unbiased, always >= 0 (k3; the
    estimator of DeepSeekMath Eq. 4)."""
    r = ref_logp - logp
    return jnp.exp(r) - r - 1.0


KL_ESTIMATORS: dict[str, Callable] = {"k1": kl_k1, "k3": kl_k3}


# ----------------------------------------------------------------------------- aggregation


class Aggregation(NamedTuple):
    normaliser: Callable[[Array, int], Array]  # (full-batch mask, max_response_len) -> n
    reduce: Callable[[Array, Array, Array], Array]  # (per-token x, mask, n) -> scalar
    paper: str = ""  # whose aggregation it is (the run's start-up header says it)


def _token_sum(x, mask, n):
    return jnp.sum(jnp.where(mask, x, 0.0)) / jnp.maximum(n, 1)


def _seq_token_mean(x, mask, n):
    per_row = jnp.sum(jnp.where(mask, x, 0.0), axis=1) / jnp.maximum(jnp.sum(mask, axis=1), 1)
    return jnp.sum(per_row) / jnp.maximum(n, 1)


AGGREGATIONS: dict[str, Aggregation] = {
    # DAPO (Yu et al. 2025, Eq. 8): every token of the batch weighs the same.
    "token_mean": Aggregation(
        lambda m, _: jnp.sum(m), _token_sum, "DAPO's token mean (Yu et al. 2025)"
    ),
    # GRPO (Shao et al. 2024, Eq. 3): mean over rows of each row's token mean.
    "seq_mean_token_mean": Aggregation(
        lambda m, _: jnp.sum(jnp.any(m, axis=1)),
        _seq_token_mean,
        "GRPO's mean of each response's token mean (Shao et al. 2024)",
    ),
    # Dr.GRPO (Liu et al. 2025, Eq. 2 fixed): token sum over a constant rows x max length.
    "seq_mean_token_sum_norm": Aggregation(
        lambda m, t: m.shape[0] * (t or m.shape[1]),
        _token_sum,
        "Dr. GRPO's token sum over rows x max length (Liu et al. 2025)",
    ),
}


# ----------------------------------------------------------------------------- the loss


def tis_weight(old_logp: Array, behaviour_logp: Array, cap: float) -> Array:
    """w = min(c_IS, pi_old / mu) per token, no gradient (truncated importance sampling:
    Ionides 2008; Yao et al. 2025 for LLM RL)."""
    return jax.lax.stop_gradient(jnp.minimum(cap, jnp.exp(old_logp - behaviour_logp)))


def _row_mean(w, mask):
    n = jnp.maximum(jnp.sum(mask, axis=1, keepdims=True), 1)
    return jnp.broadcast_to(jnp.sum(jnp.where(mask, w, 0.0), axis=1, keepdims=True) / n, w.shape)


# How the TIS weight meets the per-token loss: each token by its own w_t (verl multiplies
# the per-token policy loss by the per-token weight, for every policy loss, GSPO included),
# or every token of a row by the row's mean w (a sequence-level correction).
TIS_LEVELS: dict[str, Callable] = {"token": lambda w, mask: w, "row_mean": _row_mean}


def active_mask(mask: Array, weights: Array | None) -> Array:
    """The tokens that count: rows of loss weight 0 drop out of every normaliser."""
    return mask if weights is None else mask & (weights[:, None] > 0)


# Metrics `policy_loss` reports as maxima; every other one is a mean over the active tokens
# (so micro-batches combine them weighted by their token counts).
MAX_METRICS = ("tis/max",)


def normaliser(config: LossConfig, x: LossInputs) -> Array:
    """The aggregation's denominator for this (full) batch."""
    return AGGREGATIONS[config.aggregation].normaliser(
        active_mask(x.mask, x.weights), config.max_response_len
    )


def policy_loss(config: LossConfig, x: LossInputs, n: Array | None = None):
    """Scalar loss and metrics. `n`: the full batch's normaliser (for micro-batches)."""
    mask = active_mask(x.mask, x.weights)
    agg = AGGREGATIONS[config.aggregation]
    n = agg.normaliser(mask, config.max_response_len) if n is None else n
    loss_tok, low, high = POLICY_LOSSES[config.policy](x, config)
    metrics = {}
    if config.tis_cap:
        w = tis_weight(x.old_logp, x.behaviour_logp, config.tis_cap)
        loss_tok = loss_tok * TIS_LEVELS[config.tis_level](w, mask)
        metrics.update(_tis_metrics(w, mask, config.tis_cap))
    if x.weights is not None:
        loss_tok = loss_tok * x.weights[:, None]
    loss = agg.reduce(loss_tok, mask, n)
    if config.entropy_coef:
        loss -= config.entropy_coef * agg.reduce(x.entropy, mask, n)
    if config.kl_coef:
        kl = KL_ESTIMATORS[config.kl_estimator](x.logp, x.ref_logp)
        loss += config.kl_coef * agg.reduce(kl, mask, n)
        metrics["policy/kl_ref"] = _token_sum(kl, mask, jnp.sum(mask))
    count = jnp.sum(mask)
    if x.entropy is not None:
        metrics["policy/entropy"] = _token_sum(x.entropy, mask, count)
    if config.policy in SUPERVISED:  # no pi_old, no sampling policy: no ratio to report
        return loss, jax.lax.stop_gradient(metrics)
    ratio_log = x.logp - x.old_logp
    metrics.update(
        {
            "policy/clip_frac_low": _token_sum(low, mask, count),
            "policy/clip_frac_high": _token_sum(high, mask, count),
            "policy/approx_kl": _token_sum(kl_k3(x.logp, x.old_logp), mask, count),
            "policy/ratio_mean": _token_sum(jnp.exp(ratio_log), mask, count),
        }
    )
    if x.behaviour_logp is not None:
        # KL(mu || pi_old) per token, estimated (k1) on the tokens drawn from mu: how far
        # the explorers' sampling is from the policy the update corrects towards.
        metrics["policy/kl_mu_old"] = _token_sum(x.behaviour_logp - x.old_logp, mask, count)
    return loss, jax.lax.stop_gradient(metrics)


def _tis_metrics(w, mask, cap) -> dict:
    count = jnp.sum(mask)
    return {
        "tis/mean": _token_sum(w, mask, count),
        "tis/max": jnp.max(jnp.where(mask, w, 0.0)),
        "tis/clipped_frac": _token_sum(w >= cap, mask, count),
    }
