"""A training run's construction: its fixed parts (`Run`: model, data shard, optimizer,
keys, explorers), what a resume needs (`Progress`), and start-up (`start`: validation, the
work directory, the memory estimate, the weights, restoring the newest checkpoint).

    run, progress, ckpt = build.start(spec, explorers, workdir, verifier)

Everything random derives from (seed, step), and the data position is checkpointed with
the train state, so a rerun of the same command resumes exactly.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import os
import sys
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import optax
from flax import struct
from jax.experimental import multihost_utils
from jax.sharding import Mesh

from explore_rl import checkpoint as checkpoint_lib
from explore_rl import memory, parallel, stages
from explore_rl.checkpoint import Checkpointer
from explore_rl.data import sharded, tasks
from explore_rl.evaluation.evaluate import fit_held_out, run_keys
from explore_rl.exploration import base as exploration
from explore_rl.logs import flatten
from explore_rl.models import attention, family, lora
from explore_rl.models.presets import ModelConfig
from explore_rl.models.tokenizer import Tokenizer
from explore_rl.rewards.math import Verifier
from explore_rl.rl import advantages, footprint, losses
from explore_rl.rl import rollout as rollout_lib
from explore_rl.rl.train_step import TrainState, init_state, make_optimizer
from explore_rl.sampling import engine as engine_lib
from explore_rl.spec import SCHEDULING, RunSpec
from explore_rl.train import sizing


@struct.dataclass
class Progress:
    """Everything a resume needs besides the config."""

    state: TrainState
    data_position: jax.Array  # next index into the training stream
    explorers: dict = dataclasses.field(default_factory=dict)  # {name: explorer state}


@dataclasses.dataclass
class Run:
    """What stays fixed over a run's steps."""

    spec: RunSpec
    cfg: ModelConfig
    tok: Tokenizer
    train_set: Sequence  # sharded.Problems: the file's rows, each process holding its shard
    test_sets: dict  # {benchmark: problems}
    optimizer: optax.GradientTransformation
    verifier: Verifier
    key: jax.Array  # step s samples with fold_in(key, s)
    eval_key: jax.Array  # evaluation after step s: fold_in(eval_key, s)
    explorers: list = dataclasses.field(default_factory=list)
    ref_params: dict | None = None  # a full run's frozen reference policy (rl.kl_coef > 0)
    workdir: str | None = None
    mesh: Mesh | None = None  # where the update's batch rows are sharded
    longest_prompt: int = 0  # tokens of the longest training prompt
    longest_eval_prompt: int = 0  # of the longest held-out one
    memory_estimate: footprint.Footprint | None = None  # per device, made at start

    @classmethod
    def create(
        cls, spec: RunSpec, explorers: list, cfg, tok, verifier, workdir=None, mesh=None
    ) -> Run:
        """The run of `spec` with its `explorers` (`exploration.build`): its problems (each
        process reads its shard of the training file), optimizer and keys."""
        fit = functools.partial(  # over-long prompts found now, not at the step drawing one
            rollout_lib.fit_prompts, tok, fmt=spec.prompt, max_len=spec.rollout.max_prompt_len,
            policy=spec.task.long_prompts,
        )  # fmt: skip
        shard = tasks.Shard(jax.process_index(), jax.process_count())
        local, test_sets, longest, eval_longest, error = [], {}, 0, 0, None
        try:
            local, test_sets = spec.problems(shard)
            name = "train" if shard.count == 1 else f"train (process {shard.index}'s shard)"
            local, longest = fit(local, name=name, whole=shard.count == 1)
            test_sets, eval_longest = fit_held_out(spec, tok, test_sets)
        except Exception as e:  # noqa: BLE001 - said by every process, none left waiting
            if shard.count == 1:
                raise
            error = str(e) if isinstance(e, ValueError) else f"{type(e).__name__}: {e}"
        joined = sharded.Problems.join(local, shard, parallel.allgather_bytes, longest, error)
        key, eval_key = run_keys(spec.seed)
        return cls(
            spec=spec,
            cfg=cfg,
            tok=tok,
            train_set=joined.problems,
            test_sets=test_sets,
            optimizer=make_optimizer(spec.optim),
            verifier=verifier,
            key=key,
            eval_key=eval_key,
            explorers=explorers,
            workdir=workdir,
            mesh=mesh,
            longest_prompt=joined.longest,
            longest_eval_prompt=eval_longest,
        )

    def reference(self, params) -> dict | None:
        """The KL term's reference policy (None: no KL term): a LoRA run's base itself,
        its params without the adapters (no second copy), else the starting weights."""
        if not self.spec.loss.kl_coef:
            return None
        return lora.base(params) if self.cfg.lora else self.ref_params

    def context(self, params, step: int) -> exploration.StepContext:
        return exploration.StepContext(
            params,
            self.cfg,
            self.tok,
            self.spec,
            step,
            self.train_set,
            self.verifier,
            self.workdir,
        )


