"""One training step: rollouts (DAPO-style refilled groups), the explorers' reward and
advantage hooks, pi_old / reference scoring, and `rl.ppo_epochs` x `rl.minibatches`
optimizer steps; and the held-out evaluation a run makes between steps.

    progress, metrics, rollouts = steps.train_one_step(run, progress, step)
"""

from __future__ import annotations

import dataclasses
import time

import jax
import jax.numpy as jnp
import numpy as np

from explore_rl import memory, parallel
from explore_rl.answers import extract_answer
from explore_rl.data import sharded
from explore_rl.evaluation import metrics as metrics_lib
from explore_rl.evaluation.evaluate import evaluate_policy
from explore_rl.exploration import base as exploration
from explore_rl.rl import advantages as advantages_lib
from explore_rl.rl import rollout as rollout_lib
from explore_rl.rl.plan import RolloutPlan, base_plan
from explore_rl.rl.train_step import (
    Batch,
    OptimConfig,
    group_slice,
    plan_micro_batches,
    score_batch,
    train_step,
)
from explore_rl.sampling import engine as engine_lib
from explore_rl.spec import RunSpec
from explore_rl.train.build import Progress, Run, placed


def stream(problems, seed: int, position: int, n: int, pool: int = 0) -> list:
    """n problems from `position` of an endless stream over the first `pool` of `problems`
    (0: all): one seeded shuffle per epoch."""
    size = pool or len(problems)
    orders, indices = {}, []
    for i in range(position, position + n):
        epoch, j = divmod(i, size)
        if epoch not in orders:  # one shuffle a call, not one per problem drawn
            orders[epoch] = np.random.default_rng([seed, epoch]).permutation(size)
        indices.append(orders[epoch][j])
    return sharded.take(problems, indices)


def collect(run: Run, progress: Progress, step: int):
    """The step's Q groups (DAPO: informative ones, refilled); new data position."""
    s, params = run.spec, progress.state.params
    r, q, g = s.rollout, s.rollout.prompts, s.rollout.group_size
    ctx, step_key = run.context(params, step), jax.random.fold_in(run.key, step)
    position = int(progress.data_position)
    kept, spare, batches, timeouts, errors, calls = [], [], 0, 0, 0, []
    while len(kept) < q and batches < (r.max_generation_batches if r.dynamic_sampling else 1):
        plan_key, sample_key = jax.random.split(jax.random.fold_in(step_key, batches))
        plan = base_plan(
            q * g, r.sampling.max_new_tokens, r.temperature,
            stream(run.train_set, s.seed, position, q, r.pool),
        )  # fmt: skip
        plan = exploration.plan(run.explorers, progress.explorers, plan, ctx, plan_key)
        position += q
        ro = rollout_lib.generate(
            params, run.cfg, run.tok, plan, sample_key, run.verifier, **s.generation()
        )
        batches, timeouts, errors = batches + 1, timeouts + ro.timeouts, errors + ro.reward_errors
        calls += ro.engine
        good = rollout_lib.informative(ro) if r.dynamic_sampling else np.ones(q, bool)
        kept += [(ro, i) for i in np.flatnonzero(good)]
        spare += [(ro, i) for i in np.flatnonzero(~good)]
    parts, filled = fill_groups(kept, spare, q)
    ro = dataclasses.replace(
        rollout_lib.select_groups(parts, run.tok.pad_id),
        timeouts=timeouts,
        reward_errors=errors,
        engine=calls,
    )
    return ro, position, {"rollout/generation_batches": batches, "rollout/filled_groups": filled}


def fill_groups(kept: list, spare: list, q: int) -> tuple[list, int]:
    """The first q kept groups, topped up with the latest spare ones; how many topped up."""
    filled = max(q - len(kept), 0)
    return kept[:q] + (spare[len(spare) - filled :] if filled else []), filled


