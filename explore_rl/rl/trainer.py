"""The GRPO loop: rollout -> rewards -> advantages -> pi_old -> update -> log / checkpoint.

    python -m explore_rl.main --config configs/grpo.py:demo --workdir runs/demo

Everything random derives from (seed, step), and the data position is checkpointed with
the train state, so rerunning the same command resumes from the newest checkpoint and
continues exactly as if never stopped.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct
from jax.sharding import Mesh
from ml_collections import ConfigDict
from tqdm import tqdm

from explore_rl import checkpoint as checkpoint_lib
from explore_rl import config as config_lib
from explore_rl import memory, parallel
from explore_rl.checkpoint import Checkpointer
from explore_rl.data import sharded, tasks
from explore_rl.evaluation import metrics as metrics_lib
from explore_rl.evaluation.evaluate import evaluate
from explore_rl.exploration import base as exploration
from explore_rl.hoststate import HostState
from explore_rl.logs import RunLogger, flatten
from explore_rl.rewards.math import Verifier, extract_answer
from explore_rl.rl import advantages as advantages_lib
from explore_rl.rl import footprint, sizing
from explore_rl.rl import rollout as rollout_lib
from explore_rl.rl.plan import RolloutPlan, base_plan
from explore_rl.rl.train_step import (
    Batch,
    OptimConfig,
    group_slice,
    init_state,
    make_optimizer,
    plan_micro_batches,
    score_batch,
    train_step,
)
from explore_rl.sampling import engine as engine_lib


@struct.dataclass
class Progress:
    """Everything a resume needs besides the config."""

    state: object  # TrainState
    data_position: jax.Array  # next index into the training stream
    explorers: dict = dataclasses.field(default_factory=dict)  # {name: explorer state}


@dataclasses.dataclass
class Run:
    """What stays fixed over a run's steps."""

    config: ConfigDict
    cfg: object  # ModelConfig
    tok: object  # Tokenizer
    train_set: Sequence  # sharded.Problems: the file's rows, each process holding its shard
    test_sets: dict  # {benchmark: problems}
    optimizer: object
    verifier: Verifier
    key: jax.Array  # step s samples with fold_in(key, s)
    eval_key: jax.Array  # evaluation after step s: fold_in(eval_key, s)
    settings: rollout_lib.RolloutSettings  # how training rollouts are drawn and rewarded
    explorers: list = dataclasses.field(default_factory=list)
    ref_params: dict | None = None  # frozen reference policy, when rl.kl_coef > 0
    workdir: str | None = None
    mesh: Mesh | None = None  # where the update's batch rows are sharded
    longest_prompt: int = 0  # tokens of the longest training prompt
    memory_estimate: footprint.Footprint | None = None  # per device, made at start

    @classmethod
    def create(cls, c, cfg, tok, verifier, workdir=None, ref_params=None, mesh=None) -> Run:
        """The run of config `c`: its problems (each process reads its shard of the
        training file), optimizer, keys and explorers."""
        settings = config_lib.rollout_settings(c, tok)
        fit = functools.partial(  # over-long prompts found now, not at the step drawing one
            rollout_lib.fit_prompts, tok, fmt=settings.prompt, max_len=settings.max_prompt_len,
            policy=c.task.long_prompts,
        )  # fmt: skip
        shard = tasks.Shard(jax.process_index(), jax.process_count())
        local, test_sets, longest, error = [], {}, 0, None
        try:
            local, test_sets = config_lib.load_problems(c, shard)
            name = "train" if shard.count == 1 else f"train (process {shard.index}'s shard)"
            local, longest = fit(local, name=name, whole=shard.count == 1)
            test_sets = {n: fit(problems, name=n)[0] for n, problems in test_sets.items()}
        except Exception as e:  # noqa: BLE001 - said by every process, none left waiting
            if shard.count == 1:
                raise
            error = str(e) if isinstance(e, ValueError) else f"{type(e).__name__}: {e}"
        joined = sharded.Problems.join(local, shard, parallel.allgather_bytes, longest, error)
        key, eval_key = jax.random.split(jax.random.key(c.seed))
        return cls(
            config=c,
            cfg=cfg,
            tok=tok,
            train_set=joined.problems,
            test_sets=test_sets,
            optimizer=make_optimizer(config_lib.optim_config(c)),
            verifier=verifier,
            key=key,
            eval_key=eval_key,
            explorers=exploration.build(c),
            ref_params=ref_params,
            workdir=workdir,
            mesh=mesh,
            settings=settings,
            longest_prompt=joined.longest,
        )

    def context(self, params, step: int) -> exploration.StepContext:
        return exploration.StepContext(
            params,
            self.cfg,
            self.tok,
            self.config,
            step,
            self.train_set,
            self.verifier,
            self.workdir,
            self.settings,
        )


