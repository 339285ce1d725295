"""EDEN: an appended noisy anchor embedding for a few rollouts of each group (EDEN paper).

Per step, each prompt draws one anchor a from a bank of K token embeddings. `noisy` of its
G rollouts (the last ones of the group; 4 of 16 in the paper) are sampled from the prompt
plus one appended input position with embedding a + eps, eps ~ N(0, I) rescaled so that
||eps|| = rho ||a||, independently per row; the others are sampled clean (their slot is
masked, which gives exactly the clean result). Noisy rows' temperature is multiplied by a
cosine warm-up from 0.2 to 1.0 over `warmup` steps. Decoding stays discrete.

After rewards, GRPO advantages are computed over the whole group. Across the batch, the
noisy rows whose |A| is in the top `keep` fraction of all noisy |A| are kept (the first
ceil(keep x n) after a stable sort by |A| descending, then row index: ties go to the
earlier row) and their advantages scaled by `gamma`; the other noisy rows get loss weight 0.
The update scores every row under the clean prompt (the update batch has no appended
slot). TIS is off, as in the paper (`rl.tis_cap` turns it on).

The bank (our viability screen; the paper says only "screened for viability"):
  1. lexical: vocabulary tokens whose raw piece is a word-initial marker ("Ġ" byte-level
     BPE, "▁" sentencepiece) followed by 3+ ASCII letters: no special, whitespace, digit,
     punctuation or sub-word pieces;
  2. `candidates` of those, drawn with `bank_seed` (by default the run's seed, so each seed
     screens its own draw; `pool_tokens` names the pool instead: lab v2's neutral tokens,
     which its SFT taught the model to read past);
  3. probe: on the first `probe_prompts` training problems, `probe_samples` rollouts per
     candidate with the noise-free anchor appended, at temperature 1 (keys from the same
     seed); a candidate is viable when its accuracy is at least the threshold `threshold`
     computes from the clean accuracy on the same problems: clean - `tolerance`
     ("absolute", the default) or (1 - `tolerance`) x clean ("relative": a base that
     solves a few percent passes every candidate under an absolute margin of 0.1, one that
     breaks every answer included); the bank is the first K viable candidates in the drawn
     order. Fewer than K viable is refused (the noisy rows would carry an anchor that
     breaks the answer), unless `allow_unviable` tops the bank up with the most accurate
     others, with a warning.
`bank_tokens` skips the screen with the user's own comma-separated words. The bank (ids
and embedding vectors, taken once from the initial policy) is part of the checkpointed
state, and written to `eden_bank.json` in the run directory with the screen's numbers and
the threshold it used.

Ablations (`anchor`): "bank" (EDEN), "none" (noise alone, norm-matched: ||eps|| = ||a||
for the prompt's drawn anchor), "per_rollout" (each noisy rollout its own token from the
lexical pool, fresh every step), "fixed_random" (one token from the lexical pool for the
whole run); rho = 0 is "no noise", keep = 1 "no filter", bank_size K in {1, 4, 8} and
`noisy` the fraction. The readings of "none", "per_rollout" and "fixed_random" are ours.

    python -m explore_rl.main --config configs/eden.py:demo --workdir runs/eden
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os

import jax
import jax.numpy as jnp
import numpy as np
from tqdm import tqdm

from explore_rl.exploration.base import Explorer, Shaped, StepContext, register
from explore_rl.models.transformer import Interventions
from explore_rl.rl import rollout as rollout_lib
from explore_rl.rl.advantages import zero_advantage_groups
from explore_rl.rl.plan import RolloutPlan
from explore_rl.sampling import schedules
from explore_rl.spec import RunSpec

ANCHORS = ("bank", "none", "per_rollout", "fixed_random")
WORD_MARKERS = ("Ġ", "▁")
POOLS = ("words", "all")
TOLERANCES = ("absolute", "relative")


@register("eden")
class EDEN(Explorer):
    intervenes = ("extra_embeds",)

    def __init__(self, settings, run):
        super().__init__(settings, run)
        self._pool = None  # the lexical pool, for anchor="per_rollout" (built on first use)

    @dataclasses.dataclass(frozen=True)
    class Spec:
        noisy: int = 4  # noisy rollouts per group (4 of 16 in the paper)
        rho: float = 0.18  # ||noise|| / ||anchor||: 0.12 for Qwen2.5-0.5B, 0.18 for math models
        warmup: int = 200  # steps of the noisy rows' cosine temperature warm-up (250/200/400)
        tau_start: float = 0.2  # the warm-up's first temperature factor (-> 1.0)
        keep: float = 0.5  # p: fraction of noisy rows kept, by |advantage|, across the batch
        gamma: float = 0.5  # scale of kept noisy rows' advantages
        anchor: str = "bank"  # bank | none | per_rollout | fixed_random (ablations)
        bank_size: int = 8  # K
        # draws the screen's candidates and its probe rollouts; -1 = the run's seed
        bank_seed: int = -1
        bank_tokens: str = ""  # comma-separated words for the bank; "" = screen the vocabulary
        # the screen's pool: "words" (whole-word tokens) | "all" (every token but the
        # special ones: a character vocabulary's, which has no words)
        pool: str = "words"
        # comma-separated tokens (each one token as written) that are the pool instead
        pool_tokens: str = ""
        candidates: int = 32  # tokens probed by the screen
        probe_prompts: int = 8  # training problems in the screen's probe set
        probe_samples: int = 4  # rollouts per candidate and problem
        # viable: accuracy >= clean - tolerance ("absolute") or (1 - tolerance) x clean
        # ("relative"; tolerance in [0, 1]): `threshold`
        tolerance: float = 0.1
        tolerance_mode: str = "absolute"
        # fewer than K viable: top the bank up with the most accurate others (ours), or refuse
        allow_unviable: bool = False

    @staticmethod
    def check(e: Spec, spec: RunSpec) -> None:
        g = spec.rollout.group_size
        _require(e.anchor in ANCHORS, f"anchor={e.anchor!r}: allowed {ANCHORS}")
        _require(0 <= e.noisy < g, f"noisy={e.noisy}: must be in [0, group_size={g})")
        _require(e.rho >= 0, f"rho={e.rho}: must be >= 0")
        _require(0 < e.keep <= 1, f"keep={e.keep}: must be in (0, 1]")
        _require(e.gamma >= 0, f"gamma={e.gamma}: must be >= 0")
        _require(e.bank_size >= 1, f"bank_size={e.bank_size}: need at least 1")
        _require(e.pool in POOLS, f"pool={e.pool!r}: allowed {POOLS}")
        _require(e.bank_seed >= -1, f"bank_seed={e.bank_seed}: a seed >= 0, or -1 (the run's)")
        _require(
            e.tolerance_mode in TOLERANCES,
            f"tolerance_mode={e.tolerance_mode!r}: allowed {TOLERANCES}",
        )
        most = 1.0 if e.tolerance_mode == "relative" else math.inf
        _require(
            0 <= e.tolerance <= most,
            f"tolerance={e.tolerance}: must be in [0, {most}] ({e.tolerance_mode})",
        )
        words = [w for w in e.bank_tokens.split(",") if w.strip()]
        _require(
            not words or len(words) == e.bank_size,
            f"bank_tokens has {len(words)} words, bank_size={e.bank_size}",
        )
        _require(
            words or e.candidates >= e.bank_size,
            f"candidates={e.candidates} < bank_size={e.bank_size}",
        )
        pool = [t for t in e.pool_tokens.split(",") if t]
        _require(
            words or not pool or len(pool) >= e.bank_size,
            f"pool_tokens has {len(pool)} tokens, bank_size={e.bank_size}",
        )

    @property
    def slots(self) -> int:
        return 1 if self.settings.anchor == "fixed_random" else self.settings.bank_size

    # ------------------------------------------------------------------ state: the bank

    def template(self, ctx: StepContext):
        return {
            "ids": jnp.zeros((self.slots,), jnp.int32),
            "vectors": jnp.zeros((self.slots, ctx.cfg.d_model), jnp.float32),
        }

    @property
    def bank_seed(self) -> int:
        """The screen's seed: `bank_seed`, or the run's seed where it is -1."""
        return self.spec.seed if self.settings.bank_seed < 0 else self.settings.bank_seed

    def init(self, ctx: StepContext):
        e, rng = self.settings, np.random.default_rng(self.bank_seed)
        if e.anchor == "fixed_random":
            ids, report = [int(rng.choice(self.pool_ids(ctx.tok)))], {"fixed_random": True}
        elif e.bank_tokens:
            ids, report = _user_tokens(ctx.tok, e.bank_tokens), {"user_tokens": True}
        else:
            pool = self.pool_ids(ctx.tok)
            drawn = rng.choice(pool, size=min(e.candidates, len(pool)), replace=False)
            ids, report = screen(ctx, [int(i) for i in drawn], e, self.bank_seed)
        state = {
            "ids": jnp.asarray(ids, jnp.int32),
            "vectors": jnp.asarray(ctx.params["embed"][jnp.asarray(ids)], jnp.float32),
        }
        if ctx.workdir:
            report["bank"] = [{"id": i, "token": ctx.tok.decode([i])} for i in ids]
            with open(os.path.join(ctx.workdir, "eden_bank.json"), "w") as f:
                json.dump(report, f, indent=2)
        return state

    # ------------------------------------------------------------------ plan

    def plan(self, state, plan: RolloutPlan, ctx: StepContext, rng) -> RolloutPlan:
        e = self.settings
        b = plan.temperature.shape[0]
        g = ctx.spec.rollout.group_size
        noisy = jnp.arange(b) % g >= g - e.noisy
        k_anchor, k_row, k_noise = jax.random.split(rng, 3)
        anchor = jax.random.randint(k_anchor, (b // g,), 0, state["ids"].shape[0])
        a = self.anchor_vectors(state, ctx, anchor, g, k_row)
        slot = noise(k_noise, a, 1.0) if e.anchor == "none" else a + noise(k_noise, a, e.rho)
        warm = schedules.cosine_warmup(ctx.step, e.warmup, e.tau_start, 1.0)
        tau = plan.temperature * schedules.per_row(noisy, warm, 1.0)[:, None]
        iv = Interventions(extra_embeds=slot[:, None, :], extra_mask=noisy[:, None])
        if plan.interventions is not None:
            iv = plan.interventions.replace(extra_embeds=iv.extra_embeds, extra_mask=iv.extra_mask)
        info = {**plan.info, self.name: {"noisy": noisy, "anchor": anchor}}
        return plan.replace(temperature=tau, interventions=iv, info=info)

    # ------------------------------------------------------------------ shape

    def shape_advantages(self, state, rollouts, advantages, weights, ctx: StepContext) -> Shaped:
        e = self.settings
        info = rollouts.plan.info[self.name]
        noisy = np.asarray(info["noisy"])
        kept = keep_top(np.abs(advantages), noisy, e.keep)
        advantages = np.where(kept, e.gamma * advantages, advantages)
        weights = np.where(noisy & ~kept, 0.0, weights).astype(np.float32)
        metrics = shape_metrics(rollouts, noisy, kept, e.noisy)
        if e.anchor != "per_rollout":
            anchors = np.asarray(info["anchor"])
            metrics.update(
                {f"anchor_use/{k}": float(np.mean(anchors == k)) for k in range(self.slots)}
            )
        return Shaped(advantages, weights, state, metrics)

    def anchor_vectors(self, state, ctx: StepContext, anchor, g: int, rng):
        """[B, D]: each row's anchor (per prompt from the bank, or per row from the pool)."""
        if self.settings.anchor != "per_rollout":
            return jnp.repeat(state["vectors"][anchor], g, axis=0)
        if self._pool is None:
            self._pool = jnp.asarray(self.pool_ids(ctx.tok))
        ids = self._pool[jax.random.randint(rng, (anchor.shape[0] * g,), 0, len(self._pool))]
        return ctx.params["embed"][ids].astype(jnp.float32)

    def pool_ids(self, tok) -> np.ndarray:
        """The ids the bank's candidates are drawn from: `pool_tokens`' or the lexical pool's."""
        if not self.settings.pool_tokens:
            return lexical_pool(tok, self.settings.pool)
        return np.asarray(tok.token_ids(self.settings.pool_tokens, "exploration.eden.pool_tokens"))


