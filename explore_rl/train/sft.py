"""`--mode sft`: supervised fine-tuning on (prompt, response) pairs, with GRPO's loop.

    python -m explore_rl.main --mode sft --config configs/lab.py:sft --workdir runs/sft

The examples are the task's problems that have a solution (`Problem.solution`: a
generated task's own, or `task.solution_field` of a dataset file); each prompt is written
as RL writes it (chat template or `task.raw_prompt`), the response is the solution and
EOS, at most `rollout.max_new_tokens` tokens (longer ones are skipped, counted at start).
The loss is the mean negative log-likelihood of the response tokens of a batch (policy
loss `nll`, `token_mean`: the prompt is context only), `sft.batch_size` examples an
optimizer step, cut into `optim.micro_batches` as RL's updates are. The loop is GRPO's
(`loop.run`): the data stream (one seeded shuffle an epoch), logs, checkpoints, the
held-out evaluation (Pass@k as for RL), resume and stop signals are the same, so a rerun of
the command continues exactly.

`sft.neutral_share` > 0: round(share x batch_size) examples of each batch, drawn from the
run's seed and data position, carry one of `sft.neutral_tokens` (drawn too) as a one-token
`Problem.prefix`, so it sits after the prompt and before the response, context only: where
EDEN appends its anchor slot (exploration/eden.py), at the same position.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time

import jax
import jax.numpy as jnp
import numpy as np

from explore_rl import parallel
from explore_rl.data import sharded
from explore_rl.rl import rollout as rollout_lib
from explore_rl.rl.train_step import Batch
from explore_rl.spec import RunSpec
from explore_rl.train import loop, steps
from explore_rl.train.build import Progress, Run, placed


def train_sft(spec: RunSpec, workdir: str):
    """The supervised run of `spec` (`config.spec(c, "sft")`) in `workdir` (rerun to
    resume)."""
    return loop.run(spec, [], workdir, SftStep())


@dataclasses.dataclass(frozen=True)
class Examples:
    """The problems with a solution that fits, their response tokens (each with EOS) and
    the neutral tokens' ids (`sft.neutral_tokens`)."""

    problems: list
    responses: list[list[int]]
    neutral: tuple[int, ...]


def neutral_ids(tok, share: float, tokens: str) -> tuple[int, ...]:
    """The ids of `tokens` (comma-separated, each one token as written); a one-line error
    for a share without tokens or a token that is not one."""
    ids = tok.token_ids(tokens, "sft.neutral_tokens")
    if share and not ids:
        raise ValueError(f"config: sft.neutral_share={share} needs sft.neutral_tokens")
    return tuple(ids) if share else ()


def examples(run: Run) -> Examples:
    """The run's training examples (module docstring); the count of problems without a
    solution, or with one longer than the limit, said."""
    tok, limit = run.tok, run.spec.rollout.sampling.max_new_tokens
    neutral = neutral_ids(tok, run.spec.sft.neutral_share, run.spec.sft.neutral_tokens)
    if neutral and run.longest_prompt >= run.spec.rollout.max_prompt_len:
        raise ValueError(
            f"config: sft.neutral_share needs a token after the longest prompt "
            f"({run.longest_prompt} tokens): rollout.max_prompt_len="
            f"{run.spec.rollout.max_prompt_len} leaves none"
        )
    problems, responses, unsolved, long = [], [], 0, 0
    for p in sharded.take(run.train_set, range(len(run.train_set))):
        ids = tok.encode(p.solution) + [tok.eos_id]
        unsolved, long = unsolved + (not p.solution), long + (bool(p.solution) and len(ids) > limit)
        if p.solution and len(ids) <= limit:
            problems.append(p)
            responses.append(ids)
    if unsolved == len(run.train_set):
        raise ValueError(
            f"--mode sft: task {run.spec.task.name!r} has no worked solutions to imitate "
            "(none of its training problems has one): name the field that holds them, "
            "task.solution_field, for a file, or use a task that makes them (countdown, "
            "multistep)"
        )
    if not problems:
        raise ValueError(
            f"--mode sft: none of the {len(run.train_set)} training problems has a solution of "
            f"at most rollout.max_new_tokens={limit} tokens (task.solution_field for a file)"
        )
    if unsolved or long:
        logging.warning("sft: %d examples; skipped %d problems without a solution and %d with "
                        "one over %d tokens", len(problems), unsolved, long, limit)  # fmt: skip
    return Examples(problems, responses, neutral)


