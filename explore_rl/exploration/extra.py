"""ExTra: a correctness-gated novelty reward and entropy-guided prefix regeneration
(ExTra paper).

Novelty (ExTra-N, every step). Each correct response is embedded (all-MiniLM-L6-v2 in
JAX, `models/minilm.py`; or 4-gram vectors, or the policy's mean-pooled last hidden state)
and compared with its problem's memory Phi(x): the embeddings of the `memory` most recent
correct responses to that problem (keyed by `Problem.id`; default G) plus its current
correct siblings. r_int = 1[correct] (1 - max_{z' in Phi} cos(z, z')) (ExTra paper, Sec. 4.1);
a correct response with an empty Phi (the first one ever seen for its problem, alone in
its group) gets 1 (ours). It enters the advantage after GRPO's normalisation,
A = A_GRPO + gamma r_int (the paper), or as a reward before it (`novelty_at = "before"`:
where the public code adds it; that code's other novelty details, a per-group
normalisation of the bonus, an exp(-lambda Var) scale, an 8-entry warm-up and an unbounded
memory, are not implemented, so "before" is that ordering alone). The step's correct
embeddings then join the memory. The paper's Table 6 compares other novelty signals:
count-based n-grams are close to `features = "ngram"` (hashed 4-gram count vectors, by
cosine); policy surprise is not implemented.

Prefix regeneration (ExTra-R, from step `warmup` on). A problem is hard when its pass rate
is <= 1/G (`hard = "pass_rate"`, the public code) or when every rollout failed
(`"all_incorrect"`, the paper's App. B.5). Every rollout of a hard group is cut into
prefixes (`mine = "all"`: the paper's Fig. 1, "all rollout prefixes are scored"), or only
the one with the lowest mean token entropy (`"lowest"`: the public code; under `pass_rate`
it can be the one correct response). Entropies are the sampling policy's at temperature 1,
from the sampler. In a response, the cut points are the tokens that end a line; walking
from the start, a cut is kept when it is at least `min_gap` tokens after the last kept one
(or the response start: ours, the paper says "merge cuts less than 32 tokens apart"); the
last kept cut is dropped (its prefix is almost the whole response); at most `max_cuts`
evenly spaced ones remain. A cut's score is the mean token entropy (MTE) of the response up
to and including it. Each cut's prefix joins the problem's prefix memory (at most
`max_prefixes`, the oldest leave first) with its embedding; the scores are smoothed over
that memory, h~ = softmax(E E^T / tau) h (tau = 0.1, the paper's App. B), and the prefix
with the lowest h~ is chosen (cuts whose guided prompt would pass `rollout.max_prompt_len`
are dropped; MiniLM reads a text's first 256 word pieces, so prefixes longer than that
embed alike, and a tie goes to the lowest own MTE, not to the oldest entry). The guided
prompt (the problem with the chosen prefix in the assistant turn) is pushed to a FIFO queue
(at most `queue`, the oldest dropped) and replaces the tail of a later batch as its own
group: at most `guided_frac` of the batch's groups (ours). A guided group is rewarded on
prefix + response against its *own* problem's answer (the public code scores it against the
answer of the problem it displaced: not copied), and the update scores the response tokens
only (the prefix is prompt). Guided groups are not themselves mined for prefixes.
`clamp_guided` floors guided rows' advantages at 0.

Whether the memories act shows in two metrics: `novelty_recalled`, the share of a step's
groups with a correct response whose problem's memory already held correct responses from
earlier steps (else the bonus compares a response with its siblings alone), and
`prefix_recalled`, the share of its hard groups whose problem had prefixes from earlier
steps to smooth over. Both need problems that recur (`rollout.pool`).

Memories and the queue are host state (`hoststate.HostState`), saved with each checkpoint;
embeddings are stored as float16. A guided prompt is used once: the step removes the
entries its plan took, whether or not their groups stayed in the batch (with dynamic
sampling the refill batches take the same head, and all-wrong groups are dropped; only the
groups kept in the batch are mined for prefixes).

Variants (configs/extra.py): ExTra-N (`regen = False`), ExTra-R (`novelty = False`),
ExTra (both).

    python -m explore_rl.main --config configs/extra.py:demo --workdir runs/extra
"""

from __future__ import annotations

import base64
import dataclasses
import functools
import time
import warnings
import zlib

import jax
import jax.numpy as jnp
import numpy as np

from explore_rl.data.tasks import Problem
from explore_rl.exploration.base import Explorer, Shaped, StepContext, register
from explore_rl.hoststate import HostState
from explore_rl.rl.plan import RolloutPlan
from explore_rl.rl.scoring import readout
from explore_rl.sampling.shapes import bucket
from explore_rl.spec import RunSpec