def stream(problems, seed: int, position: int, n: int) -> list:
    """n problems from `position` of an endless stream: one seeded shuffle per epoch."""
    orders, indices = {}, []
    for i in range(position, position + n):
        epoch, j = divmod(i, len(problems))
        if epoch not in orders:  # one shuffle a call, not one per problem drawn
            orders[epoch] = np.random.default_rng([seed, epoch]).permutation(len(problems))
        indices.append(orders[epoch][j])
    return sharded.take(problems, indices)


def collect(run: Run, progress: Progress, step: int):
    """The step's Q groups (DAPO: informative ones, refilled); new data position."""
    c, params = run.config, progress.state.params
    r, q, g = c.rollout, c.rollout.prompts, c.rollout.group_size
    ctx, step_key = run.context(params, step), jax.random.fold_in(run.key, step)
    position = int(progress.data_position)
    kept, spare, batches, timeouts, errors, calls = [], [], 0, 0, 0, []
    while len(kept) < q and batches < (r.max_generation_batches if r.dynamic_sampling else 1):
        plan_key, sample_key = jax.random.split(jax.random.fold_in(step_key, batches))
        plan = base_plan(
            q * g, r.max_new_tokens, r.temperature, stream(run.train_set, c.seed, position, q)
        )
        plan = exploration.plan(run.explorers, progress.explorers, plan, ctx, plan_key)
        position += q
        ro = rollout_lib.generate(
            params,
            run.cfg,
            run.tok,
            plan,
            sample_key,
            run.verifier,
            run.settings,
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
    ent = np.asarray(out.entropy)
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
        "rollout/temperature": np.asarray(ro.plan.temperature)[mask].mean(),
        "rollout/response_len": lengths.mean(),
        "rollout/truncated_frac": 1.0 - np.asarray(out.finished).mean(),
        "rollout/verifier_timeouts": ro.timeouts,
        "rollout/reward_errors": ro.reward_errors,
        **engine_lib.merge_metrics(ro.engine),
    }


def behaviour_is_pi_old(c, plan: RolloutPlan) -> bool:
    """Whether the sampler's mu already is pi_old, so its forward pass can be skipped:
    every row drawn from the plain policy (no interventions) at the score temperature, no
    truncation. pi_old is the policy that sampled the batch, fixed over all mini-batches
    and epochs of the update, so their number does not matter. Equal up to float rounding
    of two computation orders (~1e-6 in log-prob)."""
    return (
        c.rl.pi_old == "auto"
        and not config_lib.sampling_config(c, stop_ids=()).truncates
        and plan.is_drawn_at(config_lib.score_temperature(c))
    )