def start(spec: RunSpec, explorers: list, workdir: str, verifier: Verifier, mesh: Mesh):
    """Load everything a run of `spec` needs onto `mesh`; resume from the newest intact
    checkpoint if there is one. A work directory whose history a new run would replace
    (`checkpoint.History`) is refused, or with `train.restart` its files are moved aside
    and the run starts over; on any failure the checkpointer's threads end."""
    try:
        return _open(spec, explorers, workdir, verifier, mesh)
    except checkpoint_lib.History:
        if not spec.train.restart:
            raise
    if parallel.is_main_process():
        aside = checkpoint_lib.move_history(workdir)
        print(f"train.restart: the files of {workdir} moved to {aside}; a new run starts",
              file=sys.stderr)  # fmt: skip
    if jax.process_count() > 1:  # every process opens the directory after the move
        multihost_utils.sync_global_devices("train.restart")
    return _open(spec, explorers, workdir, verifier, mesh)


def _open(spec: RunSpec, explorers: list, workdir: str, verifier: Verifier, mesh: Mesh):
    checkpoint_lib.open_workdir(workdir)
    t = spec.train
    with stages.doing(f"opening the checkpoints of {workdir}"):
        checkpoint_lib.check_history(workdir)
        ckpt = Checkpointer(workdir, t.keep_checkpoints, parallel.is_main_process(), t.best_metric)
    try:
        return _start(spec, explorers, workdir, verifier, mesh, ckpt)
    except BaseException:
        ckpt.close()
        raise


def _start(spec: RunSpec, explorers: list, workdir: str, verifier: Verifier, mesh: Mesh, ckpt):
    with stages.doing(f"checking the checkpoints in {ckpt.folder}"):
        step = ckpt.newest_intact()
    if not step:
        checkpoint_lib.check_history(workdir, restorable=False)
    with stages.doing(f"reading {os.path.join(workdir, 'config.json')}"):
        check_same_run(spec, workdir, resuming=bool(step))  # before anything is loaded
    if step:
        check_kept(spec, ckpt)
    memory.trim_after_compiles()
    with stages.doing(f"reading the model of model.path={spec.model.path}"):
        cfg, tok = spec.model.config()
    if cfg.param_dtype == "bfloat16":  # bfloat16 keeps 8 significant bits
        logging.warning(
            "model.param_dtype=bfloat16: an optimizer step of ~optim.lr=%g is rounded away "
            "on every weight above ~%.2g; train float32 weights (model.dtype=bfloat16 keeps "
            "the matmuls in bfloat16)", spec.optim.lr, 256 * spec.optim.lr,
        )  # fmt: skip
    with stages.doing(f"reading the problems of task {spec.task.name!r}"):
        run = Run.create(
            spec.with_stop_ids(tok.stop_ids), explorers, cfg, tok, verifier, workdir, mesh
        )
    if not run.train_set:
        raise ValueError(
            f"task {spec.task.name!r} has no training problems: set task.train_path "
            "(a preset whose data/ folder has no train.jsonl is a test set only), or check "
            "that some of its rows have a question and an answer and fit "
            "rollout.max_prompt_len"
        )
    if spec.rollout.pool > len(run.train_set):
        raise ValueError(
            f"rollout.pool={spec.rollout.pool}: above the task's {len(run.train_set)} "
            "training problems"
        )
    if 0 < spec.rollout.pool < spec.rollout.prompts:
        raise ValueError(
            f"rollout.pool={spec.rollout.pool}: below rollout.prompts="
            f"{spec.rollout.prompts}, so a batch would hold a problem twice"
        )
    run.spec, run.memory_estimate = sizing.size(
        run.spec, cfg, dict(mesh.shape), run.optimizer, run.longest_prompt, run.explorers,
        longest_eval_prompt=run.longest_eval_prompt if run.test_sets else None,
    )  # fmt: skip
    main = parallel.is_main_process()
    if main and spec.rollout.engine.slots == engine_lib.AUTO:
        slots, evaluating = run.spec.rollout.engine.slots, run.spec.eval.engine.slots
        print(f"rollout.slots=auto: {slots or 'every row at once'} (evaluation: "
              f"{evaluating or 'every row of a batch at once'})", file=sys.stderr)  # fmt: skip
    first = run.train_set[0]  # collective where the data is sharded: every process takes it
    if main:
        print(what_runs(run, workdir, step, first), file=sys.stderr)
        print(run.memory_estimate.summary(), file=sys.stderr)
    if spec.train.check_memory:  # before the weights are read
        sizing.check(
            run.spec, cfg, dict(mesh.shape), run.optimizer, run.longest_prompt, run.explorers,
            run.memory_estimate,
        )  # fmt: skip
    with stages.doing(f"loading the weights of model.path={spec.model.path}"):
        params = spec.model.load_params(spec.seed, cfg, parallel.placer(mesh, family.axes))
    if cfg.lora:
        params = lora.attach(params, new_adapters(spec, cfg, mesh))
    elif spec.loss.kl_coef:
        run.ref_params = jax.tree.map(jnp.copy, params)
    state = parallel.create(init_state, mesh, family.axes, params, run.optimizer)
    with stages.doing(f"restoring step {step} of {ckpt.folder}"):
        return run, _resume(run, ckpt, step, state, mesh), ckpt