def rollout_metrics(ro, extractors) -> dict:
    out, mask = ro.out, np.asarray(ro.out.mask)
    lengths = mask.sum(axis=1)
    ent, temperature = np.asarray(out.entropy), np.asarray(ro.plan.temperature)
    g = ro.group_size
    answers = [extract_answer(t, extractors) for t in ro.texts]
    return {
        "rollout/answer_disagreement": metrics_lib.answer_disagreement(
            [answers[i : i + g] for i in range(0, len(answers), g)]
        ),
        "reward/mean": ro.rewards.mean(),
        "reward/accuracy": ro.correct.mean(),
        "groups/zero_adv_frac": 1.0 - rollout_lib.informative(ro).mean(),
        "rollout/entropy": ent[mask].mean(),
        "rollout/temperature": temperature[mask].mean(),
        # the profile's ends as drawn (EAD's is a schedule over positions): each response's
        # first token and its last
        "rollout/temperature_first": temperature[:, 0].mean(),
        "rollout/temperature_last": temperature[np.arange(len(lengths)), lengths - 1].mean(),
        "rollout/response_len": lengths.mean(),
        "rollout/truncated_frac": 1.0 - np.asarray(out.finished).mean(),
        "rollout/verifier_timeouts": ro.timeouts,
        "rollout/reward_errors": ro.reward_errors,
        **{f"reward/{name}/mean": _given_mean(x) for name, x in ro.by_function.items()},
        **engine_lib.merge_metrics(ro.engine),
    }


def _given_mean(rewards: np.ndarray) -> float:
    """The mean of the rewards a function gave (a NaN row: none given), NaN without numpy's
    warning where it gave none (TRL's None for every row: another task's reward)."""
    given = rewards[~np.isnan(rewards)]
    return float(given.mean()) if given.size else float("nan")


def behaviour_is_pi_old(spec: RunSpec, plan: RolloutPlan) -> bool:
    """Whether the sampler's mu already is pi_old, so its forward pass can be skipped:
    every row drawn from the plain policy (no interventions) at the score temperature, no
    truncation. pi_old is the policy that sampled the batch, fixed over all mini-batches
    and epochs of the update, so their number does not matter. Equal up to float rounding
    of two computation orders (~1e-6 in log-prob)."""
    return (
        spec.update.pi_old == "auto"
        and not spec.rollout.sampling.truncates
        and plan.is_drawn_at(spec.loss.score_temperature)
    )


def make_batch(run: Run, progress: Progress, ro, step: int):
    """The update's batch (every row scored under its clean prompt) and the explorers'
    new states and metrics."""
    s, params = run.spec, progress.state.params
    q, g = ro.rewards.shape
    ctx = run.context(params, step)
    rewards = exploration.rewards(run.explorers, progress.explorers, ro, ro.rewards, ctx)
    adv = advantages_lib.ADVANTAGES[s.update.advantage](jnp.asarray(rewards)).reshape(q * g)
    adv, weights, states, metrics = exploration.shape_advantages(
        run.explorers, progress.explorers, ro, np.asarray(adv), np.ones(q * g, np.float32), ctx
    )
    batch = Batch(
        prompts=jnp.asarray(ro.prompts),
        prompt_mask=jnp.asarray(ro.prompt_mask),
        tokens=ro.out.tokens,
        mask=ro.out.mask,
        advantages=jnp.asarray(adv, jnp.float32),
        behaviour_logp=ro.out.logprobs,
        old_logp=ro.out.logprobs,
        weights=jnp.asarray(weights, jnp.float32),
    )
    if not behaviour_is_pi_old(s, ro.plan):
        batch = batch.replace(old_logp=score_rollouts(run, params, batch, ro))
    if (reference := run.reference(params)) is not None:
        batch = batch.replace(ref_logp=score_rollouts(run, reference, batch, ro))
    if run.mesh is not None:  # rows over ('data', 'fsdp'): each device updates its share
        batch = parallel.shard_batch(batch, run.mesh)
    return batch, states, metrics