def make_batch(run: Run, progress: Progress, ro, step: int):
    """The update's batch (every row scored under its clean prompt) and the explorers'
    new states and metrics."""
    c, params = run.config, progress.state.params
    q, g = ro.rewards.shape
    ctx = run.context(params, step)
    rewards = exploration.rewards(run.explorers, progress.explorers, ro, ro.rewards, ctx)
    adv = advantages_lib.ADVANTAGES[c.rl.advantage](jnp.asarray(rewards)).reshape(q * g)
    adv, weights, states, metrics = exploration.shape(
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
    if not behaviour_is_pi_old(c, ro.plan):
        batch = batch.replace(old_logp=score_rollouts(run, params, batch, ro))
    if run.ref_params is not None:
        batch = batch.replace(ref_logp=score_rollouts(run, run.ref_params, batch, ro))
    if run.mesh is not None:  # rows over ('data', 'fsdp'): each device updates its share
        batch = parallel.shard_batch(batch, run.mesh)
    return batch, states, metrics


def score_rollouts(run: Run, params, batch: Batch, ro) -> jax.Array:
    """log pi(token) [B, T] of every rollout under the clean prompt at the score
    temperature (pi_old, or the reference policy's), a micro-batch of the update at a
    time: scoring takes no more memory than the update does."""
    c = run.config
    plan = plan_micro_batches(
        response_lengths(ro), scoring_optim(c), batch.prompts.shape[1], batch.tokens.shape[1],
        parallel.batch_shards(run.mesh),
    )  # fmt: skip
    return score_batch(params, run.cfg, batch, plan, config_lib.score_temperature(c))


def response_lengths(ro) -> np.ndarray:
    """Each row's response tokens, [Q, G] (host-side: every process has the whole mask)."""
    return np.asarray(ro.out.mask).sum(axis=1).reshape(ro.rewards.shape)


def scoring_optim(c) -> OptimConfig:
    """The update's micro-batches over a whole rollout batch (every minibatch's): how
    pi_old and the reference policy are scored."""
    oc = config_lib.optim_config(c)
    return dataclasses.replace(oc, micro_batches=oc.micro_batches * c.rl.minibatches)


def update(state, batch: Batch, cfg, c, optimizer, lengths: np.ndarray | None = None):
    """`rl.ppo_epochs` passes of `rl.minibatches` optimizer steps over the batch; `lengths`
    [Q, G]: its rows' response lengths, for a token budget (a run of several processes
    cannot read them from the batch)."""
    lc, oc = config_lib.loss_config(c), config_lib.optim_config(c)
    m, metrics = c.rl.minibatches, []
    per = batch.prompts.shape[0] // m
    for _ in range(c.rl.ppo_epochs):
        for i in range(m):
            mb = group_slice(batch, m, i)
            part = None if lengths is None else lengths[i * per : (i + 1) * per]
            state, out = train_step(state, mb, cfg, lc, oc, optimizer, part)
            metrics.append(out)
    metrics = jax.device_get(metrics)  # one transfer; float(): the loss may be bfloat16
    return state, {k: float(np.mean([float(m[k]) for m in metrics])) for k in metrics[0]}


def start(c, workdir: str, verifier: Verifier, mesh: Mesh | None = None):
    """Load everything a run needs (on `mesh`, else the config's); resume from the newest
    checkpoint if there is one."""
    config_lib.validate(c)
    checkpoint_lib.open_workdir(workdir)
    ckpt = Checkpointer(workdir, c.train.keep_checkpoints)
    step = ckpt.latest_step() or 0
    if step:  # before anything is loaded: a run of another config is refused now
        _check_same_run(c, workdir)
    memory.trim_after_compiles()
    mesh = config_lib.mesh(c) if mesh is None else mesh
    cfg, tok = config_lib.model_spec(c)
    if cfg.param_dtype == "bfloat16":  # bfloat16 keeps 8 significant bits
        logging.warning(
            "model.param_dtype=bfloat16: an optimizer step of ~optim.lr=%g is rounded away "
            "on every weight above ~%.2g; train float32 weights (model.dtype=bfloat16 keeps "
            "the matmuls in bfloat16)", c.optim.lr, 256 * c.optim.lr,
        )  # fmt: skip
    run = Run.create(c, cfg, tok, verifier, workdir, mesh=mesh)
    if not run.train_set:
        raise ValueError(
            f"task {config_lib.task_name(c)!r} has no training problems: set task.train_path "
            "(a preset whose data/ folder has no train.jsonl is a test set only), or check "
            "that some of its rows have a question and an answer and fit "
            "rollout.max_prompt_len"
        )
    sized, run.memory_estimate = sizing.size(
        c, cfg, dict(mesh.shape), run.optimizer, run.longest_prompt, run.explorers
    )
    main = parallel.is_main_process()
    if c.rollout.slots == "auto":  # the most slots that fit, up to every row at once
        slots = sized.rollout.slots
        run.settings = dataclasses.replace(
            run.settings, engine=dataclasses.replace(run.settings.engine, slots=slots)
        )
        if main:
            print(f"rollout.slots=auto: {slots or 'every row at once'}", file=sys.stderr)
    if main:
        print(run.memory_estimate.summary(), file=sys.stderr)
    if c.train.check_memory:  # before the weights are read
        sizing.check(
            sized, cfg, dict(mesh.shape), run.optimizer, run.longest_prompt, run.explorers,
            run.memory_estimate,
        )  # fmt: skip
    params = config_lib.load_params(c, cfg, parallel.placer(mesh))
    run.ref_params = jax.tree.map(jnp.copy, params) if c.rl.kl_coef else None
    ctx = run.context(params, 0)
    states = {ex.name: (ex.template if step else ex.init)(ctx) for ex in run.explorers}
    progress = Progress(
        parallel.create(init_state, mesh, params, run.optimizer), jnp.zeros((), jnp.int32), states
    )
    progress = _placed(progress, mesh)
    if step:
        progress = ckpt.restore(step, progress)
    return run, progress, ckpt


def train(c, workdir: str):
    config_lib.validate(c)  # before the work directory is made or locked
    mesh = config_lib.mesh(c)
    with (
        checkpoint_lib.only_writer(workdir, take=parallel.is_main_process()),
        config_lib.verifier(c) as verifier,
        parallel.use(mesh),
    ):
        return _train(c, workdir, verifier, mesh)


class Preempted(SystemExit):
    """The run stopped on SIGTERM / SIGINT after checkpointing; rerunning resumes it."""


class _StopSignals:
    """SIGTERM (a scheduler's preemption) or SIGINT (Ctrl-C): the first lets the current
    step finish, then the run checkpoints, flushes its logs and stops; a second exits at
    once (the newest complete checkpoint stays usable). Only in the main thread, where
    Python delivers signals; elsewhere (a notebook's worker thread) nothing changes."""

    def __init__(self):
        self.received: int | None = None
        self._previous: dict = {}

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum, frame):
        if self.received is not None:
            os._exit(128 + signum)
        self.received = signum
        name = signal.Signals(signum).name
        print(f"\n{name}: finishing this step, then checkpoint and stop ({name} again: now)",
              file=sys.stderr, flush=True)  # fmt: skip

    def __exit__(self, *exc):
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


