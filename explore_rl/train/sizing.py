"""A run's sizes from its spec: the step's sizes, its memory estimate, the decode slots
`rollout.slots = "auto"` chooses, and the settings that would make a run fit.

    sizes = step_sizes(spec, longest_prompt, axis_sizes)
    est = estimate(spec, cfg, axis_sizes, optimizer, longest_prompt, explorers)

Everything here is shapes: no weight is read, so a run that cannot fit is refused (with
what would make it fit) before it loads anything, and a config can be sized for a mesh
this machine does not have (`axis_sizes`, `capacity`).
"""

from __future__ import annotations

from explore_rl import parallel
from explore_rl.exploration import base as exploration
from explore_rl.rl import footprint
from explore_rl.sampling import shapes
from explore_rl.sampling.engine import AUTO
from explore_rl.spec import RunSpec, replace

GIB = footprint.GIB


def step_sizes(spec: RunSpec, longest_prompt: int, axis_sizes: dict | None = None, length: int = 0):
    """The sizes of one step of config `c` (prompts padded to the longest's bucket) on a
    mesh of `axis_sizes` (the batch shards a token budget's micro-batch is cut for), its
    update's micro-batch at `length` tokens (0: the longest)."""
    rows = spec.rollout.prompts * spec.rollout.group_size
    n_slots = 0 if spec.rollout.engine.slots == AUTO else spec.rollout.engine.slots
    slotted = 0 < n_slots < rows
    prompt_len = shapes.bucket(max(longest_prompt, 1))
    g, t = spec.rollout.group_size, spec.rollout.sampling.max_new_tokens
    groups = spec.rollout.prompts // spec.update.minibatches  # an optimizer step's
    length = length or t
    if spec.optim.micro_batch_tokens:  # `train_step.plan_micro_batches`' groups at `length`
        shards = parallel.batch_shards(axis_sizes or {})
        per_shard = max(spec.optim.micro_batch_tokens // (prompt_len + g * length), 1)
        update_prompts = min(per_shard, -(-groups // shards)) * shards
    else:
        update_prompts = max(groups // spec.optim.micro_batches, 1)
    return footprint.StepSizes(
        prompts=spec.rollout.prompts,
        decode_rows=n_slots if slotted else rows,
        prompt_len=prompt_len,
        new_tokens=t,
        update_prompts=update_prompts,
        update_rows=update_prompts * g,
        update_length=length,
        slotted=slotted,
        micro_batches=-(-groups // update_prompts),
    )


def estimate(spec, cfg, axis_sizes, optimizer, longest_prompt, explorers, capacity=None):
    """The memory estimate of config `c` (with its explorers' extra rows and prompt
    lengths) on a mesh of `axis_sizes`. A token budget's micro-batches trade rows for
    length: the update is its widest micro-batch's (the shortest bucket of the update's
    grid, most groups) or its longest's, whichever is larger."""
    lengths = [0, shapes.bucket(1, fine=True)] if spec.optim.micro_batch_tokens else [0]
    estimates = [
        footprint.estimate(
            cfg,
            axis_sizes,
            optimizer,
            exploration.step_sizes(explorers, step_sizes(spec, longest_prompt, axis_sizes, n)),
            bool(spec.loss.kl_coef),
            capacity,
        )  # fmt: skip
        for n in lengths
    ]
    return max(estimates, key=lambda e: e.update)


def eval_variant(spec: RunSpec) -> RunSpec:
    """Spec `spec` as one batch of its held-out evaluation, for sizing its decode slots:
    `eval.batch_prompts` questions x `eval.samples` rows of up to `eval.max_new_tokens`
    tokens (the run's params and optimizer state stay resident meanwhile)."""
    e = spec.eval
    return replace(spec, **{
        "rollout.prompts": e.batch_prompts, "rollout.group_size": e.samples,
        "rollout.sampling.max_new_tokens": e.sampling.max_new_tokens,
        "rollout.engine.slots": AUTO,
        "update.minibatches": 1, "optim.micro_batches": 1, "optim.micro_batch_tokens": 0,
    })  # fmt: skip


def sample_variant(spec: RunSpec, prompts: int, samples: int, max_new_tokens: int) -> RunSpec:
    """Spec `spec` as `--mode sample`'s one generation, for sizing its decode slots: its
    `prompts` x `samples` rows of up to `max_new_tokens` tokens (params resident; no
    optimizer, no reference model)."""
    return replace(spec, **{
        "rollout.prompts": prompts, "rollout.group_size": samples,
        "rollout.sampling.max_new_tokens": max_new_tokens, "rollout.engine.slots": AUTO,
        "update.minibatches": 1, "loss.kl_coef": 0.0, "optim.micro_batches": 1,
        "optim.micro_batch_tokens": 0,
    })  # fmt: skip


# The share of a device decode slots may fill by the estimate: the estimate counts arrays,
# not the runtime, XLA's workspace or the allocator's fragmentation.
SLOTS_HEADROOM = 0.9


def fit_slots(spec, cfg, axis_sizes, optimizer, longest_prompt, explorers, capacity=None) -> int:
    """The most decode slots, up to every row (0), with which the estimate fits in
    `SLOTS_HEADROOM` of a device: a multiple of the batch axes' devices, so each holds
    its own rows; the fewest (one per device) when none does (the refusal then names the
    rest)."""
    rows = spec.rollout.prompts * spec.rollout.group_size
    shards = parallel.batch_shards(axis_sizes)

    def fits(n):  # the rollout's phase: the update's does not depend on the slots
        v = replace(spec, **{"rollout.engine.slots": n})
        e = estimate(v, cfg, axis_sizes, optimizer, longest_prompt, explorers, capacity)
        return e.resident + e.rollout <= SLOTS_HEADROOM * e.capacity

    if fits(0):
        return 0
    low, high = 1, max((rows - 1) // shards, 1)  # slots per device, by bisection
    while low < high:
        mid = (low + high + 1) // 2
        low, high = (mid, high) if fits(mid * shards) else (low, mid - 1)
    return low * shards


def fixes(spec, cfg, axis_sizes, optimizer, longest_prompt, explorers, capacity=None) -> list[str]:
    """Settings with which a run that does not fit would, each with its peak: for the
    update, rematerialised layers, else a token budget for its micro-batches (the largest
    power of two that fits, with remat if need be); for the rollout, the most decode slots
    that fit; together where both phases need it. Or more devices on fsdp."""

    def est(v, cfg_, sizes=axis_sizes):
        return estimate(v, cfg_, sizes, optimizer, longest_prompt, explorers, capacity)

    def update_fits(v, cfg_):
        e = est(v, cfg_)
        return e.resident + e.update <= e.capacity

    e = est(spec, cfg)
    settings, v, cfg_ = [], spec, cfg
    if not update_fits(spec, cfg):
        remat = cfg.replace(remat="block")
        if cfg.remat == "none" and update_fits(spec, remat):
            settings, cfg_ = ["model.remat=block"], remat
        else:
            one_group = shapes.bucket(max(longest_prompt, 1)) + spec.rollout.group_size * (
                spec.rollout.sampling.max_new_tokens
            )
            for b in (2**e for e in range(30, 0, -1) if 2**e >= one_group):
                for name, candidate in (("", cfg), ("model.remat=block and ", remat)):
                    budgeted = replace(spec, **{"optim.micro_batch_tokens": b})
                    if not settings and update_fits(budgeted, candidate):
                        settings = [f"{name}optim.micro_batch_tokens={b}"]
                        v, cfg_ = budgeted, candidate
    if e.resident + e.rollout > e.capacity and (not settings or update_fits(v, cfg_)):
        n = fit_slots(v, cfg_, axis_sizes, optimizer, longest_prompt, explorers, capacity)
        v = replace(v, **{"rollout.engine.slots": n})
        settings.append(f"rollout.slots={n}")
    found = []
    if settings and (together := est(v, cfg_)).fits:
        found.append(f"{' and '.join(settings)} (~{together.peak / GIB:.0f} GiB)")
    for factor in (2, 4, 8, 16, 32, 64):
        sizes = {**axis_sizes, "fsdp": axis_sizes.get("fsdp", 1) * factor}
        if (more := est(spec, cfg, sizes)).fits:
            found.append(f"{factor}x the devices on mesh.fsdp (~{more.peak / GIB:.0f} GiB)")
            break
    return found


def check(spec, cfg, axis_sizes, optimizer, longest_prompt, explorers, est) -> None:
    """Refuse, in one line, a run whose estimate `est` does not fit, naming what would."""
    if not est.fits:
        est.check(
            fixes(spec, cfg, axis_sizes, optimizer, longest_prompt, explorers, est.capacity_of)
        )


def size(
    spec, cfg, axis_sizes, optimizer, longest_prompt, explorers, capacity=None,
    longest_eval_prompt=None,
):  # fmt: skip
    """(`spec` with its decode slots counts, its estimate): `rollout.slots = "auto"` becomes
    `fit_slots`' for a training step and, when the run evaluates (`longest_eval_prompt`,
    its longest held-out prompt), for one evaluation batch (`eval_variant`; else every row
    of a batch at once). A count given is kept for both."""
    args = (cfg, axis_sizes, optimizer)
    if spec.rollout.engine.slots == AUTO:
        n = fit_slots(spec, *args, longest_prompt, explorers, capacity)
        m = 0 if longest_eval_prompt is None else fit_slots(
            eval_variant(spec), *args, longest_eval_prompt, explorers, capacity
        )  # fmt: skip
        spec = replace(spec, **{"rollout.engine.slots": n, "eval.engine.slots": m})
    return spec, estimate(spec, *args, longest_prompt, explorers, capacity)
