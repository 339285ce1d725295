"""ASE: activation-space exploration with an online steering bank (ASE paper).

Rollouts of a problem are routed: route 0 is the clean policy, route k in 1..K adds
alpha * v_k to the output of transformer block `layer` at every forward of the rollout
(prompt prefill and each decode step; ASE paper, Eq. 7). The K + 1 routes are spread as
evenly as possible over each group, in contiguous blocks (G = 8, K = 3: two rows each);
rows of one (problem, route) share one prefill. While the bank is empty every row is clean.

After the verifier, in each group with both outcomes, min(|P|, |N|) correct and incorrect
rollouts are paired at random. Each pair's prompt + response is replayed through the
unsteered policy that sampled it (the update's scoring pass with a readout, stopped after
block `layer`: `scoring.readout`), reading block `layer`'s output at response token
floor(f x length) (`position = "fraction"`, f = 0.25) or its mean over the response
(`"mean"`). The pairs (h+, h-) go to a buffer of fixed capacity (the oldest leave first).

When the buffer holds >= `min_pairs` pairs and >= `interval` steps passed since the last
update, the bank is re-estimated from it (ASE paper, Sec. 3.2, Eq. 4-6) and the buffer is
cleared: PCA to `d_pca` dimensions fitted on the pooled h+ and h- (scikit-learn), K-means
(K clusters, seeded) on the PCA-space differences Q h+ - Q h-, each cluster's mean of the
raw differences h+ - h- in the model's space, a Hungarian matching of the new candidates
to the previous bank on cosine (scipy), the EMA u_k <- beta u_k + (1 - beta) u_hat (the
first update takes u_hat as it is), and v_k = u_k / ||u_k||. The update happens after
step t's rollouts and before its optimizer steps; the plan of step t + 1 is the first to
use the new bank (the paper's "staged until the actor update finishes").

The update trains the plain policy on every row under the clean prompt: pi_old is
recomputed (steered rows' mu is not pi_old), and each token is weighted by
w = min(c_IS, pi_old / mu_steered), c_IS = 2 (`rl.tis_cap`, set by configs/ase.py; the
paper's Eq. 9). Evaluation samples the plain policy unless `at_eval` (inference-time
steering, routed as in training).

Ablations (ASE paper, Sec. 4 and App. D): `directions = "random"` (each candidate replaced
by a random Gaussian vector of its norm before the EMA), `"shuffled"` (h+ and h- swapped
within each pair at random before PCA), `"reversed"` (the candidates negated);
`routing = "unstructured"` (every row its own fresh random unit vector each step, no clean
route, no contrasts, no clustering, no EMA); `beta = 0` (no EMA); `match = False` (no
Hungarian matching).

Choices the paper leaves open, ours: `min_pairs` (B_min), `interval` (Delta), `capacity`,
the contiguous route layout, the readout at the response token at floor(f x length) as
input, and the seeds of pairing, PCA and K-means (from `seed` and the step).

Composition: ASE sets only the steering vector (`Interventions.steer`) and the rows'
routes, so it composes with EAD (the per-token temperature multiplies; TIS then corrects
both) and with EDEN (its appended slot is steered like any position of a steered row; the
config's TIS applies to EDEN's noisy rows too, which EDEN's paper does not do). Two
methods that both steer are a config error.

    python -m explore_rl.main --config configs/ase.py:demo --workdir runs/ase
"""

from __future__ import annotations

import dataclasses
import functools
import time
import warnings

import jax
import jax.numpy as jnp
import numpy as np
from scipy.optimize import linear_sum_assignment
from sklearn.cluster import KMeans
from sklearn.decomposition import PCA

from explore_rl.exploration.base import Explorer, Shaped, StepContext, register
from explore_rl.models.transformer import Interventions
from explore_rl.rl.plan import RolloutPlan
from explore_rl.rl.scoring import readout
from explore_rl.spec import RunSpec

DIRECTIONS = ("contrast", "random", "shuffled", "reversed")
ROUTINGS = ("bank", "unstructured")
POSITIONS = ("fraction", "mean")