# The settings that make a run what it is (the rest may change when it resumes).
_SAME_RUN = ("seed", "model.", "task.", "rollout.", "rl.", "optim.", "exploration.", "reward.name",
             "reward.fn", "reward.extractors", "reward.format_weight")  # fmt: skip
# How rollouts and updates are scheduled, not what they are: a resume may change it (less
# memory, say; results move by float rounding at most).
_SCHEDULING = (
    "rollout.slots", "rollout.decode_chunk", "model.attention", "model.attention_block",
    "model.remat", "model.logits_chunk", "optim.micro_batches", "optim.micro_batch_tokens",
)  # fmt: skip


def _check_same_run(c, workdir: str) -> None:
    """A work directory with checkpoints resumes only the run its config.json describes:
    another model, task, rollout, update or method setting (or seed) is refused, naming the
    first difference, unless `train.allow_config_change`. Length, logging, evaluation,
    placement and rollout-scheduling settings may change on resume."""
    path = os.path.join(workdir, "config.json")
    if c.train.allow_config_change or not os.path.exists(path):
        return
    with open(path) as f:
        before = flatten(json.load(f))
    now = flatten(json.loads(config_lib.resolved(c).to_json()))
    # a key only one side has was added to the code after the run started: not a change
    changed = sorted(
        k
        for k in before.keys() & now.keys()
        if k.startswith(_SAME_RUN) and k not in _SCHEDULING and before[k] != now[k]
    )
    if changed:
        k = changed[0]
        raise ValueError(
            f"--workdir {workdir} holds a run of another config ({k}: {before.get(k)!r} -> "
            f"{now.get(k)!r}; {len(changed)} setting(s) differ): use a new --workdir, or "
            "--config.train.allow_config_change=True to resume it anyway"
        )