FEATURES = ("minilm", "ngram", "hidden")
# which rollouts of a hard group are cut into prefixes, from their mean token entropies
MINES = {
    "all": lambda mte: np.arange(len(mte)),  # every rollout's prefixes (ExTra paper, Fig. 1)
    "lowest": lambda mte: np.array([int(np.argmin(mte))]),  # the lowest-MTE one (public code)
}
NGRAM_DIM = 4096  # hashed 4-gram buckets


@register("extra")
class ExTra(Explorer):
    replaces_prompts = True

    def __init__(self, settings, run):
        super().__init__(settings, run)
        self._encoder = None  # built on first use (loading MiniLM takes ~0.5 s)
        self._ends_line: dict[int, bool] = {}  # token id -> does its text hold a line break

    @dataclasses.dataclass(frozen=True)
    class Spec:
        novelty: bool = True  # ExTra-N: the correctness-gated novelty reward
        regen: bool = True  # ExTra-R: entropy-guided prefix regeneration
        gamma: float = 1.0  # novelty coefficient; ExTra paper, App. B: 1.0
        novelty_at: str = "after"  # after GRPO's normalisation (the paper) | before (as a reward)
        memory: int = 0  # correct responses remembered per problem; 0 = G (ExTra paper: 6 = G)
        features: str = "minilm"  # novelty features: minilm | ngram | hidden (policy state)
        encoder: str = "embedded"  # all-MiniLM-L6-v2 of the wheel, or a sentence-transformers dir
        last_tokens: int = 0  # embed only a response's last N tokens (the code: 512); 0 = all
        warmup: int = 30  # T_warm: steps before regeneration starts; ExTra paper, App. B.5: 30
        hard: str = "pass_rate"  # pass_rate (<= 1/G, the code) | all_incorrect (the paper)
        mine: str = "all"  # rollouts cut into prefixes: all (the paper) | lowest (the code); MINES
        min_gap: int = 32  # tokens between kept cut points
        max_cuts: int = 15  # cut points kept per response, evenly spaced
        max_prefixes: int = 128  # prefixes remembered per problem; ExTra paper, App. B.5: 128
        tau: float = 0.1  # smoothing temperature; ExTra paper, App. B: 0.1
        queue: int = 4096  # guided prompts waiting; ExTra paper, App. B.5: 4,096
        guided_frac: float = 0.5  # most of a batch's groups that guided prompts replace (ours)
        clamp_guided: bool = False  # guided rows' advantages floored at 0

    @staticmethod
    def check(e: Spec, spec: RunSpec) -> None:
        _require(e.novelty or e.regen, "novelty and regen are both off: nothing to do")
        _require(e.novelty_at in ("after", "before"), f"novelty_at={e.novelty_at!r}")
        _require(e.features in FEATURES, f"features={e.features!r}: allowed {FEATURES}")
        _require(e.hard in ("pass_rate", "all_incorrect"), f"hard={e.hard!r}")
        _require(e.mine in MINES, f"mine={e.mine!r}: allowed {tuple(MINES)}")
        _require(e.memory >= 0 and e.gamma >= 0, "memory and gamma must be >= 0")
        _require(e.tau > 0, f"tau={e.tau}: must be > 0")
        _require(e.min_gap >= 1 and e.max_cuts >= 1, "min_gap and max_cuts must be >= 1")
        _require(e.max_prefixes >= 1 and e.queue >= 1, "max_prefixes and queue must be >= 1")
        _require(0 <= e.guided_frac <= 1, f"guided_frac={e.guided_frac}: must be in [0, 1]")
        if e.regen and spec.rollout.dynamic_sampling:
            warnings.warn(
                "ExTra-R with dynamic sampling mines only the groups the filter keeps "
                "(all-wrong ones are dropped before regeneration sees them)",
                stacklevel=2,
            )

    # ------------------------------------------------------------------ state

    def init(self, ctx: StepContext):
        return {
            "pushed": jnp.zeros((), jnp.int32),  # guided prompts pushed so far
            "host": HostState({"correct": {}, "prefixes": {}, "queue": []}),
        }

    # ------------------------------------------------------------------ plan

    def plan(self, state, plan: RolloutPlan, ctx: StepContext, rng) -> RolloutPlan:
        """The queue's oldest guided prompts replace the batch's last groups."""
        q = len(plan.problems)
        b = plan.temperature.shape[0]
        queue = state["host"].data["queue"]
        k = min(len(queue), int(self.settings.guided_frac * q)) if self.settings.regen else 0
        guided = [Problem.from_json(e) for e in queue[:k]]
        rows = np.zeros(b, bool)
        rows[(q - k) * (b // q) :] = True
        # per row: the guided rows, and how many queue entries the plan took (k)
        info = {
            **plan.info,
            self.name: {"guided": rows, "taken": np.full(b, k, np.int32)},
        }
        return plan.replace(problems=plan.problems[: q - k] + guided, info=info)

    def step_sizes(self, sizes):
        """A guided prompt carries a prefix of a response (shorter than one): prompts up to
        a response longer, in the rollout and in the update."""
        if not self.settings.regen:
            return sizes
        return dataclasses.replace(sizes, prompt_len=bucket(sizes.prompt_len + sizes.new_tokens))

    # ------------------------------------------------------------------ rewards, advantages

    def rewards(self, state, rollouts, rewards: np.ndarray, ctx: StepContext) -> np.ndarray:
        e = self.settings
        if not e.novelty or e.novelty_at != "before":
            return rewards
        r_int, _ = self.novelty(state, rollouts, ctx)
        return rewards + e.gamma * r_int.reshape(rewards.shape)

    def shape_advantages(self, state, rollouts, advantages, weights, ctx: StepContext) -> Shaped:
        e = self.settings
        data = dict(state["host"].data)
        guided = np.asarray(rollouts.plan.info[self.name]["guided"])
        metrics = {"guided_rows": float(guided.sum())}
        if guided.any():
            metrics["guided_solve_rate"] = float(rollouts.correct.reshape(-1)[guided].mean())
        t0 = time.perf_counter()
        if e.novelty:
            # the groups whose bonus reads the memory: those with a correct response
            solved = rollouts.correct.any(axis=1)
            if solved.any():
                remembered = [p.id in data["correct"] for p in rollouts.problems]
                metrics["novelty_recalled"] = float(np.mean(np.asarray(remembered)[solved]))
            r_int, embeddings = self.novelty(state, rollouts, ctx)
            correct = rollouts.correct.reshape(-1)
            if e.novelty_at == "after":
                advantages = advantages + e.gamma * r_int
            if correct.any():
                metrics["novelty_mean"] = float(r_int[correct].mean())
            data["correct"] = self._remember(data["correct"], rollouts, embeddings)
        metrics["encoder_s"] = time.perf_counter() - t0
        if e.clamp_guided:
            advantages = np.where(guided, np.maximum(advantages, 0.0), advantages)
        # the plan took the queue's first k entries: each is used once, kept in the batch or
        # not (a DAPO refill batch takes the same head, and the step consumes it once)
        taken = int(np.max(rollouts.plan.info[self.name]["taken"]))
        queue = data["queue"][taken:]
        pushed = int(state["pushed"])
        if e.regen and ctx.step >= e.warmup:
            t0 = time.perf_counter()
            fresh, data["prefixes"], found = self.regenerate(
                data["prefixes"], rollouts, guided, ctx
            )
            queue = (queue + fresh)[-e.queue :]
            pushed += len(fresh)
            metrics.update(found, prefix_s=time.perf_counter() - t0)
        data["queue"] = queue
        metrics["queue"] = len(queue)
        state = {"pushed": jnp.asarray(pushed, jnp.int32), "host": HostState(data)}
        return Shaped(advantages.astype(np.float32), weights, state, metrics)

    # ------------------------------------------------------------------ novelty

    def novelty(self, state, rollouts, ctx: StepContext):
        """(r_int [B], the rows' embeddings [B, F]) against each problem's memory."""
        g = rollouts.group_size
        correct = rollouts.correct.reshape(-1)
        z = self.features(rollouts, ctx)
        memory = state["host"].data["correct"]
        r_int = np.zeros(len(correct), np.float32)
        for i, problem in enumerate(rollouts.problems):
            rows = np.arange(i * g, (i + 1) * g)
            stored = [unpack(s) for s in memory.get(problem.id, [])]
            r_int[rows] = novelty_reward(z[rows], correct[rows], np.asarray(stored, np.float32))
        return r_int, z

    def features(self, rollouts, ctx: StepContext) -> np.ndarray:
        e = self.settings
        tokens, mask = np.asarray(rollouts.out.tokens), np.asarray(rollouts.out.mask)
        if e.features == "hidden":
            return np.asarray(
                _mean_hidden(
                    ctx.params,
                    ctx.cfg,
                    jnp.asarray(rollouts.prompts),
                    jnp.asarray(rollouts.prompt_mask),
                    jnp.asarray(tokens),
                    jnp.asarray(mask),
                )
            )
        g = rollouts.group_size  # the tokens the reward saw: a guided row's prefix + response
        rows = [
            np.concatenate([rollouts.problems[i // g].prefix, t[m]]).astype(np.int64)
            for i, (t, m) in enumerate(zip(tokens, mask))
        ]
        if e.last_tokens:
            rows = [r[-e.last_tokens :] for r in rows]
        if e.features == "ngram":
            return np.stack([ngram_vector(r) for r in rows])
        texts = rollouts.texts if not e.last_tokens else [ctx.tok.decode(list(r)) for r in rows]
        return self.encoder.embed(list(texts))

    @property
    def encoder(self):
        if self._encoder is None:
            from explore_rl.models import minilm

            self._encoder = minilm.load(self.settings.encoder)
        return self._encoder

    def _remember(self, memory: dict, rollouts, z: np.ndarray) -> dict:
        """Each problem's most recent correct embeddings, the step's appended."""
        memory, g = dict(memory), rollouts.group_size
        size = self.settings.memory or g
        correct = rollouts.correct.reshape(-1)
        for i, problem in enumerate(rollouts.problems):
            new = [pack(z[j]) for j in range(i * g, (i + 1) * g) if correct[j]]
            if new:
                memory[problem.id] = (memory.get(problem.id, []) + new)[-size:]
        return memory

    # ------------------------------------------------------------------ regeneration

    def regenerate(self, prefixes: dict, rollouts, guided: np.ndarray, ctx: StepContext):
        """(new guided prompts for the queue, the prefix memories, metrics)."""
        e, g = self.settings, rollouts.group_size
        tokens, mask = np.asarray(rollouts.out.tokens), np.asarray(rollouts.out.mask)
        entropy = np.asarray(rollouts.out.entropy)
        prefixes, fresh, chosen, random_mte = dict(prefixes), [], [], []
        rng = np.random.default_rng([ctx.step, 2])
        hard = recalled = 0
        earlier = set(prefixes)  # a problem twice in one batch: not recalled the second time
        for i, problem in enumerate(rollouts.problems):
            rows = np.arange(i * g, (i + 1) * g)
            if guided[rows[0]] or not is_hard(rollouts.correct[i], e.hard):
                continue
            hard += 1
            mte = [entropy[r][mask[r]].mean() if mask[r].any() else np.inf for r in rows]
            room = ctx.spec.rollout.max_prompt_len - int(np.sum(rollouts.prompt_mask[i]))
            cuts = [
                p
                for r in rows[MINES[e.mine](np.asarray(mte))]
                for p in self.cut(tokens[r][mask[r]], entropy[r][mask[r]], room, ctx.tok)
            ]
            recalled += problem.id in earlier
            if not cuts:
                continue
            scores = [s for _, s in cuts]
            texts = [ctx.tok.decode(list(p)) for p, _ in cuts]
            z = self.prefix_features(texts, [p for p, _ in cuts])
            entries = prefixes.get(problem.id, []) + [
                {"tokens": p.tolist(), "mte": s, "z": pack(v)} for (p, s), v in zip(cuts, z)
            ]
            entries = entries[-e.max_prefixes :]
            prefixes[problem.id] = entries
            smoothed = smooth_scores(
                np.stack([unpack(x["z"]) for x in entries]),
                np.asarray([x["mte"] for x in entries]),
                e.tau,
            )
            best = entries[lowest(smoothed, np.asarray([x["mte"] for x in entries]))]
            chosen.append(best["mte"])
            random_mte.append(scores[int(rng.integers(len(scores)))])  # a cut mined this step
            # the whole problem (its chat and dataset row too: the reward reads them)
            fresh.append({**problem.to_json(), "prefix": best["tokens"]})
        metrics = {"hard": hard, "pushed": len(fresh)}
        if hard:
            metrics["prefix_recalled"] = recalled / hard
        if chosen:
            metrics.update(mte_chosen=float(np.mean(chosen)), mte_random=float(np.mean(random_mte)))
        return fresh, prefixes, metrics

    def cut(self, resp: np.ndarray, ent: np.ndarray, room: int, tok) -> list[tuple]:
        """(prefix, its MTE) at each cut of one response (`select_cuts`) whose guided prompt
        fits in `room` tokens; MTE = the mean token entropy up to and including the cut."""
        cuts = select_cuts(
            np.flatnonzero(self.ends_line(tok, resp)), self.settings.min_gap, self.settings.max_cuts
        )
        return [(resp[: c + 1], float(ent[: c + 1].mean())) for c in cuts if c + 1 <= room]

    def prefix_features(self, texts: list[str], tokens: list[np.ndarray]) -> np.ndarray:
        """Prefix embeddings for the smoothing: 4-gram vectors with `features = "ngram"`,
        MiniLM otherwise (the paper's)."""
        if self.settings.features == "ngram":
            return np.stack([ngram_vector(t) for t in tokens])
        return self.encoder.embed(texts)

    def ends_line(self, tok, ids: np.ndarray) -> np.ndarray:
        """Per token of `ids`: whether its text contains a line break (decoded once per id)."""
        for i in set(ids.tolist()) - self._ends_line.keys():
            self._ends_line[i] = "\n" in tok.decode([i])
        return np.asarray([self._ends_line[i] for i in ids.tolist()], bool)


# ----------------------------------------------------------------------------- pieces


def novelty_reward(z: np.ndarray, correct: np.ndarray, stored: np.ndarray) -> np.ndarray:
    """r_int of a group's rows (ExTra paper, Sec. 4.1): 1[correct] (1 - max cos(z, Phi)),
    Phi = the stored embeddings and the other correct rows of the group; 1 when Phi is
    empty. Rows of z are unit vectors."""
    out = np.zeros(len(z), np.float32)
    for j in np.flatnonzero(correct):
        siblings = z[[k for k in np.flatnonzero(correct) if k != j]]
        phi = np.concatenate([stored.reshape(-1, z.shape[1]), siblings])
        out[j] = 1.0 - float(np.max(phi @ z[j])) if len(phi) else 1.0
    return out


def is_hard(correct: np.ndarray, rule: str) -> bool:
    if rule == "all_incorrect":
        return not correct.any()
    return correct.mean() <= 1.0 / len(correct)


def select_cuts(cuts: np.ndarray, min_gap: int, max_cuts: int) -> np.ndarray:
    """Cut positions (the index of the line-ending token): each kept cut at least min_gap
    tokens after the previous kept one (the first, after the response start), the last
    dropped, at most max_cuts evenly spaced."""
    kept, last = [], -1
    for c in cuts:
        if c - last >= min_gap:
            kept.append(int(c))
            last = c
    kept = kept[:-1]
    if len(kept) > max_cuts:
        kept = [kept[i] for i in np.linspace(0, len(kept) - 1, max_cuts).round().astype(int)]
    return np.asarray(kept, np.int64)


def smooth_scores(z: np.ndarray, h: np.ndarray, tau: float) -> np.ndarray:
    """h~ = softmax(Z Z^T / tau) h, row-wise softmax (ExTra paper, Sec. 4.3)."""
    logits = z @ z.T / tau
    w = np.exp(logits - logits.max(axis=1, keepdims=True))
    return (w / w.sum(axis=1, keepdims=True)) @ h


def lowest(smoothed: np.ndarray, mte: np.ndarray) -> int:
    """The entry with the lowest smoothed score; among equal ones (prefixes that embed
    alike: MiniLM reads 256 word pieces), the lowest own MTE, not the oldest."""
    return int(np.lexsort((mte, smoothed))[0])


def ngram_vector(tokens: np.ndarray, n: int = 4) -> np.ndarray:
    """A unit vector of hashed token n-gram counts (zero for fewer than n tokens)."""
    v = np.zeros(NGRAM_DIM, np.float32)
    for i in range(len(tokens) - n + 1):
        v[zlib.crc32(np.asarray(tokens[i : i + n], np.int64).tobytes()) % NGRAM_DIM] += 1.0
    norm = np.linalg.norm(v)
    return v / norm if norm else v


def pack(v: np.ndarray) -> str:
    """An embedding as JSON-able text (float16, base64)."""
    return base64.b64encode(np.asarray(v, np.float16).tobytes()).decode()


def unpack(s: str) -> np.ndarray:
    return np.frombuffer(base64.b64decode(s), np.float16).astype(np.float32)


@functools.partial(jax.jit, static_argnames="cfg")
def _mean_hidden(params, cfg, prompts, prompt_mask, tokens, mask):
    """The policy's last block output, averaged over each response, unit rows."""
    h = readout(params, cfg, prompts, prompt_mask, tokens, mask, cfg.n_layers - 1)
    h = jnp.sum(jnp.where(mask[..., None], h.astype(jnp.float32), 0.0), axis=1)
    return h / jnp.maximum(jnp.linalg.norm(h, axis=-1, keepdims=True), 1e-12)


def _require(ok: bool, message: str):
    if not ok:
        raise ValueError(f"config: exploration.extra.{message}")