@register("ase")
class ASE(Explorer):
    intervenes = ("steer",)

    @dataclasses.dataclass(frozen=True)
    class Spec:
        k: int = 3  # K steering routes (+ the clean route); ASE paper: K = 3
        alpha: float = 0.5  # steering strength on unit vectors; ASE paper, Table 12: 0.5
        layer: int = 0  # block whose output is steered and read; ASE paper: block 0
        position: str = "fraction"  # readout: fraction (token floor(f x length)) | mean
        f: float = 0.25  # readout position as a fraction of the response; ASE paper: 0.25
        beta: float = 0.5  # EMA of the bank; ASE paper: 0.5 (0 = no EMA)
        d_pca: int = 64  # PCA dimensions for clustering; ASE paper: 64
        min_pairs: int = 64  # B_min: pairs in the buffer before an update (ours)
        interval: int = 5  # Delta: steps between bank updates, at least (ours)
        capacity: int = 1024  # pairs the buffer holds; the oldest leave first (ours)
        kmeans_init: int = 16  # K-means restarts (the paper's analysis sweep used 512)
        seed: int = 0  # pairing, PCA, K-means and the ablations' draws, with the step
        directions: str = "contrast"  # contrast | random | shuffled | reversed (ablations)
        routing: str = "bank"  # bank | unstructured (a fresh random vector per rollout)
        match: bool = True  # Hungarian matching to the previous bank (False: an ablation)
        at_eval: bool = False  # steer at evaluation too (inference-time steering)

    @staticmethod
    def check(e: Spec, spec: RunSpec) -> None:
        _require(e.k >= 1, f"k={e.k}: need at least 1 route")
        _require(e.alpha >= 0, f"alpha={e.alpha}: must be >= 0")
        _require(e.layer >= 0, f"layer={e.layer}: must be >= 0")
        _require(e.position in POSITIONS, f"position={e.position!r}: allowed {POSITIONS}")
        _require(0 <= e.f < 1, f"f={e.f}: must be in [0, 1)")
        _require(0 <= e.beta < 1, f"beta={e.beta}: must be in [0, 1)")
        _require(e.d_pca >= 1, f"d_pca={e.d_pca}: must be >= 1")
        _require(e.min_pairs >= e.k, f"min_pairs={e.min_pairs}: K-means needs >= k={e.k}")
        _require(e.interval >= 1, f"interval={e.interval}: must be >= 1")
        _require(
            e.capacity >= e.min_pairs,
            f"capacity={e.capacity} < min_pairs={e.min_pairs}",
        )
        _require(e.kmeans_init >= 1, f"kmeans_init={e.kmeans_init}: must be >= 1")
        _require(
            e.directions in DIRECTIONS,
            f"directions={e.directions!r}: allowed {DIRECTIONS}",
        )
        _require(e.routing in ROUTINGS, f"routing={e.routing!r}: allowed {ROUTINGS}")
        if not spec.loss.tis_cap:
            warnings.warn("ASE without TIS (rl.tis_cap=0): the paper uses c_IS = 2", stacklevel=2)

    # ------------------------------------------------------------------ state

    def init(self, ctx: StepContext):
        return self.template(ctx)  # an empty bank and buffer

    def template(self, ctx: StepContext):
        e, d = self.settings, ctx.cfg.d_model
        _require(
            e.layer < ctx.cfg.n_layers,
            f"layer={e.layer}: the model has blocks 0..{ctx.cfg.n_layers - 1}",
        )
        return {
            "u": jnp.zeros((e.k, d), jnp.float32),  # the smoothed, unnormalised bank
            "updates": jnp.zeros((), jnp.int32),  # 0: no bank yet, every row clean
            "last_update": jnp.zeros((), jnp.int32),  # the step of the newest update
            "pos": jnp.zeros((e.capacity, d), jnp.float32),  # buffer: h+ of each pair
            "neg": jnp.zeros((e.capacity, d), jnp.float32),  # h- of each pair
            "count": jnp.zeros((), jnp.int32),  # pairs in the buffer
        }

    # ------------------------------------------------------------------ plan

    def plan(self, state, plan: RolloutPlan, ctx: StepContext, rng) -> RolloutPlan:
        return self._route(state, plan, rng)

    def step_sizes(self, sizes):
        """Each (problem, route) is prefilled once: up to min(K + 1, G) prompt rows a
        problem (G when every row has its own vector)."""
        g = self.spec.rollout.group_size
        per = g if self.settings.routing == "unstructured" else len(set(routes(g, self.settings.k)))
        return dataclasses.replace(sizes, prompts=sizes.prompts * per)

    def eval_plan(self, state, plan: RolloutPlan, ctx: StepContext) -> RolloutPlan:
        if not self.settings.at_eval:
            return plan
        return self._route(state, plan, jax.random.key(self.settings.seed))

    def _route(self, state, plan: RolloutPlan, rng) -> RolloutPlan:
        e = self.settings
        b, d = plan.temperature.shape[0], state["u"].shape[1]
        g = b // len(plan.problems)
        if e.routing == "unstructured":
            route = np.tile(np.arange(g), b // g)  # every row its own vector and prefill
            v = jax.random.normal(rng, (b, d), jnp.float32)
            steer = e.alpha * v / jnp.linalg.norm(v, axis=-1, keepdims=True)
        elif int(state["updates"]) == 0:
            info = {**plan.info, self.name: {"route": np.zeros(b, np.int32)}}
            return plan.replace(info=info)
        else:
            route = np.tile(routes(g, e.k), b // g)
            vectors = jnp.concatenate([jnp.zeros((1, d)), unit(state["u"])])
            steer = e.alpha * vectors[route]
        iv = Interventions(steer=steer, steer_layer=e.layer)
        if plan.interventions is not None:
            iv = plan.interventions.replace(steer=iv.steer, steer_layer=iv.steer_layer)
        info = {**plan.info, self.name: {"route": route.astype(np.int32)}}
        return plan.replace(interventions=iv, route=jnp.asarray(route, jnp.int32), info=info)

    # ------------------------------------------------------------------ shape

    def shape_advantages(self, state, rollouts, advantages, weights, ctx: StepContext) -> Shaped:
        e = self.settings
        if e.routing == "unstructured":  # every row its own vector: no routes to compare
            return Shaped(advantages, weights, state, {})
        metrics = route_metrics(rollouts, np.asarray(rollouts.plan.info[self.name]["route"]))
        rng = np.random.default_rng([e.seed, ctx.step])
        pairs = pair_rollouts(np.asarray(rollouts.correct), rng)
        t0 = time.perf_counter()
        state = dict(state)
        if len(pairs):
            pos, neg = self.replay(ctx, rollouts, pairs)
            state.update(append(state, pos, neg))
        metrics.update(pairs=len(pairs), replay_s=time.perf_counter() - t0)
        count, updates = int(state["count"]), int(state["updates"])
        due = updates == 0 or ctx.step - int(state["last_update"]) >= e.interval
        if count >= e.min_pairs and due:
            t0 = time.perf_counter()
            state, bank_metrics = self.update_bank(state, ctx.step, rng)
            metrics.update(bank_metrics, bank_update_s=time.perf_counter() - t0)
        metrics.update(buffer=int(state["count"]), updates=int(state["updates"]))
        return Shaped(advantages, weights, state, metrics)

    def replay(self, ctx: StepContext, rollouts, pairs: np.ndarray):
        """(h+, h-) [M, D] of the M pairs: block `layer`'s output in the unsteered policy.
        Padded to the most pairs a batch can hold, so one compile serves every step."""
        e = self.settings
        q, g = rollouts.rewards.shape
        most = q * (g // 2)
        padded = np.concatenate([pairs, np.repeat(pairs[:1], most - len(pairs), axis=0)])
        rows = padded.reshape(-1)  # (correct, incorrect) of pair j: rows 2j, 2j + 1
        h = _replay(
            ctx.params,
            ctx.cfg,
            jnp.asarray(rollouts.prompts[padded[:, 0] // g]),
            jnp.asarray(rollouts.prompt_mask[padded[:, 0] // g]),
            jnp.asarray(rollouts.out.tokens)[rows],
            jnp.asarray(rollouts.out.mask)[rows],
            e.f,
            layer=e.layer,
            mean=e.position == "mean",
        )
        h = np.asarray(h, np.float32)[: 2 * len(pairs)]
        return h[0::2], h[1::2]

    def update_bank(self, state, step: int, rng: np.random.Generator):
        """The new bank from the buffer (cleared), and the update's metrics."""
        e = self.settings
        n = int(state["count"])
        pos, neg = np.asarray(state["pos"])[:n], np.asarray(state["neg"])[:n]
        candidates, labels = estimate(pos, neg, e, rng)
        first = int(state["updates"]) == 0
        u, slot_of = smooth(np.asarray(state["u"]), candidates, e.beta, first, e.match)
        metrics = {f"share_{k}": float(np.mean(labels == slot_of[k])) for k in range(e.k)}
        v = unit(u)
        metrics["inter_cosine"] = (
            float(np.mean((v @ v.T)[np.triu_indices(e.k, 1)])) if e.k > 1 else 1.0
        )
        if not first:  # temporal alignment: each old direction vs the candidate matched to it
            old, new = unit(np.asarray(state["u"])), unit(candidates[slot_of])
            metrics["alignment"] = float(np.mean(np.sum(old * new, axis=-1)))
        state = {
            **state,
            "u": jnp.asarray(u, jnp.float32),
            "updates": jnp.asarray(int(state["updates"]) + 1, jnp.int32),
            "last_update": jnp.asarray(step, jnp.int32),
            "count": jnp.zeros((), jnp.int32),
        }
        return state, metrics


# ----------------------------------------------------------------------------- pieces


def routes(g: int, k: int) -> np.ndarray:
    """Route of each of a group's g rows: K + 1 routes (0 = clean) in contiguous blocks
    as even as possible (g = 8, k = 3: 0 0 1 1 2 2 3 3)."""
    return (np.arange(g) * (k + 1) // g).astype(np.int32)


def unit(u):
    xp = jnp if isinstance(u, jax.Array) else np
    return u / xp.maximum(xp.linalg.norm(u, axis=-1, keepdims=True), 1e-12)


def pair_rollouts(correct: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """[M, 2] row indices (correct, incorrect): in each group with both outcomes,
    min(|P|, |N|) pairs, each side drawn at random without replacement."""
    g = correct.shape[1]
    pairs = []
    for i, row in enumerate(correct):
        p, n = np.flatnonzero(row), np.flatnonzero(~row)
        m = min(len(p), len(n))
        if m:
            pairs += zip(i * g + rng.permutation(p)[:m], i * g + rng.permutation(n)[:m])
    return np.asarray(pairs, np.int64).reshape(-1, 2)


def append(state, pos: np.ndarray, neg: np.ndarray) -> dict:
    """The buffer with the new pairs after the old ones, the oldest dropped past capacity."""
    cap = state["pos"].shape[0]
    n = int(state["count"])
    both = [
        np.concatenate([np.asarray(state[k])[:n], new])[-cap:]
        for k, new in (("pos", pos), ("neg", neg))
    ]
    count = both[0].shape[0]
    pad = lambda x: np.pad(x, ((0, cap - count), (0, 0)))  # noqa: E731
    return {
        "pos": jnp.asarray(pad(both[0])),
        "neg": jnp.asarray(pad(both[1])),
        "count": jnp.asarray(count, jnp.int32),
    }


def estimate(pos: np.ndarray, neg: np.ndarray, e, rng: np.random.Generator):
    """K candidate directions [K, D] from M pairs (ASE paper, Eq. 4), and each pair's
    cluster [M]."""
    if e.directions == "shuffled":  # the control: labels swapped within pairs at random
        swap = rng.random(len(pos)) < 0.5
        pos, neg = np.where(swap[:, None], neg, pos), np.where(swap[:, None], pos, neg)
    pooled = np.concatenate([pos, neg])
    seed = int(rng.integers(2**31))
    pca = PCA(n_components=min(e.d_pca, *pooled.shape), random_state=seed).fit(pooled)
    delta = pca.transform(pos) - pca.transform(neg)  # Q h+ - Q h- (the centring cancels)
    labels = KMeans(e.k, n_init=e.kmeans_init, random_state=seed).fit_predict(delta)
    diffs = pos - neg
    # K-means may leave a cluster empty (repeated points): its candidate is then the mean of
    # all differences (ours), never NaN, which the EMA would keep for good
    candidates = np.stack(
        [
            diffs[labels == k].mean(axis=0) if (labels == k).any() else diffs.mean(axis=0)
            for k in range(e.k)
        ]
    )
    if e.directions == "reversed":
        candidates = -candidates
    elif e.directions == "random":  # norm-matched random directions (ASE paper, App. D)
        noise = rng.standard_normal(candidates.shape)
        candidates = unit(noise) * np.linalg.norm(candidates, axis=-1, keepdims=True)
    return candidates.astype(np.float32), labels


def smooth(u: np.ndarray, candidates: np.ndarray, beta: float, first: bool, match: bool):
    """(the new bank u [K, D], the candidate each slot took [K]): Hungarian matching on
    cosine (Eq. 5), then the EMA u <- beta u + (1 - beta) u_hat (Eq. 6); the first update
    takes the candidates as they are."""
    k = len(candidates)
    if first:
        return candidates.copy(), np.arange(k)
    slot_of = np.arange(k)
    if match:
        _, slot_of = linear_sum_assignment(-(unit(u) @ unit(candidates).T))
    return beta * u + (1.0 - beta) * candidates[slot_of], slot_of


def route_metrics(rollouts, route: np.ndarray) -> dict:
    rewards, correct = rollouts.rewards.reshape(-1), rollouts.correct.reshape(-1)
    out = {}
    for r in np.unique(route):
        rows = route == r
        out[f"route{r}/reward"] = float(rewards[rows].mean())
        out[f"route{r}/accuracy"] = float(correct[rows].mean())
    return out


@functools.partial(jax.jit, static_argnames=("cfg", "layer", "mean"))
def _replay(params, cfg, prompts, prompt_mask, tokens, mask, f, layer: int, mean: bool):
    """Rows (2j, 2j + 1) continue prompt j: block `layer`'s output [2P, D] at response
    token floor(f x length), or its mean over the response."""
    h = readout(params, cfg, prompts, prompt_mask, tokens, mask, layer).astype(jnp.float32)
    n = jnp.sum(mask, axis=1)
    if mean:
        return jnp.sum(jnp.where(mask[..., None], h, 0.0), axis=1) / jnp.maximum(n, 1)[:, None]
    at = jnp.clip(jnp.floor(f * n).astype(jnp.int32), 0, jnp.maximum(n - 1, 0))
    return h[jnp.arange(h.shape[0]), at]


def _require(ok: bool, message: str):
    if not ok:
        raise ValueError(f"config: exploration.ase.{message}")