def _train(c, workdir: str, verifier: Verifier, mesh: Mesh):
    run, progress, ckpt = start(c, workdir, verifier, mesh)
    start_step = ckpt.latest_step() or 0
    resolved, main = config_lib.resolved(c), parallel.is_main_process()
    if main:  # one writer in a run of several processes
        with open(os.path.join(workdir, "config.json"), "w") as f:
            record = {**json.loads(resolved.to_json()), "memory": run.memory_estimate.record()}
            json.dump(record, f, indent=2)
    logger = RunLogger(workdir, start_step, config_lib.wandb_settings(c, resolved), write=main)
    bar = tqdm(
        range(start_step, c.train.steps),
        initial=start_step,
        total=c.train.steps,
        desc="train",
        dynamic_ncols=True,
        disable=not main,
    )
    updates_per_step = c.rl.minibatches * c.rl.ppo_epochs
    skipped_in_a_row, skipped = 0, int(progress.state.skipped)
    with _StopSignals() as stop:
        for step in bar:
            progress, metrics, ro = train_one_step(run, progress, step)
            if c.train.eval_every and (step + 1) % c.train.eval_every == 0:
                metrics.update(
                    run_evaluation(run, progress.state.params, progress.explorers, step + 1)
                )
            if (step + 1) % c.train.log_every == 0 or step + 1 == c.train.steps:
                logger.log(step + 1, metrics, _samples(ro, run.tok, c.train.samples_to_log))
            due = (step + 1) % c.train.checkpoint_every == 0 or step + 1 == c.train.steps
            if due or stop.received is not None:
                ckpt.save(step + 1, progress, force=not due)
            bar.set_postfix(
                reward=f"{metrics['reward/mean']:.3f}",
                zero_adv=f"{metrics['groups/zero_adv_frac']:.2f}",
                loss=f"{metrics['train/loss']:.4f}",
            )
            now = int(progress.state.skipped)
            # per step, the count of skipped updates is known, not their order: a step that
            # skipped only some counts them as the start of a new run of skips
            whole = now - skipped == updates_per_step
            skipped_in_a_row = skipped_in_a_row + now - skipped if whole else now - skipped
            skipped = now
            if skipped_in_a_row >= c.train.max_skipped_updates:
                ckpt.close()
                logger.close()
                raise RuntimeError(
                    f"{skipped_in_a_row} updates in a row skipped for a non-finite loss or "
                    f"gradient (through step {step + 1}; {updates_per_step} per step): lower "
                    "optim.lr or check the rewards (train.max_skipped_updates)"
                )
            if stop.received is not None:
                ckpt.close()
                logger.close()
                raise Preempted(
                    f"stopped by {signal.Signals(stop.received).name} after step {step + 1}, "
                    "checkpoint saved: rerun the same command to resume"
                )
    ckpt.close()
    logger.close()
    return progress


