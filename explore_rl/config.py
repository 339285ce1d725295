"""The entry point's half of the config: a ConfigDict (a config file's `get_config`, with
the command line's overrides) to the run's typed spec (`spec`, `spec.RunSpec`), with the
checks that catch bad values. This is the only module that reads a ConfigDict's fields;
the modes get the RunSpec.

ml_collections already rejects unknown keys and wrong types (the config is locked);
`validate` rejects values and combinations no run can use, each with a one-line message.
"""

from __future__ import annotations

import copy
import dataclasses
import importlib.util
import json
import math
import os
import warnings

from ml_collections import ConfigDict

import configs
from explore_rl import caching
from explore_rl.answers import EXTRACTORS
from explore_rl.checkpoint import best_alias, run_of
from explore_rl.data import jsonl, tasks
from explore_rl.exploration import base as exploration
from explore_rl.logs import flatten
from explore_rl.models import lora, weights
from explore_rl.models.lora import LoraConfig
from explore_rl.models.tokenizer import PromptFormat
from explore_rl.rewards import registry as rewards
from explore_rl.rl import advantages, losses
from explore_rl.rl.train_step import OptimConfig
from explore_rl.sampling.engine import EngineConfig
from explore_rl.sampling.sampler import SamplingConfig
from explore_rl.spec import (
    DOMAINS,
    EvalSpec,
    ExportSpec,
    MeshSpec,
    ModelSpec,
    RewardSpec,
    RolloutSpec,
    RunSpec,
    SampleSpec,
    SftSpec,
    SweepTemperature,
    TaskSpec,
    TrainSpec,
    UpdateSpec,
    replace,
)


def config_file(path: str) -> str:
    """A config file: the path as given, or else the project's own `configs/<name>` (so
    `configs/grpo.py` names the same file from any directory)."""
    if os.path.exists(path):
        return path
    packaged = os.path.join(os.path.dirname(configs.__file__), os.path.basename(path))
    if os.path.basename(os.path.dirname(path)) in ("configs", "") and os.path.exists(packaged):
        return packaged
    raise ValueError(f"{path}: no such config file")


def config_argv(argv: list[str]) -> list[str]:
    """A command line with `--config configs/x.py:arg` naming the project's config from
    any directory (the CLIs' flags parse files by path)."""

    def find(value: str) -> str:
        path, sep, arg = value.partition(":")
        try:
            return config_file(path) + sep + arg
        except ValueError:  # config_flags names the missing file itself
            return value

    out = list(argv)
    for i, a in enumerate(out):
        if a.startswith("--config="):
            out[i] = "--config=" + find(a[len("--config=") :])
        elif a == "--config" and i + 1 < len(out):
            out[i + 1] = find(out[i + 1])
    return out


