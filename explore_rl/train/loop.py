"""`--mode train`: the GRPO loop, rollout -> rewards -> advantages -> pi_old -> update ->
log / checkpoint / evaluate, one process per work directory, stopped cleanly by SIGTERM or
SIGINT.

    python -m explore_rl.main --config configs/grpo.py:demo --workdir runs/demo

Rerunning the same command resumes from the newest checkpoint and continues exactly as if
never stopped (`build.start`).
"""

from __future__ import annotations

import json
import math
import os
import signal
import sys
import threading

import jax
import jax.numpy as jnp
from jax.sharding import Mesh
from tqdm import tqdm

from explore_rl import checkpoint as checkpoint_lib
from explore_rl import parallel, stages
from explore_rl.evaluation.evaluate import Stopped
from explore_rl.exploration import base as exploration
from explore_rl.logs import RunLogger, check_wandb
from explore_rl.rewards.math import Verifier
from explore_rl.spec import RunSpec
from explore_rl.train.build import checkpointed, evaluation_time, start
from explore_rl.train.steps import run_evaluation, train_one_step


def train(spec: RunSpec, workdir: str):
    """The GRPO run of `spec` in `workdir`: its explorers built and checked before the work
    directory is made or locked."""
    return run(spec, exploration.build(spec), workdir, rl_step)


def rl_step(run_, progress, step: int):
    """One GRPO step (`steps.train_one_step`): (progress, metrics, the rollouts to log)."""
    progress, metrics, ro = train_one_step(run_, progress, step)
    return progress, metrics, _samples(ro, run_.tok, run_.spec.train.samples_to_log)


def run(spec: RunSpec, explorers: list, workdir: str, step_fn):
    """The loop of `spec` in `workdir` with `step_fn(run, progress, step) -> (progress,
    metrics, samples)` a step (GRPO's `rl_step`, supervised fine-tuning's `sft.SftStep`):
    logs, checkpoints, evaluations, resume and stop signals are the same for both."""
    mesh = spec.mesh.make()
    if parallel.is_main_process():  # the one that logs
        check_wandb(spec.wandb)
    with (
        checkpoint_lib.only_writer(workdir, take=parallel.is_main_process()),
        spec.reward.verifier() as verifier,
        parallel.use(mesh),
    ):
        return _train(spec, explorers, workdir, verifier, mesh, step_fn)


# what the progress bar shows of a step's metrics, where the step has them
PROGRESS = ("reward/mean", "groups/zero_adv_frac", "train/loss")


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


def _train(spec: RunSpec, explorers: list, workdir: str, verifier: Verifier, mesh: Mesh, step_fn):
    run, progress, ckpt = start(spec, explorers, workdir, verifier, mesh)
    t = spec.train
    start_step = ckpt.latest_step() or 0
    main = parallel.is_main_process()
    logger = _open_logs(run, workdir, start_step, main)
    bar = tqdm(
        range(start_step, t.steps),
        initial=start_step,
        total=t.steps,
        desc="train",
        dynamic_ncols=True,
        disable=not main,
    )
    updates_per_step = spec.update.minibatches * spec.update.ppo_epochs
    skipped_in_a_row, skipped = 0, int(progress.state.skipped)
    metrics = None  # the last step's, for the summary
    if t.eval_before and start_step == 0 and run.test_sets:  # logged as step 0
        logger.log(0, run_evaluation(run, progress.state.params, progress.explorers, 0))
    if main and start_step < t.steps:  # the slowest step: said, so a silent minute is not a hang
        tqdm.write(
            f"step {start_step + 1} compiles the run's programs first (kept in the compilation "
            "cache: a rerun of the same shapes starts in seconds)",
            file=sys.stderr,
        )
    with stages.training(), _StopSignals() as stop:
        for step in bar:
            progress, metrics, samples = step_fn(run, progress, step)
            # this process's first step compiles; its second times decoding (SFT: none)
            timed = "time/rollout_s" in metrics and t.eval_every and run.test_sets
            if main and step == start_step + 1 and timed:
                tqdm.write(evaluation_time(run, metrics), file=sys.stderr)
            cut = not _evaluate_if_due(run, progress, step + 1, metrics, stop)
            if (step + 1) % t.log_every == 0 or step + 1 == t.steps:
                logger.log(step + 1, metrics, samples)
            due = (step + 1) % t.checkpoint_every == 0 or step + 1 == t.steps
            best = metrics[t.best_metric] if ckpt.improves(metrics) else None
            if due or best is not None or stop.received is not None:
                _check_finite(progress, step + 1, ckpt, logger)
                ckpt.save(step + 1, checkpointed(progress), force=not due, best=best)
            else:
                ckpt.settle()
            bar.set_postfix(
                {k.split("/")[-1]: f"{metrics[k]:.3f}" for k in PROGRESS if k in metrics}
            )
            now = int(progress.state.skipped)
            # per step, the count of skipped updates is known, not their order: a step that
            # skipped only some counts them as the start of a new run of skips
            whole = now - skipped == updates_per_step
            skipped_in_a_row = skipped_in_a_row + now - skipped if whole else now - skipped
            skipped = now
            if skipped_in_a_row >= t.max_skipped_updates:
                ckpt.close()
                logger.close()
                raise stages.Stopped(
                    f"{skipped_in_a_row} updates in a row skipped for a non-finite loss or "
                    f"gradient (through step {step + 1}; {updates_per_step} per step): lower "
                    "optim.lr or check the rewards (train.max_skipped_updates)"
                )
            if stop.received is not None:
                ckpt.close()
                logger.close()
                raise Preempted(_stopped(stop.received, step + 1, cut, workdir))
    ckpt.close()
    logger.close()
    if main:
        print(_summary(workdir, start_step, t.steps, metrics), file=sys.stderr)
    return progress