def score_rollouts(run: Run, params, batch: Batch, ro) -> jax.Array:
    """log pi(token) [B, T] of every rollout under the clean prompt at the score
    temperature (pi_old, or the reference policy's), a micro-batch of the update at a
    time: scoring takes no more memory than the update does."""
    plan = plan_micro_batches(
        response_lengths(ro), scoring_optim(run.spec), batch.prompts.shape[1],
        batch.tokens.shape[1], parallel.batch_shards(run.mesh),
    )  # fmt: skip
    return score_batch(params, run.cfg, batch, plan, run.spec.loss.score_temperature)


def response_lengths(ro) -> np.ndarray:
    """Each row's response tokens, [Q, G] (host-side: every process has the whole mask)."""
    return np.asarray(ro.out.mask).sum(axis=1).reshape(ro.rewards.shape)


def scoring_optim(spec: RunSpec) -> OptimConfig:
    """The update's micro-batches over a whole rollout batch (every minibatch's): how
    pi_old and the reference policy are scored."""
    oc = spec.optim
    return dataclasses.replace(oc, micro_batches=oc.micro_batches * spec.update.minibatches)


def update(state, batch: Batch, cfg, spec: RunSpec, optimizer, lengths: np.ndarray | None = None):
    """`rl.ppo_epochs` passes of `rl.minibatches` optimizer steps over the batch; `lengths`
    [Q, G]: its rows' response lengths, for a token budget (a run of several processes
    cannot read them from the batch)."""
    lc, oc = spec.loss, spec.optim
    m, metrics = spec.update.minibatches, []
    per = batch.prompts.shape[0] // m
    for _ in range(spec.update.ppo_epochs):
        for i in range(m):
            mb = group_slice(batch, m, i)
            part = None if lengths is None else lengths[i * per : (i + 1) * per]
            memory.settle(state)  # the last step's freed heap, out of this step's peak
            state, out = train_step(state, mb, cfg, lc, oc, optimizer, part)
            metrics.append(out)
    metrics = jax.device_get(metrics)  # one transfer; float(): the loss may be bfloat16
    return state, {k: float(np.mean([float(m[k]) for m in metrics])) for k in metrics[0]}


def train_one_step(run: Run, progress: Progress, step: int):
    """Rollout, pi_old, update for global step `step`: (new progress, metrics, rollouts)."""
    t0 = time.perf_counter()
    ro, position, gen_metrics = collect(run, progress, step)
    memory.trim()  # the sampler's caches are free: keep them out of the update's peak
    t1 = time.perf_counter()
    batch, states, explorer_metrics = make_batch(run, progress, ro, step)
    jax.block_until_ready(batch.old_logp)  # dispatch is asynchronous: time the work
    t2 = time.perf_counter()
    state, train_metrics = update(
        progress.state, batch, run.cfg, run.spec, run.optimizer, response_lengths(ro)
    )
    jax.block_until_ready(state.params)
    t3 = time.perf_counter()
    tokens = int(np.asarray(ro.out.mask).sum())
    metrics = {
        **rollout_metrics(ro, run.spec.reward.extractors),
        **gen_metrics,
        **explorer_metrics,
        **train_metrics,
        "time/rollout_s": t1 - t0,
        "time/pi_old_s": t2 - t1,
        "time/update_s": t3 - t2,
        "perf/tokens_per_s": tokens / (t3 - t0),
    }
    progress = Progress(state, jnp.asarray(position, jnp.int32), states)
    if run.mesh is not None:  # host-made leaves onto the mesh (the checkpoint is global)
        progress = placed(progress, run.mesh)
    return progress, metrics, ro


def run_evaluation(run: Run, params, states: dict, step: int, records=None, stop=None) -> dict:
    """Held-out evaluation of `params` after `step` steps (`evaluate_policy`); `stop`: see
    `evaluate`."""
    return evaluate_policy(
        params, run.cfg, run.tok, run.spec, run.test_sets, run.verifier,
        jax.random.fold_in(run.eval_key, step), run.explorers, states, step, records, stop,
    )  # fmt: skip
