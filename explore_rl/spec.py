"""A run's settings, resolved once from its config by the entry point (`config.spec`):
frozen, typed, and what the loop, the explorers and evaluation read. Nothing below the
entry point reads a ConfigDict.

    spec = config.spec(get_config("demo"))         # validated; one line per bad value
    spec.rollout.group_size, spec.loss.eps_high, spec.optim.lr
    spec.rollout_settings(tok)                      # how training rollouts are drawn

Each section's fields are those of the config section of the same name (`configs/base.py`,
every field commented there, is where the defaults live; a test holds the two together).
Settings the code derives once live here too: the loss (`LossConfig`, with the score
temperature resolved), the optimizer (`OptimConfig`), the engine, the prompt format, the
reward function, and each exploration method's own `Settings`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from explore_rl.models.tokenizer import PromptFormat
from explore_rl.rewards.registry import Reward
from explore_rl.rl.losses import LossConfig
from explore_rl.rl.rollout import RolloutSettings
from explore_rl.rl.train_step import OptimConfig
from explore_rl.sampling.engine import EngineConfig
from explore_rl.sampling.sampler import SamplingConfig

frozen = dataclasses.dataclass(frozen=True)


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


@frozen
class RewardSpec:
    """`reward.*`, its functions built (registered rewards, the user's own; weighted)."""

    fn: Reward
    extractors: tuple[str, ...]
    format_weight: float
    workers: int
    timeout: float
    memory_mb: int


@frozen
class RolloutSpec:
    """`rollout.*`: the step's batch and how it is sampled."""

    prompts: int
    group_size: int
    max_new_tokens: int
    max_prompt_len: int
    temperature: float
    top_p: float
    top_k: int
    dynamic_sampling: bool
    max_generation_batches: int
    slots: int | str  # a count, or "auto" until `train.sizing` sizes it
    decode_chunk: int


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
    eval_every: int
    eval_before: bool


@frozen
class EvalSpec:
    """`eval.*`: the held-out evaluation."""

    checkpoint: str
    step: int
    num_prompts: int
    samples: int
    temperature: float
    top_p: float
    max_new_tokens: int
    batch_prompts: int
    diversity: bool


@frozen
class SftSpec:
    """`sft.*`: supervised fine-tuning's examples per optimizer step (`--mode sft`)."""

    batch_size: int


@frozen
class MeshSpec:
    data: int
    fsdp: int
    tensor: int


@frozen
class RunSpec:
    seed: int
    model: ModelSpec
    task: TaskSpec
    reward: RewardSpec
    prompt: PromptFormat
    rollout: RolloutSpec
    engine: EngineConfig
    sampling: SamplingConfig  # the rollout's truncation and length (stop tokens: the model's)
    eval_sampling: SamplingConfig  # the held-out evaluation's
    update: UpdateSpec
    loss: LossConfig
    optim: OptimConfig
    mesh: MeshSpec
    train: TrainSpec
    eval: EvalSpec
    sft: SftSpec
    methods: tuple[tuple[str, Any], ...]  # (registered name, its Settings), in order
    record: dict = dataclasses.field(compare=False)  # the resolved config: config.json's
    wandb: dict | None = dataclasses.field(compare=False)  # wandb.init's arguments; None: off

    def rollout_settings(self, tok) -> RolloutSettings:
        """How training rollouts are drawn and rewarded."""
        return RolloutSettings(
            prompt=self.prompt,
            max_prompt_len=self.rollout.max_prompt_len,
            sampling=dataclasses.replace(self.sampling, stop_ids=tuple(tok.stop_ids)),
            engine=self.engine,
            extractors=self.reward.extractors,
            reward=self.reward.fn,
            format_weight=self.reward.format_weight,
        )

    def eval_settings(self, tok) -> RolloutSettings:
        """How held-out questions are answered: the eval section's length, top-p, no
        top-k; correctness only."""
        return dataclasses.replace(
            self.rollout_settings(tok),
            sampling=dataclasses.replace(self.eval_sampling, stop_ids=tuple(tok.stop_ids)),
            format_weight=0.0,
            reward=Reward(self.reward.fn.functions[:1]),  # what counts as correct, alone
        )


def replace(spec: RunSpec, **changes) -> RunSpec:
    """`spec` with `section.field` values changed (`replace(s, **{"rollout.slots": 4})`)."""
    sections: dict[str, dict] = {}
    for key, value in changes.items():
        section, name = key.split(".")
        sections.setdefault(section, {})[name] = value
    return dataclasses.replace(
        spec,
        **{s: dataclasses.replace(getattr(spec, s), **v) for s, v in sections.items()},
    )