def with_neutral(problems: list, neutral: tuple[int, ...], share: float, rng) -> list:
    """`problems` with round(share x len) of them, drawn with `rng`, given one of the
    `neutral` ids, drawn too, as their prefix (module docstring)."""
    if not neutral:
        return problems
    out = list(problems)
    k = math.floor(share * len(out) + 0.5)
    for r, token in zip(rng.choice(len(out), k, replace=False), rng.choice(neutral, k)):
        out[r] = dataclasses.replace(out[r], prefix=(int(token),))
    return out


def make_batch(run: Run, ex: Examples, indices, position: int) -> Batch:
    """The update's batch of examples `indices` (the stream's from data `position`):
    prompts left-padded as RL's (with a neutral token where `with_neutral` puts one),
    responses right-padded to `rollout.max_new_tokens`, every row weighted 1."""
    rng = np.random.default_rng([run.spec.seed, position])
    problems = [ex.problems[i] for i in indices]
    problems = with_neutral(problems, ex.neutral, run.spec.sft.neutral_share, rng)
    prompts, prompt_mask = rollout_lib.encode(
        run.tok, problems, run.spec.prompt, run.spec.rollout.max_prompt_len
    )
    t, rows = run.spec.rollout.sampling.max_new_tokens, [ex.responses[i] for i in indices]
    tokens = np.full((len(rows), t), run.tok.pad_id, np.int32)
    mask = np.zeros((len(rows), t), bool)
    for r, ids in enumerate(rows):
        tokens[r, : len(ids)], mask[r, : len(ids)] = ids, True
    zeros = jnp.zeros((len(rows), t), jnp.float32)
    return Batch(
        prompts=jnp.asarray(prompts), prompt_mask=jnp.asarray(prompt_mask),
        tokens=jnp.asarray(tokens), mask=jnp.asarray(mask),
        advantages=jnp.ones(len(rows), jnp.float32), behaviour_logp=zeros, old_logp=zeros,
        weights=jnp.ones(len(rows), jnp.float32),
    )  # fmt: skip


class SftStep:
    """The loop's step (`loop.run`), its examples made at the first step of a run."""

    def __init__(self):
        self._examples: Examples | None = None

    def __call__(self, run: Run, progress: Progress, step: int):
        if self._examples is None:
            self._examples = examples(run)
        return sft_step(run, self._examples, progress)


def sft_step(run: Run, ex: Examples, progress: Progress):
    """One optimizer step on the next `sft.batch_size` examples of the stream:
    (progress, metrics, the examples to log)."""
    t0 = time.perf_counter()
    n, position = run.spec.sft.batch_size, int(progress.data_position)
    order = steps.stream(list(range(len(ex.problems))), run.spec.seed, position, n)
    batch = make_batch(run, ex, order, position)
    lengths = np.asarray(batch.mask).sum(axis=1).reshape(n, 1)
    if run.mesh is not None:
        batch = parallel.shard_batch(batch, run.mesh)
    state, metrics = steps.update(progress.state, batch, run.cfg, run.spec, run.optimizer, lengths)
    jax.block_until_ready(state.params)
    seconds = time.perf_counter() - t0
    tokens = int(lengths.sum())
    metrics = {
        **metrics,
        "sft/response_len": float(lengths.mean()),
        "sft/epoch": (position + n) / len(ex.problems),
        "time/update_s": seconds,
        "perf/tokens_per_s": tokens / seconds,
    }
    progress = Progress(state, jnp.asarray(position + n, jnp.int32), progress.explorers)
    if run.mesh is not None:
        progress = placed(progress, run.mesh)
    logged = [{"question": ex.problems[i].question, "response": ex.problems[i].solution}
              for i in order[: run.spec.train.samples_to_log]]  # fmt: skip
    return progress, metrics, logged
