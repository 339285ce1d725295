"""One generation batch: prompts -> rollouts -> decoded responses -> rewards.

Rows are grouped by prompt (row b answers problem b // G), as the sampler and the update
expect. DAPO dynamic sampling (Yu et al. 2025, Sec. 3.2) draws further batches and keeps
only groups with 0 < correct < G until the step has its Q groups; when the generation
budget runs out first, the rest is filled with the latest discarded groups (the count is
logged), so shapes stay static.
"""

from __future__ import annotations

import dataclasses
import logging

import jax
import jax.numpy as jnp
import numpy as np

from explore_rl.data.tasks import Problem
from explore_rl.models.tokenizer import PromptFormat, Tokenizer
from explore_rl.rewards.math import Verifier, format_reward
from explore_rl.rewards.registry import Reward
from explore_rl.rl.advantages import zero_advantage_groups
from explore_rl.rl.plan import RolloutPlan
from explore_rl.sampling import engine as engine_lib
from explore_rl.sampling import sampler, shapes


@dataclasses.dataclass
class Rollouts:
    problems: list[Problem]  # Q
    prompts: np.ndarray  # [Q, L] left-padded prompt tokens
    prompt_mask: np.ndarray  # [Q, L]
    out: sampler.Samples  # B = Q x G rows
    texts: list[str]  # B decoded responses
    rewards: np.ndarray  # [Q, G]
    correct: np.ndarray  # [Q, G] bool
    plan: RolloutPlan  # how the rows were drawn (its `problems` moved to `problems`)
    timeouts: int = 0  # verifier items over time
    reward_errors: int = 0  # verifier items whose reward function raised
    engine: list[engine_lib.EngineStats] = dataclasses.field(default_factory=list)  # per call
    # each reward function's own rewards [Q, G] (NaN: none given), by its name
    by_function: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)

    @property
    def group_size(self) -> int:
        return self.rewards.shape[1]


def encode(tok: Tokenizer, problems: list[Problem], fmt: PromptFormat, max_len: int):
    """Left-padded prompt rows: the prompt format's text (the chat template up to the
    assistant turn), then any response prefix of the problem."""
    rows = [tok.encode(fmt.text(tok, p.question, p.messages)) + list(p.prefix) for p in problems]
    longest = max(map(len, rows))
    if longest > max_len:
        raise ValueError(
            f"a prompt has {longest} tokens, more than rollout.max_prompt_len={max_len}"
        )
    tokens, mask = shapes.left_pad(rows, tok.pad_id)
    return np.asarray(tokens), np.asarray(mask)


def fit_prompts(
    tok: Tokenizer,
    problems: list[Problem],
    fmt: PromptFormat,
    max_len: int,
    policy: str,
    name: str,
    whole: bool = True,
) -> tuple[list[Problem], int]:
    """The problems whose prompt fits `max_len` tokens, checked once when the data is loaded
    rather than at the step that draws one: policy "skip" drops the others with a warning
    that counts them, "error" names the first (as verl's filter_overlong_prompts). Also the
    longest kept prompt, in tokens (what sizes a run's caches). Not `whole` (one process's
    shard of a file): none fitting is not an error here, the run checks the whole."""
    lengths = [len(tok.encode(fmt.text(tok, p.question, p.messages))) for p in problems]
    long = [i for i, n in enumerate(lengths) if n + len(problems[i].prefix) > max_len]
    if long and policy == "error":
        i = long[0]
        raise ValueError(
            f"{name} problem {i} (of its usable rows; row {problems[i].row} of the file) has "
            f"a {lengths[i]}-token prompt, more "
            f"than rollout.max_prompt_len={max_len} ({len(long)} such; task.long_prompts="
            f"'skip' drops them): {problems[i].question[:80]!r}"
        )
    if whole and problems and len(long) == len(problems):
        raise ValueError(
            f"{name}: every prompt is longer than rollout.max_prompt_len={max_len} tokens "
            f"(the shortest has {min(lengths)})"
        )
    if long:
        logging.warning(
            "%s: %d of %d prompts are longer than rollout.max_prompt_len=%d tokens: skipped",
            name, len(long), len(problems), max_len,
        )  # fmt: skip
    drop = set(long)
    kept = [i for i in range(len(problems)) if i not in drop]
    longest = max((lengths[i] + len(problems[i].prefix) for i in kept), default=0)
    return [problems[i] for i in kept], longest