def new_adapters(spec: RunSpec, cfg: ModelConfig, mesh: Mesh) -> dict:
    """A LoRA run's starting adapters on `mesh` (`models/lora.py`): `model.lora.path`'s,
    or new ones drawn from the seed."""
    if spec.model.lora_path:
        return parallel.place(lora.load_peft(spec.model.lora_path, cfg), mesh, family.axes)
    key = jax.random.fold_in(jax.random.key(spec.seed), _ADAPTER_STREAM)
    return parallel.place(lora.init(cfg, key), mesh, family.axes)


_ADAPTER_STREAM = 0x10A  # the seed's stream for new adapters, apart from its other draws


def checkpointed(progress: Progress) -> Progress:
    """What a checkpoint holds of `progress`: a LoRA run's adapters and their moments, not
    its frozen base (read again from `model.path`, which config.json names with its
    files' digests, so a resume on another base is refused: `check_same_run`)."""
    trainable, _ = lora.split(progress.state.params)
    return progress.replace(state=progress.state.replace(params=trainable))


def _resume(run: Run, ckpt: Checkpointer, step: int, state, mesh: Mesh) -> Progress:
    """The progress restored from `step`, or from the newest intact step before it when
    `step` cannot be read (set aside, one line each); a fresh one when none is left."""
    ctx = run.context(state.params, 0)
    frozen = lora.split(state.params)[1]
    while step:
        states = {ex.name: ex.template(ctx) for ex in run.explorers}
        like = placed(Progress(state, jnp.zeros((), jnp.int32), states), mesh)
        try:
            saved = ckpt.restore(step, checkpointed(like))
            params = lora.join(saved.state.params, frozen)
            return saved.replace(state=saved.state.replace(params=params))
        except checkpoint_lib.Damaged as e:
            ckpt.set_aside(step, str(e))
            step = ckpt.newest_intact()
            if not step:  # every step set aside: the run's history is not replaced
                checkpoint_lib.check_history(run.workdir, restorable=False)
    states = {ex.name: ex.init(ctx) for ex in run.explorers}
    return placed(Progress(state, jnp.zeros((), jnp.int32), states), mesh)