def _require(ok: bool, message: str):
    if not ok:
        raise ValueError(f"config: exploration.eden.{message}")


def lexical_pool(tok, pool: str = "words") -> np.ndarray:
    """Ids the bank's candidates are drawn from: "words", whole-word tokens (a word-initial
    marker then 3+ ASCII letters); "all", every token that is not a special one."""
    backend = tok.backend
    if pool == "all":
        special = {i for i, t in backend.get_added_tokens_decoder().items() if t.special}
        ids = [i for i in range(backend.get_vocab_size()) if i not in special]
    else:
        pieces = [backend.id_to_token(i) or "" for i in range(backend.get_vocab_size())]
        ids = [i for i, p in enumerate(pieces) if p[:1] in WORD_MARKERS and _is_word(p[1:])]
    if not ids:
        raise ValueError(
            f"EDEN: the tokenizer has no {'whole-word' if pool == 'words' else 'ordinary'} "
            "tokens to build a bank from (exploration.eden.pool='all' takes every token but "
            "the special ones)"
        )
    return np.asarray(ids)


def _is_word(text: str) -> bool:
    return len(text) >= 3 and text.isascii() and text.isalpha()


def _user_tokens(tok, words: str) -> list[int]:
    ids = []
    for w in (w.strip() for w in words.split(",") if w.strip()):
        enc = tok.encode(" " + w)
        if len(enc) != 1:
            raise ValueError(f"config: exploration.eden.bank_tokens: {w!r} is {len(enc)} tokens")
        ids.append(enc[0])
    return ids