def _check_finite(progress, step: int, ckpt, logger: RunLogger) -> None:
    """Weights that are not finite are never checkpointed: the run stops with one line, its
    newest checkpoint intact. Checked at each save (a reduction over the weights, which
    the save reads anyway): between saves, non-finite weights make every loss non-finite,
    and those updates are skipped and counted (`train.max_skipped_updates`)."""
    if bool(_finite(progress.state.params)):
        return
    ckpt.close()
    logger.close()
    raise stages.Stopped(
        f"the weights are not finite at step {step}: not checkpointed (the newest "
        f"checkpoint, step {ckpt.latest_step() or 'none'}, is intact); lower optim.lr or "
        "check the rewards"
    )


@jax.jit
def _finite(tree) -> jax.Array:
    """Whether every number of `tree` is finite (one reduction on the devices)."""
    return jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(tree)]))


def _open_logs(run, workdir: str, start_step: int, main: bool) -> RunLogger:
    """The run's config.json (the resolved config and its memory estimate) and its logger,
    from `start_step` on; one writer in a run of several processes."""
    if main:
        with open(os.path.join(workdir, "config.json"), "w") as f:
            json.dump({**run.spec.record, "memory": run.memory_estimate.record()}, f, indent=2)
    return RunLogger(workdir, start_step, run.spec.wandb, write=main)


def _stopped(signum: int, step: int, cut: bool, workdir: str) -> str:
    """What a run stopped by a signal after `step` says (`cut`: during its evaluation)."""
    unlogged = (
        f" (its evaluation cut short, not logged: --mode eval "
        f"--config.eval.checkpoint={workdir} --config.eval.step={step} runs it)"
        if cut else ""
    )  # fmt: skip
    return (
        f"stopped by {signal.Signals(signum).name} after step {step}{unlogged}, checkpoint "
        "saved: rerun the same command to resume"
    )


def _summary(workdir: str, start_step: int, steps: int, metrics: dict | None) -> str:
    """The run's last line: its last step's reward (or loss) and held-out results, or that
    a rerun of a finished run had nothing to train."""
    if metrics is None:
        return (
            f"{workdir}: finished at step {start_step} (train.steps={steps}): nothing to "
            "train (raise --config.train.steps to continue it)"
        )
    ks = sorted(int(k.rsplit("@", 1)[1]) for k in metrics if k.startswith("eval/average/pass@"))
    pass_at = [f"eval/average/pass@{k}" for k in ks[:1] + ks[-1:]]  # Pass@1 and Pass@n
    held_out = {k: metrics[k] for k in pass_at}
    headline = next(k for k in ("reward/mean", "train/loss") if k in metrics)
    said = ", ".join(f"{k} {v:.3f}" for k, v in {headline: metrics[headline], **held_out}.items())
    return f"done: {steps} steps in {workdir}; step {steps}: {said}"


def _evaluate_if_due(run, progress, step: int, metrics: dict, stop: _StopSignals) -> bool:
    """The held-out evaluation after `step` when `train.eval_every` asks for it, and after
    the last step whenever it is set (what a run ends with is always measured), into
    `metrics`; False if a stop signal cut it short (no partial result is logged)."""
    every, last = run.spec.train.eval_every, run.spec.train.steps
    if not every or (step % every and step != last):
        return True
    try:
        metrics.update(
            run_evaluation(
                run, progress.state.params, progress.explorers, step,
                stop=lambda: stop.received is not None,
            )
        )  # fmt: skip
    except Stopped:
        return False
    return True


def _samples(ro, tok, n: int) -> list[dict]:
    """Every (B / n)-th rollout; `response` is the text the reward saw (prefix included)."""
    g, out = ro.group_size, []
    for i in range(0, len(ro.texts), max(len(ro.texts) // max(n, 1), 1))[:n]:
        p = ro.problems[i // g]
        row = {"question": p.question, "answer": p.answer, "response": ro.texts[i]}
        if p.prefix:
            row["prefix"] = tok.decode(list(p.prefix))
        row["reward"] = float(ro.rewards.reshape(-1)[i])
        own = {k: float(x.reshape(-1)[i]) for k, x in ro.by_function.items()}
        # each function's own, unweighted (None: TRL's None, or a NaN)
        row["rewards"] = {k: None if math.isnan(x) else x for k, x in own.items()}
        out.append(row)
    return out