def what_runs(run: Run, workdir: str, step: int, first: tasks.Problem) -> str:
    """What the run will use, said at start: the model (a path, a run's step exported as
    one, or a random shape), the task's data and held-out sets with their sizes, how
    prompts are written (the first, rendered), the update by its papers' names, each
    method's settings, the evaluation, the run directory."""
    s, cfg = run.spec, run.cfg
    size = f"{cfg.family}, {cfg.num_params() / 1e6:.0f}M params"
    m = s.model
    model = (
        f"random {m.random_init} weights ({size}), the tokenizer of {m.path}"
        if m.random_init
        else f"{m.origin} (exported to {m.path}; {size})"
        if m.origin
        else f"{m.path} ({size})"
    )
    source = s.task.train_path or s.task.preset or s.task.name
    source = source if source == s.task.name else f"{s.task.name}, {source}"
    cap = s.eval.num_prompts
    held_out = ", ".join(
        f"{n} ({len(p)}" + (f", the first {cap}: eval.num_prompts)" if 0 < cap < len(p) else ")")
        for n, p in run.test_sets.items()
    ) or "none"  # fmt: skip
    resume = f"resuming after step {step}" if step else "new"
    every = s.train.eval_every
    evaluation = (
        f"{evaluation_rows(run)} responses of up to {s.eval.sampling.max_new_tokens} tokens "
        f"(eval.samples={s.eval.samples} per question), every {every} steps and after the last"
        if every and run.test_sets else "off"
    )  # fmt: skip
    attend = attention.describe(cfg.attention, cfg.jnp_dtype, cfg.head_dim, cfg.attention_block)
    return "\n".join([
        f"model: {model}",
        f"attention: {attend} (model.attention={cfg.attention}, {cfg.dtype})",
        f"task: {source}: {len(run.train_set)} training problems; held out: {held_out}",
        f"prompts: {prompts_said(run, first)}",
        f"reward: {s.reward.fn.describe()}",
        f"update: {update_said(s)}",
        *methods_said(s),
        f"evaluation: {evaluation}",
        f"run: {workdir} ({resume}); tensorboard --logdir {workdir}",
    ])  # fmt: skip


def prompts_said(run: Run, first: tasks.Problem) -> str:
    """How the task's questions become prompts (`spec.prompt`), and `first`, the first
    training problem, as the model reads it."""
    f = run.spec.prompt
    if first.messages and not f.raw:
        how = "the data's chat in the model's chat template, as written"
    elif f.raw:
        how = f"task.raw_prompt={f.raw!r} with task.instruction={f.instruction!r}, no chat"
    else:  # a plain question: TRL would pass it as written; this is verl's way
        system = f", task.system_prompt={f.system!r}" if f.system else ""
        how = (
            f"the question + task.instruction={f.instruction!r}{system} in the model's chat "
            "template (as written: task.raw_prompt='{question}' task.instruction='')"
        )
    return f"{how}; the first: {f.text(run.tok, first.question, first.messages)!r}"


def update_said(s: RunSpec) -> str:
    """The update by its papers' names: the advantage estimator, the policy loss and its
    aggregation, TIS, KL and entropy terms (a half of Dr. GRPO is said to be one)."""
    a, loss = s.update.advantage, s.loss
    agg = losses.AGGREGATIONS[loss.aggregation].paper or loss.aggregation
    clip = (
        f"sequence clip [{loss.gspo_eps_low}, {loss.gspo_eps_high}]"
        if loss.policy == "gspo"
        else f"clip [1-{loss.eps_low}, 1+{loss.eps_high}]"
    )
    parts = [
        f"advantage {a} ({advantages.PAPERS.get(a, 'your own')})",
        f"loss {loss.policy} {clip}, aggregation {loss.aggregation} ({agg})",
        f"TIS cap {loss.tis_cap}" if loss.tis_cap else "no TIS",
        f"KL {loss.kl_coef} ({loss.kl_estimator})" if loss.kl_coef else "no KL",
        f"entropy bonus {loss.entropy_coef}" if loss.entropy_coef else "no entropy bonus",
        f"scored at T={loss.score_temperature:g}",
    ]
    if (a == "dr_grpo") != (loss.aggregation == "seq_mean_token_sum_norm"):
        parts.append(
            "half of Dr. GRPO, which is rl.advantage=dr_grpo with "
            "rl.aggregation=seq_mean_token_sum_norm (configs/controls.py:dr_grpo)"
        )
    return "; ".join(parts)


def methods_said(s: RunSpec) -> list[str]:
    """A line per exploration method with its settings (what config.json records)."""
    if not s.methods:
        return ["methods: none (GRPO)"]
    return [
        f"method {name}: "
        + ", ".join(f"{k}={v!r}" for k, v in dataclasses.asdict(settings).items())
        for name, settings in s.methods
    ]


def evaluation_rows(run: Run) -> int:
    """Responses one held-out evaluation draws: its questions (each benchmark's first
    `eval.num_prompts`) times `eval.samples`."""
    cap = run.spec.eval.num_prompts
    return run.spec.eval.samples * sum(min(cap or len(p), len(p)) for p in run.test_sets.values())