def run_evaluation(run: Run, params, states: dict, step: int, records=None) -> dict:
    """Held-out evaluation of `params` after `step` steps; explorers may act at test time
    (EAD's schedule at step `step`), reading their `states`."""
    ctx = run.context(params, step)
    return evaluate(
        params,
        run.cfg,
        run.tok,
        run.test_sets,
        run.config,
        run.verifier,
        jax.random.fold_in(run.eval_key, step),
        lambda p: exploration.eval_plan(run.explorers, states, p, ctx),
        records,
    )


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
        progress.state, batch, run.cfg, run.config, run.optimizer, response_lengths(ro)
    )
    jax.block_until_ready(state.params)
    t3 = time.perf_counter()
    tokens = int(np.asarray(ro.out.mask).sum())
    metrics = {
        **rollout_metrics(ro, run.settings.extractors),
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
        progress = _placed(progress, run.mesh)
    return progress, metrics, ro


def _placed(progress: Progress, mesh: Mesh) -> Progress:
    """The host-made leaves (the data position, the explorers' states) whole on every device:
    hosts read them back. The train state already is where the rules put it
    (`parallel.create`, the update's out shardings)."""
    return progress.replace(
        data_position=parallel.replicate(progress.data_position, mesh),
        explorers=parallel.replicate(progress.explorers, mesh),
    )


def _arrays(state):
    """An explorer state without its host data (`HostState`): what evaluation restores."""
    if isinstance(state, dict):
        return {k: _arrays(v) for k, v in state.items() if not isinstance(v, HostState)}
    return state


def _samples(ro, tok, n: int) -> list[dict]:
    """Every (B / n)-th rollout; `response` is the text the reward saw (prefix included)."""
    g, out = ro.group_size, []
    for i in range(0, len(ro.texts), max(len(ro.texts) // max(n, 1), 1))[:n]:
        p = ro.problems[i // g]
        row = {"question": p.question, "answer": p.answer, "response": ro.texts[i]}
        if p.prefix:
            row["prefix"] = tok.decode(list(p.prefix))
        out.append({**row, "reward": float(ro.rewards.reshape(-1)[i])})
    return out


def run_eval(c, workdir: str | None) -> dict:
    """--mode eval: the model, or a run's checkpoint (`eval.checkpoint`, `eval.step`), on the
    held-out benchmarks; writes eval.json and eval_responses.jsonl (every response with its
    extracted answer) to `workdir`. Only the params (and the eval config's explorers' state,
    for methods that act at test time) are restored: no optimizer state is allocated, and
    the training run's methods need not be in the eval config."""
    config_lib.validate(c)
    if workdir and parallel.is_main_process():  # now, not after the whole evaluation
        checkpoint_lib.open_workdir(workdir)
    mesh = config_lib.mesh(c)
    params, cfg, tok = config_lib.load_policy(c, parallel.placer(mesh))
    run = Run.create(c, cfg, tok, verifier=None, mesh=mesh)
    states = {ex.name: ex.template(run.context(params, 0)) for ex in run.explorers}
    step = 0
    if c.eval.checkpoint:
        folder, step = checkpoint_lib.locate(c.eval.checkpoint, c.eval.step)
        arrays = {n: _arrays(s) for n, s in states.items() if jax.tree.leaves(_arrays(s))}
        like = {"state": {"params": params}, **({"explorers": arrays} if arrays else {})}
        saved = checkpoint_lib.restore_subset(folder, step, like)
        params = saved["state"]["params"]
        for n in arrays:  # the saved arrays, beside the host data the template holds
            restored = saved["explorers"][n]
            states[n] = {**states[n], **restored} if isinstance(states[n], dict) else restored
    records = []
    with config_lib.verifier(c) as run.verifier, parallel.use(mesh):
        results = run_evaluation(run, params, states, step, records)
    if workdir and parallel.is_main_process():
        with open(os.path.join(workdir, "eval.json"), "w") as f:
            json.dump({"step": step, **results}, f, indent=2)
        with open(os.path.join(workdir, "eval_responses.jsonl"), "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in records)
    return results