def load_module(path: str):
    """The config file's module (its `get_config`, and `get_sweep` where it has one)."""
    path = config_file(path)
    module_spec = importlib.util.spec_from_file_location(f"_config_{hash(path)}", path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module


def load(spec: str) -> ConfigDict:
    """The config of `file.py[:arg]`, as `--config file.py[:arg]` gives it."""
    path, _, arg = spec.partition(":")
    module = load_module(path)
    return module.get_config(arg) if arg else module.get_config()


def resolved(c: ConfigDict) -> ConfigDict:
    """A copy of `c` with every exploration method's section complete (its defaults
    included) and the task that reads the problems (`task_name`: 'jsonl' for named files):
    what `config.json` records."""
    out = ConfigDict(c.to_dict())
    out.task.name = task_name(c)
    for name in c.exploration.methods:
        out.exploration[exploration.get(name).name] = method_section(c, name)
    return out


def method_section(c: ConfigDict, name: str) -> ConfigDict:
    """Method `name`'s config: its defaults, updated with what the run config sets under
    its registered name (`exploration.<name>`), or for a method composed onto another
    method's config (no section of its own there), with its own config's section at the
    config's scale (`composed_config`)."""
    cls = exploration.get(name)
    out = cls.defaults()
    if cls.name in c.exploration:
        out.update(c.exploration[cls.name])
    elif (own := composed_config(c, name)) is not None:
        out.update(own[0].exploration[cls.name])
    return out


def composed_config(c: ConfigDict, name: str) -> tuple[ConfigDict, tuple[str, ...]] | None:
    """The config that method `name` has at `c`'s scale (`configs/<name>.py:<scale>`) and
    the settings outside its section that go with it (the file's `RUN_SETTINGS`), where
    `c` composes it without a section of its own (`exploration.methods` overridden on
    another method's config) and the project has a config file for it; else None (its
    module's defaults are then its settings, as for a config of no scale)."""
    cls = exploration.get(name)
    path = os.path.join(os.path.dirname(configs.__file__), f"{cls.name}.py")
    scale = c.exploration.get("scale", "")
    if cls.name in c.exploration or not scale or not os.path.isfile(path):
        return None
    module = load_module(path)
    return module.get_config(scale), tuple(getattr(module, "RUN_SETTINGS", ()))


def _check_composition(c: ConfigDict) -> None:
    """A method composed onto another method's config runs as its own config does at that
    scale: each setting outside its section that its config file names (`RUN_SETTINGS`,
    e.g. EAD's and ASE's TIS cap) must have its config's value, or the run is refused
    naming it (a composition of another experiment than the methods' is not run by
    accident)."""
    for name in c.exploration.methods:
        own, settings = composed_config(c, name) or (None, ())
        for key in settings:
            section, field = key.split(".")
            want, have = own[section][field], c[section][field]
            _check(
                want == have,
                f"exploration.methods={tuple(c.exploration.methods)}: {name} at the "
                f"{c.exploration.scale} scale (configs/{name}.py:{c.exploration.scale}) "
                f"has {key}={want!r}, this run {have!r}: set --config.{key}={want!r}",
            )


MODES = ("train", "sft", "eval", "sample", "export")  # what `main` runs a spec in


def spec(c: ConfigDict, mode: str = "train") -> RunSpec:
    """The run's settings, checked and resolved once: what the modes, the loop, the
    explorers and evaluation read, each method's settings checked. `mode` (`MODES`) is what
    runs it. "sft": as supervised fine-tuning runs it: `sft.batch_size` prompts of one
    response each, one optimizer pass a batch (the update's micro-batches checked against
    it, not against the RL batch), the loss the responses' NLL; the memory estimate and
    the update both read it. "sample" and "export" run no update, so the update's batch
    is not theirs to check (an SFT run's config exports as it is)."""
    sft = mode == "sft"
    check_domains(c)  # the values as given, before SFT's batch stands in for the rollout's
    if sft:
        c = copy.deepcopy(c)
        c.rollout.prompts, c.rl.minibatches, c.rl.ppo_epochs = c.sft.batch_size, 1, 1
    validate(c, update=mode not in ("sample", "export"))
    out = resolve(c)
    if sft:  # after `validate`: GRPO's groups need two responses, SFT's have one
        nll = losses.LossConfig(policy="nll", aggregation="token_mean", max_response_len=0)
        out = replace(out, **{"rollout.group_size": 1, "loss": nll})
    exploration.check(out)
    if out.task.name == "jsonl":  # the data read, by content: a resume of other data is refused
        train, test = jsonl.files(out.task)
        named = [p for p in (train, *test) if p and os.path.isfile(p)]  # folders: by name only
        out.record["task"]["digests"] = {p: caching.file_digest(p) for p in named}
    if out.model.origin:  # model.path alone is a cache folder's digest
        out.record["model"]["origin"] = out.model.origin
    if out.model.lora and not out.model.random_init:  # a LoRA checkpoint holds no base
        files = weights.weight_files(out.model.path)
        out.record["model"]["base_digests"] = {p: caching.file_digest(p) for p in files}
    return out


def resolve(c: ConfigDict) -> RunSpec:
    """`c` as a run spec, its files unchecked (a config sized for a machine that holds
    none of them: `bench fit`)."""
    _check_composition(c)
    rw = c.reward
    return RunSpec(
        seed=c.seed,
        model=_section(
            ModelSpec,
            c.model,
            lora=lora_config(c),
            lora_path=c.model.lora.path,
            origin=model_origin(c.model.path),
        ),
        task=_section(TaskSpec, c.task, name=task_name(c), own=task_settings(c)),
        reward=RewardSpec(
            rewards.build(rw), extractors(c), rw.format_weight, rw.workers, rw.timeout, rw.memory_mb
        ),  # fmt: skip
        prompt=prompt_format(c),
        rollout=_section(
            RolloutSpec, c.rollout, sampling=sampling_config(c, "rollout"), engine=engine_config(c)
        ),
        update=_section(UpdateSpec, c.rl),
        loss=loss_config(c),
        optim=_section(OptimConfig, c.optim),
        mesh=_section(MeshSpec, c.mesh),
        train=_section(TrainSpec, c.train),
        eval=_section(
            EvalSpec,
            c.eval,
            sampling=sampling_config(c, "eval"),
            engine=engine_config(c),
            temperatures=eval_temperatures(c),
        ),
        sample=_section(SampleSpec, c.sample, sampling=sampling_config(c, "sample")),
        export=_section(ExportSpec, c.export),
        sft=_section(SftSpec, c.sft),
        methods=tuple(
            (n, exploration.get(n).Spec(**method_section(c, n).to_dict()))
            for n in c.exploration.methods
        ),
        record=json.loads(resolved(c).to_json()),
        wandb=wandb_settings(c),
    )


def eval_temperatures(c: ConfigDict) -> tuple[SweepTemperature, ...]:
    """`eval.temperatures`: each entry a temperature in `eval.temperature`'s domain or
    "rollout" (`rollout.temperature`); an entry twice is refused (one result's keys)."""
    given, out = c.eval.temperatures, []
    for entry in (e.strip() for e in given.split(",") if e.strip()):
        value = c.rollout.temperature if entry == "rollout" else _number(entry)
        problem = DOMAINS["eval.temperature"].problem(value)
        said = f"eval.temperatures={given!r}: {entry!r}"
        _check(problem is None, f"{said} {problem or ''}; or give 'rollout'")
        label = entry if entry == "rollout" else f"{value:g}"
        _check(label not in [t.label for t in out], f"{said} is given twice")
        out.append(SweepTemperature(label, float(value)))
    return tuple(out)


def _number(text: str):
    try:
        return float(text)
    except ValueError:
        return text


def lora_config(c: ConfigDict) -> LoraConfig | None:
    """`model.lora.*` as the model's adapters (rank 0: none, every weight trains), or
    those of the PEFT adapter folder `model.lora.path` (whose settings are its own)."""
    lc = c.model.lora
    if lc.path:
        _check(lc.rank == 0, f"model.lora.rank={lc.rank}: model.lora.path sets the adapters' own")
        return lora.read_peft_config(lc.path)
    if lc.rank == 0:
        return None
    targets = tuple(t.strip() for t in lc.targets.split(",") if t.strip())
    return LoraConfig(lc.rank, float(lc.alpha), targets, lc.rslora)


def task_settings(c: ConfigDict):
    """The task's own settings (`task.<name>`, its defaults where the config has none), or
    None for a task without any."""
    name = task_name(c)
    cls = tasks.settings_of(name)
    if cls is None:
        return None
    return cls(**(c.task[name].to_dict() if name in c.task else {}))


def _section(cls, section: ConfigDict, **derived):
    """The typed `cls` of a config section: its fields by name, `derived` ones given."""
    names = [f.name for f in dataclasses.fields(cls) if f.name not in derived]
    return cls(**{n: section[n] for n in names}, **derived)


def _check(ok: bool, message: str):
    if not ok:
        raise ValueError(f"config: {message}")


def check_domains(c: ConfigDict) -> None:
    """Every numeric setting within its domain (`spec.DOMAINS`), every other number
    (a method's, a task's own) finite, `exploration.methods` a list of names: one line
    naming the first setting that is not."""
    methods = c.exploration.methods
    _check(
        isinstance(methods, (tuple, list)) and all(isinstance(m, str) for m in methods),
        f"exploration.methods={methods!r}: give a tuple of method names, e.g. ('ead',)",
    )
    values = flatten(c.to_dict())
    for key, value in values.items():
        domain = DOMAINS.get(key)
        if domain is not None:
            problem = domain.problem(value)
            _check(problem is None, f"{key}={value!r}: {problem}")
        elif isinstance(value, float):
            _check(math.isfinite(value), f"{key}={value!r}: must be a finite number")


def validate(c: ConfigDict, update: bool = True) -> None:
    """Every value and combination no run can use, one line naming it (`spec` runs it);
    the update's batch only where the mode updates (`update`); each value's own domain
    is `check_domains`'s, run before."""
    checks = [_check_task, _check_schedule, _check_eval, _check_reward, _check_export]
    for check in ([_check_batch] if update else []) + checks:
        check(c)
    _check_paths(c)
    _warn_unread_weights(c)


def _check_batch(c: ConfigDict) -> None:
    """The step's batch and how the update cuts it (each value's own domain: `DOMAINS`)."""
    r, o = c.rollout, c.optim
    _check(r.group_size >= 2, f"rollout.group_size={r.group_size}: GRPO needs >= 2 per group")
    advantages.ADVANTAGES.get(c.rl.advantage)  # a registered estimator
    _check(
        r.prompts % c.rl.minibatches == 0,
        f"rl.minibatches={c.rl.minibatches} must divide rollout.prompts={r.prompts}",
    )
    per_minibatch = r.prompts // c.rl.minibatches
    _check(
        o.micro_batch_tokens or per_minibatch % o.micro_batches == 0,
        f"optim.micro_batches={o.micro_batches} must divide the {per_minibatch} "
        "prompts of a minibatch",
    )
    _check(
        not o.micro_batch_tokens or o.micro_batches == 1,
        f"optim.micro_batches={o.micro_batches} with optim.micro_batch_tokens="
        f"{o.micro_batch_tokens}: give one (the token budget cuts the micro-batches)",
    )


def _check_task(c: ConfigDict) -> None:
    tasks.get(task_name(c))  # a registered task
    if task_name(c) == "jsonl":
        _check(
            bool(c.task.train_path or c.task.test_paths or c.task.preset),
            "task.name='jsonl' needs task.train_path, task.test_paths or task.preset",
        )
        _check(
            not c.task.preset or c.task.preset in jsonl.JSONL_PRESETS,
            f"task.preset={c.task.preset!r}: allowed {sorted(jsonl.JSONL_PRESETS)}",
        )
    _check(
        c.task.long_prompts in ("skip", "error"),
        f"task.long_prompts={c.task.long_prompts!r}: allowed ['error', 'skip']",
    )


def _check_eval(c: ConfigDict) -> None:
    e = c.eval
    _check(
        not e.diversity or e.diversity_correct <= e.samples,
        f"eval.diversity_correct={e.diversity_correct}: at most eval.samples={e.samples}",
    )


def _check_schedule(c: ConfigDict) -> None:
    """The run's length, logging, checkpoints and evaluation schedule."""
    t = c.train
    _check(
        not t.best_metric or (t.best_metric.startswith("eval/") and t.eval_every),
        f"train.best_metric={t.best_metric!r}: an evaluation's metric ('eval/<set>/"
        "<metric>', as logged) with train.eval_every > 0",
    )


def _check_reward(c: ConfigDict) -> None:
    for x in extractors(c):
        _check(x in EXTRACTORS, f"reward.extractors has {x!r}: allowed {EXTRACTORS}")


def _check_export(c: ConfigDict) -> None:
    f = c.export.format
    _check(f in ("hf", "peft"), f"export.format={f!r}: allowed 'hf', 'peft'")
    has = c.model.lora.rank or c.model.lora.path
    _check(f == "hf" or has, "export.format=peft: model.lora.rank=0 (no adapters)")


def _warn_unread_weights(c: ConfigDict) -> None:
    """A model path whose weights `model.random_init` (the smoke scale's default) leaves
    unread: said, since the run trains random weights (a folder with a tokenizer alone,
    as the lab's, has none to leave)."""
    path = c.model.path
    has_weights = os.path.isfile(path) or os.path.isfile(os.path.join(path, "config.json"))
    if c.model.random_init and path != weights.EMBEDDED and has_weights:
        warnings.warn(
            f"model.random_init={c.model.random_init!r}: random weights of that shape; of "
            f"model.path={c.model.path} only the tokenizer is read "
            "(--config.model.random_init='' trains its weights)",
            stacklevel=1,
        )


def _check_paths(c: ConfigDict) -> None:
    """Every file or folder the config names exists, each error naming its key."""
    named = [
        ("model.path", c.model.path if c.model.path != weights.EMBEDDED else ""),
        ("task.train_path", c.task.train_path if task_name(c) == "jsonl" else ""),
        *(("task.test_paths", p.strip()) for p in c.task.test_paths.split(",")),
        ("sample.prompt_file", c.sample.prompt_file),
        ("eval.checkpoint", c.eval.checkpoint),
    ]
    for key, path in named:
        _check(
            not path
            or os.path.exists(path)
            or (best_alias(path) and os.path.isdir(os.path.dirname(os.path.abspath(path)))),
            f"{key}={path}: no such file or folder",
        )
    _check(  # a run's Orbax checkpoints are not a model folder's weights
        not run_of(c.model.path),
        f"model.path={c.model.path} is a run directory, not a model folder: "
        "c = modes.export.resolve(c) first, its checkpoint as one (the command line does)",
    )
    _check(
        not c.model.base or os.path.isfile(os.path.join(c.model.path, RECIPE_FILE)),
        f"model.base={c.model.base}: not built (model.path={c.model.path} is not its folder): "
        "c = train.base_model.resolve(c) first (the command line does)",
    )


RECIPE_FILE = "recipe.json"  # a base model folder's SFT config (`train.base_model`)
ORIGIN_FILE = "origin.json"  # an exported model folder's run and step (`modes.export`)


def model_origin(path: str) -> str:
    """The run checkpoint model folder `path` was exported from (`ORIGIN_FILE`), as
    "<run directory> step <n>"; "" for any other model."""
    try:
        with open(os.path.join(path, ORIGIN_FILE)) as f:
            origin = json.load(f)
        return f"{origin['run']} step {origin['step']}"
    except (OSError, ValueError, KeyError, TypeError):  # none: a model not exported by us
        return ""


def extractors(c: ConfigDict) -> tuple[str, ...]:
    return rewards.extractors(c.reward)


def score_temperature(c: ConfigDict) -> float:
    """The temperature pi_old and pi_theta are scored at (`rl.score_temperature`)."""
    value = c.rl.score_temperature
    if value == "rollout":
        _check(
            c.rollout.temperature > 0,
            "rl.score_temperature='rollout' needs rollout.temperature > 0 (greedy rollouts "
            "have no tempered policy to train: give a number)",
        )
        return float(c.rollout.temperature)
    try:
        t = float(value)
    except ValueError:
        t = 0.0
    _check(math.isfinite(t) and t > 0, f"rl.score_temperature={value!r}: 'rollout' or a number > 0")
    return t


def loss_config(c: ConfigDict) -> losses.LossConfig:
    """The policy loss of `rl.*` (its own checks: names, gspo + aggregation, dual clip)."""
    return _section(
        losses.LossConfig, c.rl, score_temperature=score_temperature(c),
        max_response_len=c.rollout.max_new_tokens,
    )  # fmt: skip


def sampling_config(c: ConfigDict, section: str) -> SamplingConfig:
    """The static sampling settings of a config section with max_new_tokens, top_p and
    (optionally) top_k: `rollout` (training), `eval` or `sample` (--mode sample); the stop
    ids are the model's (`RunSpec.with_stop_ids`)."""
    s = c[section]
    try:
        return SamplingConfig(s.max_new_tokens, s.top_p, s.get("top_k", 0))
    except ValueError as e:  # the section's key, not the dataclass's field
        raise ValueError(f"config: {section}.{e}") from None


def prompt_format(c: ConfigDict) -> PromptFormat:
    """How the task's questions become prompts (`task.instruction`, `task.system_prompt`,
    `task.raw_prompt`, `task.template_kwargs`)."""
    t = c.task
    try:
        kwargs = json.loads(t.template_kwargs or "{}")
    except json.JSONDecodeError as e:
        raise ValueError(f"task.template_kwargs={t.template_kwargs!r}: not JSON ({e})") from None
    if not isinstance(kwargs, dict):
        raise ValueError(f"task.template_kwargs={t.template_kwargs!r}: give a JSON object")
    if t.raw_prompt and "{question}" not in t.raw_prompt:
        raise ValueError(f"task.raw_prompt={t.raw_prompt!r}: must contain {{question}}")
    return PromptFormat(t.instruction, t.system_prompt, t.raw_prompt, tuple(sorted(kwargs.items())))


def engine_config(c: ConfigDict) -> EngineConfig:
    """How every generation (training, evaluation, --mode sample) is scheduled; slots
    "auto" are sized when a run starts (`train.sizing.size`)."""
    try:
        return EngineConfig(c.rollout.slots, c.rollout.decode_chunk, c.rollout.decode_window)
    except ValueError as e:
        raise ValueError(
            f"config: rollout.slots / rollout.decode_chunk / rollout.decode_window: {e}"
        ) from None


def wandb_settings(c: ConfigDict) -> dict | None:
    """`wandb.init` arguments from `logging` (None when W&B is off); the resolved config
    is the run's config there."""
    w = c.logging
    if not w.wandb:
        return None
    tags = [t.strip() for t in w.tags.split(",") if t.strip()]
    return dict(
        project=w.project, entity=w.entity or None, name=w.name or None, tags=tags,
        config=resolved(c).to_dict(),
    )  # fmt: skip


def task_name(c: ConfigDict) -> str:
    """The task that supplies the problems. Named files (a preset, `task.train_path`,
    `task.test_paths`) make the default task, arithmetic, which reads no file, 'jsonl'
    (`--config.task.preset=math500` alone evaluates on MATH500); a task of your own that
    reads them keeps its name."""
    files = c.task.preset or c.task.train_path or c.task.test_paths
    return "jsonl" if files and c.task.name == "arithmetic" else c.task.name