def evaluation_time(run: Run, metrics: dict) -> str:
    """What one evaluation will take, said once the first compiled step has run: its
    responses at full length at that step's generation rate (response slots a second of
    prefill and decode, over every generation batch; evaluation batches of another size
    generate at another rate, so it is an estimate)."""
    r = run.spec.rollout
    slots = (
        r.prompts * r.group_size * r.sampling.max_new_tokens * metrics["rollout/generation_batches"]
    )
    rate = slots / (metrics["time/prefill_s"] + metrics["time/decode_s"])
    seconds = evaluation_rows(run) * run.spec.eval.sampling.max_new_tokens / rate
    return (
        f"evaluation: about {seconds / 60:.1f} min each at this step's generation rate "
        f"({rate:.0f} response slots/s; eval.num_prompts and eval.samples size it)"
    )


def check_kept(spec: RunSpec, ckpt: Checkpointer) -> None:
    """A resume that keeps fewer checkpoints than the run has would delete more than the
    oldest one at its next save: refused unless `train.prune_checkpoints`. The run's
    known-good steps count (a newest step a kill left without its digest is the
    rotation's, not kept); all of them for a run written before digests; its best step
    (`train.best_metric`) is kept whatever `keep_checkpoints` is."""
    known = checkpoint_lib.digested(ckpt.folder) or checkpoint_lib.steps(ckpt.folder)
    keep = spec.train.keep_checkpoints
    stays = set(known[len(known) - keep + 1 :] if keep > 1 else [])  # beside the next save
    if ckpt.best is not None:
        stays.add(ckpt.best["step"])
    extra = len([s for s in known if s not in stays]) - 1  # the rotation deletes one
    if extra > 0 and not spec.train.prune_checkpoints:
        raise ValueError(
            f"train.keep_checkpoints={keep} would delete {extra} of the {len(known)} "
            f"checkpoints in {ckpt.folder} at the next save: keep {keep + extra}, or "
            "--config.train.prune_checkpoints=True"
        )


# The settings that make a run what it is (the rest may change when it resumes).
_SAME_RUN = ("seed", "model.", "task.", "rollout.", "rl.", "optim.", "exploration.",
             "reward.name", "reward.fn", "reward.weights", "reward.extractors",
             "reward.format_weight")  # fmt: skip


def check_same_run(spec: RunSpec, workdir: str, resuming: bool = True) -> None:
    """A work directory with checkpoints resumes only the run its config.json describes:
    another model, task, rollout, update or method setting (or seed) is refused, naming the
    first difference, unless `train.allow_config_change`. Length, logging, evaluation,
    placement and rollout-scheduling settings may change on resume. A directory with
    checkpoints (`resuming`) or metrics and no config.json is refused: what ran there is
    unknown. A new run's directory (no config.json, nothing logged) passes."""
    path = os.path.join(workdir, "config.json")
    if spec.train.allow_config_change:
        return
    if not os.path.exists(path):
        logged = os.path.exists(os.path.join(workdir, "metrics.jsonl"))
        if resuming or logged:
            checkpoint_lib.refuse_history(
                workdir, "its config.json is missing, so what ran there is unknown (restore "
                "it, or --config.train.allow_config_change=True resumes it as this config)"
            )  # fmt: skip
        return
    with open(path) as f:
        before = flatten(json.load(f))
    now = flatten(spec.record)
    # a key only one side has was added to the code after the run started: not a change
    changed = sorted(
        k
        for k in before.keys() & now.keys()
        if k.startswith(_SAME_RUN) and k not in SCHEDULING and before[k] != now[k]
    )
    if before.get("model.base") and before.get("model.base") == now.get("model.base"):
        # model.path is then the cache folder of model.base's recipe, named by a digest of
        # its whole config, which a setting added to the code renames; the recipe itself
        # (model.base and the task) is compared, and a resume reads its checkpoint
        changed = [k for k in changed if k != "model.path"]
    if changed:
        k = changed[0]
        raise ValueError(
            f"--workdir {workdir} holds a run of another config ({k}: {before.get(k)!r} -> "
            f"{now.get(k)!r}; {len(changed)} setting(s) differ): use a new --workdir, or "
            "--config.train.allow_config_change=True to resume it anyway"
        )


def placed(progress: Progress, mesh: Mesh) -> Progress:
    """The host-made leaves (the data position, the explorers' states) whole on every device:
    hosts read them back. The train state already is where the rules put it
    (`parallel.create`, the update's out shardings)."""
    return progress.replace(
        data_position=parallel.replicate(progress.data_position, mesh),
        explorers=parallel.replicate(progress.explorers, mesh),
    )