def prefill_layout(q: int, b: int, route) -> tuple[np.ndarray, np.ndarray | None]:
    """Which prompt rows to prefill and which one each decode row continues: one prefill
    per distinct (problem, route), in order of first appearance. Returns (the problem of
    each prompt row [P], the prompt row of each decode row [B]), the latter None for the
    plain layout of G contiguous rows per prompt row (the sampler's fastest path)."""
    g = b // q
    problem = np.arange(b) // g
    if route is None:
        return np.arange(q), None
    keys = list(zip(problem.tolist(), np.asarray(route).tolist()))
    index = {k: i for i, k in enumerate(dict.fromkeys(keys))}
    rows = np.asarray([index[k] for k in keys], np.int32)
    prompt_of = np.asarray([k[0] for k in index], np.int32)
    if len(index) * g == b and (rows == np.arange(b) // g).all():
        return prompt_of, None
    return prompt_of, rows


def generate(
    params,
    cfg,
    tok: Tokenizer,
    plan: RolloutPlan,
    rng,
    verifier: Verifier,
    *,
    sampling: sampler.SamplingConfig,
    engine: engine_lib.EngineConfig,
    prompt: PromptFormat,
    max_prompt_len: int,
    reward: Reward,
    format_weight: float = 0.0,
) -> Rollouts:
    """Sample G = B / Q responses to each of the plan's Q problems and score them: the
    questions as `prompt` renders them, sampled by `sampling` over `engine`'s decode
    slots, rewarded by `reward`'s functions (in the verifier's workers) plus
    `format_weight` x (the answer in \\boxed{}). A run's settings: `RunSpec.generation`."""
    problems = plan.problems
    prompts, mask = encode(tok, problems, prompt, max_prompt_len)
    prompt_of, rows = prefill_layout(len(problems), plan.temperature.shape[0], plan.route)
    out, stats = engine_lib.generate(
        params,
        cfg,
        jnp.asarray(prompts[prompt_of]),
        jnp.asarray(mask[prompt_of]),
        rng,
        plan.temperature,
        sampling,
        engine,
        plan.interventions,
        None if rows is None else jnp.asarray(rows),
    )
    tokens, keep = np.asarray(out.tokens), np.asarray(out.mask)
    g = tokens.shape[0] // len(problems)
    # what the reward sees: the response after its prefix (decoded together, so a token
    # split across the boundary reads as it would in one text)
    texts = [
        tok.decode([*problems[i // g].prefix, *t[k].tolist()])
        for i, (t, k) in enumerate(zip(tokens, keep))
    ]
    items = [(t, problems[i // g]) for i, t in enumerate(texts)]
    scored = reward.score(verifier, items)
    shape = (len(problems), g)
    rewards = scored.total.reshape(shape) + format_weight * np.asarray(
        [format_reward(t) for t in texts], np.float32
    ).reshape(shape)
    return Rollouts(
        problems,
        prompts,
        mask,
        out,
        texts,
        rewards,
        scored.correct.reshape(shape),
        plan.replace(problems=None),
        scored.timeouts,
        scored.errors,
        [stats],
        {name: x.reshape(shape) for name, x in scored.by_function.items()},
    )


def _pad_left(x: np.ndarray, length: int, value) -> np.ndarray:
    return np.pad(x, ((0, 0), (length - x.shape[1], 0)), constant_values=value)


def _concat(*xs):
    return jnp.concatenate(xs, axis=0)


def select_groups(parts: list[tuple[Rollouts, int]], pad_id: int) -> Rollouts:
    """Concatenate chosen groups [(rollouts, group index)] into one batch (the caller
    sets `timeouts`, `reward_errors` and `engine`: they count every generation batch, kept
    groups or not)."""
    length = max(r.prompts.shape[1] for r, _ in parts)
    g = parts[0][0].group_size
    rows = lambda r, i: slice(i * g, (i + 1) * g)  # noqa: E731
    out = jax.tree.map(
        _concat,
        *[jax.tree.map(lambda x, r=r, i=i: x[rows(r, i)], r.out) for r, i in parts],
    )
    return Rollouts(
        problems=[r.problems[i] for r, i in parts],
        prompts=np.stack([_pad_left(r.prompts[i : i + 1], length, pad_id)[0] for r, i in parts]),
        prompt_mask=np.stack(
            [_pad_left(r.prompt_mask[i : i + 1], length, False)[0] for r, i in parts]
        ),
        out=out,
        texts=[t for r, i in parts for t in r.texts[rows(r, i)]],
        rewards=np.stack([r.rewards[i] for r, i in parts]),
        correct=np.stack([r.correct[i] for r, i in parts]),
        by_function={
            k: np.stack([r.by_function[k][i] for r, i in parts]) for k in parts[0][0].by_function
        },
        plan=jax.tree.map(_concat, *[r.plan.rows(i, g) for r, i in parts]),
    )


def informative(r: Rollouts) -> np.ndarray:
    """Groups with a nonzero advantage: rewards not all equal."""
    return ~np.asarray(zero_advantage_groups(r.rewards))
