"""A run's settings, resolved once from its config by the entry point (`config.spec`):
frozen, typed, and what the modes, the loop, the explorers and evaluation read. Nothing
below the entry point reads a ConfigDict, and every value has one holder here.

    spec = config.spec(get_config("demo"))         # validated; one line per bad value
    spec.rollout.group_size, spec.rollout.sampling.top_p, spec.loss.eps_high, spec.optim.lr
    params, cfg, tok = spec.model.load(spec.seed)   # what the model section names

Naming: `*Spec` for a section of run settings (here, and each method's and task's own
`Spec`), `*Config` for a library object a section holds (`SamplingConfig`, `EngineConfig`,
`LossConfig`, `OptimConfig`, `ModelConfig`). Each section's fields are those of the config
section of the same name (`configs/base.py`, every field commented there, is where the
defaults live; a test holds the two together), the library objects grouping some of them.
Two things are decided when a run starts, and the spec it keeps holds them as numbers:
the model's stop ids (`with_stop_ids`) and, for `rollout.slots = "auto"`, the decode
slots of training and of evaluation (`train.sizing.size`).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from explore_rl import parallel
from explore_rl.data import jsonl, tasks
from explore_rl.models import weights
from explore_rl.models.lora import LoraConfig
from explore_rl.models.tokenizer import PromptFormat
from explore_rl.rewards.math import Verifier
from explore_rl.rewards.registry import Reward
from explore_rl.rl.losses import LossConfig
from explore_rl.rl.train_step import OptimConfig
from explore_rl.sampling.engine import EngineConfig
from explore_rl.sampling.sampler import SamplingConfig

frozen = dataclasses.dataclass(frozen=True)

# model.* settings that say how to run the model, not what it is (ModelConfig fields)
RUN_SETTINGS = (
    "param_dtype", "dtype", "attention", "attention_block", "remat", "scan_layers", "logits_chunk",
)  # fmt: skip

# How rollouts and updates are scheduled, not what they are: a resume may change it (less
# memory, say; results move by float rounding at most): the decode slots, the update's
# micro-batches, and how the model runs but for its dtypes.
SCHEDULING = (
    "rollout.slots", "rollout.decode_chunk", "rollout.decode_window", "optim.micro_batches",
    "optim.micro_batch_tokens",
    *(f"model.{k}" for k in RUN_SETTINGS if not k.endswith("dtype")),
)  # fmt: skip


@frozen
class ModelSpec:
    """`model.*`: which weights, and how to run them."""

    path: str
    random_init: str
    base: str  # the SFT config `path` was built from (`train.base_model`), or ""
    param_dtype: str
    dtype: str
    attention: str
    attention_block: int
    remat: str
    scan_layers: bool
    logits_chunk: int
    lora: LoraConfig | None  # `model.lora.*`: adapters on a frozen base; None: full weights
    lora_path: str  # a PEFT adapter folder the adapters start from; "": new ones
    origin: str  # the run and step `path` was exported from (`config.model_origin`), or ""

    def run_settings(self) -> dict:
        """The ModelConfig fields `model.*` sets (`RUN_SETTINGS`, and the adapters)."""
        return {**{k: getattr(self, k) for k in RUN_SETTINGS}, "lora": self.lora}

    def config(self):
        """(ModelConfig, Tokenizer) of the model, no weights read."""
        return weights.model_spec(self.path, self.random_init, **self.run_settings())

    def load_params(self, seed: int, cfg, place=None) -> dict:
        """The weights for the ModelConfig `config()` gave: the checkpoint's, or a preset's
        random ones (drawn from `seed`)."""
        return weights.load_params(self.path, self.random_init, cfg, seed, place)

    def load(self, seed: int, place=None):
        """(params, ModelConfig, Tokenizer) of the model (`weights.load`)."""
        return weights.load(self.path, self.random_init, seed, place, **self.run_settings())


@frozen
class TaskSpec:
    """`task.*`, with `name` resolved (`config.task_name`): what a registered task reads."""

    name: str
    num_operands: int
    min_digits: int
    max_digits: int
    ops: str
    style: str
    train_size: int
    test_size: int
    train_path: str
    test_paths: str
    preset: str
    question_field: str
    answer_field: str
    answer_from: str
    instruction: str
    system_prompt: str
    template_kwargs: str
    raw_prompt: str
    long_prompts: str
    solution_field: str
    own: Any = None  # the task's own settings (`task.<name>`, `tasks.register`), if any

    @property
    def solutions(self):
        """The task's solution key (`tasks.SOLUTIONS`), or None; a preset's files that a
        task wrote (`JsonlSpec.task`: the lab's Countdown splits) take that task's."""
        preset = jsonl.JSONL_PRESETS.get(self.preset) if self.name == "jsonl" else None
        name = preset.task if preset else self.name
        return tasks.solutions_of(name) if name else None


@frozen
class RewardSpec:
    """`reward.*`, its functions built (registered rewards, the user's own; weighted)."""

    fn: Reward
    extractors: tuple[str, ...]
    format_weight: float
    workers: int
    timeout: float
    memory_mb: int

    def verifier(self) -> Verifier:
        """The reward workers (a context manager: `with spec.reward.verifier() as v`)."""
        return Verifier(self.workers, self.timeout, memory_mb=self.memory_mb)


@frozen
class RolloutSpec:
    """`rollout.*`: the step's batch, and how it is sampled and scheduled."""

    prompts: int
    group_size: int
    max_prompt_len: int
    temperature: float
    dynamic_sampling: bool
    max_generation_batches: int
    pool: int  # RL's problems: the first `pool` training problems; 0 = all
    sampling: SamplingConfig  # max_new_tokens, top_p, top_k; the model's stop ids
    engine: EngineConfig  # slots ("auto" until the run sizes them), decode_chunk, decode_window


@frozen
class UpdateSpec:
    """`rl.*` besides the loss: the estimator and how the batch is cut into updates."""

    advantage: str
    pi_old: str
    ppo_epochs: int
    minibatches: int


@frozen
class TrainSpec:
    """`train.*`: the run's length, logging, checkpoints and evaluation schedule."""

    steps: int
    log_every: int
    samples_to_log: int
    checkpoint_every: int
    keep_checkpoints: int
    prune_checkpoints: bool
    best_metric: str
    max_skipped_updates: int
    check_memory: bool
    allow_config_change: bool
    restart: bool
    eval_every: int
    eval_before: bool


@frozen
class SweepTemperature:
    """One entry of `eval.temperatures`: its label (the number as `:g` writes it, or
    "rollout") and the temperature it samples at."""

    label: str
    value: float


@frozen
class EvalSpec:
    """`eval.*`: the held-out evaluation."""

    checkpoint: str
    step: int
    num_prompts: int
    samples: int
    temperature: float
    batch_prompts: int
    diversity: bool
    diversity_correct: int
    temperatures: tuple[SweepTemperature, ...]  # `eval.temperatures`, "rollout" resolved
    sampling: SamplingConfig  # max_new_tokens, top_p (no top-k); the model's stop ids
    engine: EngineConfig  # the rollout's until a run sizes it for an evaluation batch


@frozen
class SampleSpec:
    """`sample.*`: `--mode sample`'s prompts and sampling (its decode slots: the rollout's)."""

    prompt_file: str
    prompt_field: str
    num_prompts: int
    samples_per_prompt: int
    temperature: float
    sampling: SamplingConfig  # max_new_tokens, top_p, top_k; the model's stop ids


@frozen
class ExportSpec:
    """`export.*`: `--mode export`'s folder (the checkpoint: `eval.checkpoint`)."""

    step: int
    dtype: str
    max_shard_gb: float
    format: str  # hf: a model folder (LoRA merged in) | peft: a LoRA run's adapter folder


@frozen
class SftSpec:
    """`sft.*`: supervised fine-tuning's examples per optimizer step (`--mode sft`), and
    the share of them that carry one neutral token after the prompt (train/sft.py)."""

    batch_size: int
    neutral_share: float
    neutral_tokens: str


@frozen
class MeshSpec:
    data: int
    fsdp: int
    tensor: int

    def make(self):
        """The run's device mesh (`mesh.data` x `mesh.fsdp` x `mesh.tensor`)."""
        return parallel.make_mesh(self.data, self.fsdp, self.tensor)


@frozen
class RunSpec:
    seed: int
    model: ModelSpec
    task: TaskSpec
    reward: RewardSpec
    prompt: PromptFormat
    rollout: RolloutSpec
    update: UpdateSpec
    loss: LossConfig
    optim: OptimConfig
    mesh: MeshSpec
    train: TrainSpec
    eval: EvalSpec
    sample: SampleSpec
    export: ExportSpec
    sft: SftSpec
    methods: tuple[tuple[str, Any], ...]  # (registered name, its Spec), in order
    record: dict = dataclasses.field(compare=False)  # the resolved config: config.json's
    wandb: dict | None = dataclasses.field(compare=False)  # wandb.init's arguments; None: off

    def problems(
        self, shard: tasks.Shard = tasks.WHOLE
    ) -> tuple[list[tasks.Problem], dict[str, list[tasks.Problem]]]:
        """The training problems of `shard` (all, by default) and the held-out benchmarks
        {name: problems} of the task."""
        return tasks.load(self.task.name, self.task, self.seed, shard)

    def generation(self, evaluation: bool = False) -> dict:
        """`rl.rollout.generate`'s settings: the training rollouts', or the held-out
        evaluation's (its own length, top-p and slots, no top-k; correctness only: the
        first reward function, no format bonus)."""
        if evaluation:
            e = self.eval
            reward, weight = Reward(self.reward.fn.functions[:1]), 0.0
            return dict(sampling=e.sampling, engine=e.engine, prompt=self.prompt,
                        max_prompt_len=self.rollout.max_prompt_len, reward=reward,
                        format_weight=weight)  # fmt: skip
        r = self.rollout
        return dict(sampling=r.sampling, engine=r.engine, prompt=self.prompt,
                    max_prompt_len=r.max_prompt_len, reward=self.reward.fn,
                    format_weight=self.reward.format_weight)  # fmt: skip

    def with_stop_ids(self, stop_ids) -> RunSpec:
        """This spec for a model whose generations end at `stop_ids` (its tokenizer's)."""
        ids = tuple(stop_ids)
        return replace(self, **{
            f"{s}.sampling.stop_ids": ids for s in ("rollout", "eval", "sample")
        })  # fmt: skip


def replace(obj, **changes):
    """`obj` with dotted fields changed (`replace(spec, **{"rollout.engine.slots": 4})`)."""
    nested: dict[str, dict] = {}
    direct = {}
    for key, value in changes.items():
        head, _, rest = key.partition(".")
        if rest:
            nested.setdefault(head, {})[rest] = value
        else:
            direct[head] = value
    for head, inner in nested.items():
        direct[head] = replace(getattr(obj, head), **inner)
    return dataclasses.replace(obj, **direct)


@frozen
class Domain:
    """The values a numeric setting may take: a finite number (an integer where `integer`)
    from `low` to `high`, either end excluded where `open_low` / `open_high`, or one of
    `special` (a sentinel such as -1 = the remaining devices or "auto")."""

    integer: bool = False
    low: float = -math.inf
    high: float = math.inf
    open_low: bool = False
    open_high: bool = False
    special: tuple = ()
    note: str = ""  # what a special value means, said with the domain

    def problem(self, value) -> str | None:
        """None if `value` is in the domain, else what it must be."""
        if value in self.special and type(value) is type(self.special[0]):
            return None
        kind = int if self.integer else (int, float)
        number = isinstance(value, kind) and not isinstance(value, bool)
        if number and math.isfinite(value) and self._inside(value):
            return None
        return f"must be {self}"

    def _inside(self, x) -> bool:
        above = x > self.low if self.open_low else x >= self.low
        below = x < self.high if self.open_high else x <= self.high
        return above and below

    def __str__(self) -> str:
        what = "an integer" if self.integer else "a finite number"
        if math.isinf(self.low) and math.isinf(self.high):
            bounds = ""
        elif math.isinf(self.high):
            bounds = f" {'>' if self.open_low else '>='} {_show(self.low)}"
        else:
            bounds = (f" in {'(' if self.open_low else '['}{_show(self.low)}, "
                      f"{_show(self.high)}{')' if self.open_high else ']'}")  # fmt: skip
        return what + bounds + (f" ({self.note})" if self.note else "")


def _show(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


COUNT = Domain(integer=True, low=1)  # how many of something, at least one
COUNT_OR_OFF = Domain(integer=True, low=0)  # 0: none, all or off (the setting's comment)
POSITIVE = Domain(low=0, open_low=True)
NON_NEGATIVE = Domain(low=0)
FINITE = Domain()
PROBABILITY_MASS = Domain(low=0, high=1, open_low=True)  # (0, 1]: top-p
DECAY = Domain(low=0, high=1, open_high=True)  # [0, 1): Adam's betas, a ratio clip below 1
INT32 = 2**31 - 1  # the sampler's token indices and counts are int32

# Every numeric setting's domain, by its config key (configs/base.py comments each; the
# fields are this module's sections' and the library objects' they hold), checked before
# any work (`config.validate`); a float setting missing here must still be finite, and a
# method's or task's own settings are checked by their `check`.
DOMAINS: dict[str, Domain] = {
    "seed": Domain(integer=True, low=0, high=2**32 - 1),
    "model.attention_block": COUNT, "model.logits_chunk": COUNT,
    "model.lora.rank": Domain(integer=True, low=0, note="0: no LoRA"),
    "model.lora.alpha": POSITIVE,
    "task.num_operands": COUNT, "task.min_digits": COUNT, "task.max_digits": COUNT,
    "task.train_size": COUNT, "task.test_size": COUNT,
    "reward.format_weight": FINITE, "reward.workers": COUNT, "reward.timeout": POSITIVE,
    "reward.memory_mb": COUNT_OR_OFF,
    "rollout.prompts": COUNT, "rollout.group_size": COUNT,
    "rollout.max_new_tokens": Domain(integer=True, low=1, high=INT32),
    "rollout.max_prompt_len": Domain(integer=True, low=1, high=INT32),
    "rollout.temperature": NON_NEGATIVE, "rollout.top_p": PROBABILITY_MASS,
    "rollout.top_k": Domain(integer=True, low=0, high=INT32, note="0: all"),
    "rollout.max_generation_batches": COUNT, "rollout.pool": COUNT_OR_OFF,
    "rollout.slots": Domain(integer=True, low=0, special=("auto",), note='or "auto"'),
    "rollout.decode_chunk": COUNT,
    "rollout.decode_window": Domain(integer=True, low=0, high=INT32, note="0: all"),
    "rl.eps_low": DECAY, "rl.eps_high": NON_NEGATIVE,
    "rl.gspo_eps_low": DECAY, "rl.gspo_eps_high": NON_NEGATIVE,
    "rl.dual_clip": NON_NEGATIVE, "rl.tis_cap": NON_NEGATIVE,
    "rl.entropy_coef": NON_NEGATIVE, "rl.kl_coef": NON_NEGATIVE,
    "rl.ppo_epochs": COUNT, "rl.minibatches": COUNT,
    "optim.lr": POSITIVE, "optim.warmup_steps": COUNT_OR_OFF, "optim.decay_steps": COUNT_OR_OFF,
    "optim.weight_decay": NON_NEGATIVE, "optim.b1": DECAY, "optim.b2": DECAY,
    "optim.eps": POSITIVE, "optim.max_grad_norm": POSITIVE,
    "optim.micro_batches": COUNT, "optim.micro_batch_tokens": COUNT_OR_OFF,
    "mesh.data": COUNT, "mesh.tensor": COUNT,
    "mesh.fsdp": Domain(integer=True, low=1, special=(-1,), note="or -1: the remaining devices"),
    "train.steps": COUNT, "train.log_every": COUNT, "train.samples_to_log": COUNT_OR_OFF,
    "train.checkpoint_every": COUNT, "train.keep_checkpoints": COUNT,
    "train.max_skipped_updates": COUNT, "train.eval_every": COUNT_OR_OFF,
    "eval.step": COUNT_OR_OFF, "eval.num_prompts": COUNT_OR_OFF, "eval.samples": COUNT,
    "eval.temperature": NON_NEGATIVE, "eval.top_p": PROBABILITY_MASS,
    "eval.max_new_tokens": Domain(integer=True, low=1, high=INT32),
    "eval.batch_prompts": COUNT, "eval.diversity_correct": Domain(integer=True, low=2),
    "export.step": COUNT_OR_OFF, "export.max_shard_gb": POSITIVE,
    "sft.batch_size": COUNT, "sft.neutral_share": DECAY,
    "sample.num_prompts": COUNT, "sample.samples_per_prompt": COUNT,
    "sample.temperature": NON_NEGATIVE, "sample.top_p": PROBABILITY_MASS,
    "sample.top_k": Domain(integer=True, low=0, high=INT32, note="0: all"),
    "sample.max_new_tokens": Domain(integer=True, low=1, high=INT32),
}  # fmt: skip