def screen(
    ctx: StepContext, candidates: list[int], e: EDEN.Spec, seed: int
) -> tuple[list[int], dict]:
    """The viable candidates (module docstring), their probe rollouts drawn from `seed`;
    the bank ids and the screen's numbers."""
    problems = ctx.train_set[: e.probe_prompts]
    n = e.probe_samples
    routes = [None, *candidates]  # None: the clean route
    acc = []
    per_call = max(1, 256 // (len(problems) * n))  # a call: <= 256 rows, or one route
    key = jax.random.key(seed)
    for start in tqdm(range(0, len(routes), per_call), desc="EDEN bank screen", leave=False):
        chunk = routes[start : start + per_call]
        acc += _probe(ctx, problems, chunk, n, jax.random.fold_in(key, start))
    clean, scores = acc[0], dict(zip(candidates, acc[1:]))
    limit = threshold(clean, e.tolerance, e.tolerance_mode)
    viable = [i for i in candidates if scores[i] >= limit]
    ids = viable[: e.bank_size]
    if len(ids) < e.bank_size:
        found = (
            f"EDEN: {len(viable)} of {len(candidates)} candidates viable (accuracy >= "
            f"{limit:.4f} = {_rule(clean, e)}; the best {max(scores.values()):.4f})"
        )
        if not e.allow_unviable:
            raise ValueError(
                f"{found}, the bank needs K = {e.bank_size}: screen more "
                "(exploration.eden.candidates), widen exploration.eden.tolerance, name "
                "exploration.eden.bank_tokens, or set exploration.eden.allow_unviable=True "
                "to take the most accurate others"
            )
        logging.warning("%s; the bank takes the most accurate others", found)
        rest = sorted((i for i in candidates if i not in ids), key=lambda i: -scores[i])
        ids += rest[: e.bank_size - len(ids)]
    report = {
        "clean_accuracy": clean,
        "tolerance": e.tolerance,
        "tolerance_mode": e.tolerance_mode,
        "threshold": limit,
        "bank_seed": seed,
        "candidates": [
            {"id": i, "token": ctx.tok.decode([i]), "accuracy": scores[i]} for i in candidates
        ],
    }
    return ids, report


def threshold(clean: float, tolerance: float, mode: str = "absolute") -> float:
    """The accuracy a candidate needs to be viable (our rule; the EDEN paper says only
    "screened for viability"): clean - tolerance ("absolute"), or (1 - tolerance) x clean
    ("relative": at a clean accuracy of a few percent an absolute margin of 0.1 is below
    zero, and every candidate passes). Less 1e-9: accuracies are fractions k / n, and one
    on the line stays viable whatever the rounding ((1 - 0.7) x 0.1 = 0.030000000000000006)."""
    exact = clean - tolerance if mode == "absolute" else (1 - tolerance) * clean
    return exact - 1e-9


def _rule(clean: float, e: EDEN.Spec) -> str:
    """`threshold`'s rule in words, with its numbers."""
    if e.tolerance_mode == "absolute":
        return f"clean {clean:.4f} - tolerance {e.tolerance}"
    return f"(1 - tolerance {e.tolerance}) x clean {clean:.4f}"


def _probe(ctx: StepContext, problems, routes, n: int, rng) -> list[float]:
    """Accuracy of each route (None = clean, else a token id appended without noise)."""
    g = len(routes) * n
    b = len(problems) * g
    route_of_row = np.arange(b) % g // n
    ids = np.asarray([0 if r is None else r for r in routes])[route_of_row]
    appended = np.asarray([r is not None for r in routes])[route_of_row]
    iv = Interventions(
        extra_embeds=ctx.params["embed"][jnp.asarray(ids)][:, None, :],
        extra_mask=jnp.asarray(appended)[:, None],
    )
    tau = jnp.ones((b, ctx.spec.rollout.sampling.max_new_tokens), jnp.float32)
    plan = RolloutPlan(tau, iv, problems=problems)
    ro = rollout_lib.generate(
        ctx.params, ctx.cfg, ctx.tok, plan, rng, ctx.verifier, **ctx.spec.generation()
    )
    correct = ro.correct.reshape(len(problems), len(routes), n)
    return [float(x) for x in correct.mean(axis=(0, 2))]


def noise(rng, anchors, rho: float):
    """eps ~ N(0, I) per row, rescaled to ||eps|| = rho ||anchor|| (EDEN paper)."""
    eps = jax.random.normal(rng, anchors.shape, jnp.float32)
    scale = rho * jnp.linalg.norm(anchors, axis=-1, keepdims=True)
    return eps / jnp.linalg.norm(eps, axis=-1, keepdims=True) * scale


def keep_top(abs_adv: np.ndarray, noisy: np.ndarray, keep: float) -> np.ndarray:
    """The noisy rows whose |A| is in the top `keep` fraction across the batch: the first
    ceil(keep n) by |A| descending, ties to the lower row index (deterministic)."""
    rows = np.flatnonzero(noisy)
    k = math.ceil(keep * len(rows) - 1e-9)  # 0.3 x 10 is 3.0000000000000004 in floats
    order = rows[np.lexsort((rows, -abs_adv[rows]))]
    kept = np.zeros(noisy.shape, bool)
    kept[order[:k]] = True
    return kept


def shape_metrics(rollouts, noisy, kept, n_noisy: int) -> dict[str, float]:
    q, g = rollouts.rewards.shape
    rewards = rollouts.rewards.reshape(-1)
    clean = rewards.reshape(q, g)[:, : g - n_noisy]
    entropy, mask = np.asarray(rollouts.out.entropy), np.asarray(rollouts.out.mask)
    out = {
        "reward_noisy": float(rewards[noisy].mean()) if noisy.any() else float("nan"),
        "reward_clean": float(rewards[~noisy].mean()),
        "kept_frac": float(kept.sum() / max(noisy.sum(), 1)),
        # groups the clean rows alone would leave without signal
        "clean_zero_adv_frac": float(np.mean(zero_advantage_groups(clean))),
        # the policy's own spread, without the noisy rows' (their anchor perturbs it)
        "clean_entropy": float(entropy[~noisy][mask[~noisy]].mean()),
    }
    per_prompt = kept.reshape(q, g).sum(axis=1)
    for k in range(n_noisy + 1):
        out[f"kept_per_prompt/{k}"] = float(np.mean(per_prompt == k))
    return out
