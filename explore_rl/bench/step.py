"""`step`: one GRPO step on the peer workload (`bench.common`): rollout, rewards,
advantages, pi_old, one AdamW update at lr 1e-6, float32, split into rollout / pi_old /
update seconds, with tokens/s, the update's FLOP/s as a fraction of the matmul peak, and
the process's peak RSS. BENCHMARKS.md ("One GRPO step on the peer workload") has TRL's
GRPOTrainer timed on the same workload and machine: compare ratios, not seconds, across
machines.
"""

from __future__ import annotations

import resource
import statistics

import jax
import jax.numpy as jnp

from explore_rl import memory
from explore_rl.bench.common import (
    PEER_GROUP,
    PEER_NEW,
    PEER_PROMPTS,
    benchmarked_model,
    forward_flops,
    matmul_peak,
    peer_questions,
    sample_flops,
)
from explore_rl.models import weights

HELP = "one GRPO step on the peer workload"


def add_arguments(p) -> None:
    p.add_argument("--model", default=weights.EMBEDDED)
    p.add_argument("--random-init", default="", help="a preset: random weights of its shape")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--micro-batches", type=int, default=1, help="groups split for the update")


def run(args) -> dict:
    from configs import grpo
    from explore_rl import config as config_lib
    from explore_rl.data.tasks import Problem
    from explore_rl.rewards.math import Verifier
    from explore_rl.rl.train_step import init_state, make_optimizer
    from explore_rl.train import build, steps

    c = grpo.get_config("demo")
    c.rollout.prompts, c.rollout.group_size = PEER_PROMPTS, PEER_GROUP
    c.rollout.max_new_tokens, c.task.instruction = PEER_NEW, ""
    c.optim.lr, c.optim.weight_decay = 1e-6, 0.0
    c.reward.extractors = "last_number"
    c.optim.micro_batches = args.micro_batches
    c.rl.minibatches = 1  # the peers' workload: one optimizer step per rollout batch
    params, cfg, tok = benchmarked_model(args)
    problems = [
        Problem(q, str(sum(map(int, q.split("?")[0].split()[2::2])))) for q in peer_questions()
    ]
    spec = config_lib.spec(c).with_stop_ids(())  # 32 tokens forced, as the peers
    optimizer = make_optimizer(spec.optim)
    memory.trim_after_compiles()
    progress = build.Progress(init_state(params, optimizer), jnp.zeros((), jnp.int32))
    peak = matmul_peak("float32")
    times = []
    with Verifier(2, 5.0) as verifier:
        run = build.Run(
            spec=spec,
            cfg=cfg,
            tok=tok,
            train_set=problems,
            test_sets={},
            optimizer=optimizer,
            verifier=verifier,
            key=jax.random.key(0),
            eval_key=jax.random.key(1),
        )
        for step in range(args.steps + 1):  # the first step compiles
            progress, m, _ = steps.train_one_step(run, progress, step)
            times.append(m)
    rows = PEER_PROMPTS * PEER_GROUP
    med = lambda k: statistics.median(t[k] for t in times[1:])  # noqa: E731
    # Update = forward + backward (3x forward FLOPs) over the shared prompts and responses.
    fwd = sample_flops(cfg, PEER_PROMPTS * 46, 0, 48, 0) + forward_flops(cfg, rows, PEER_NEW)
    step_s = med("time/rollout_s") + med("time/pi_old_s") + med("time/update_s")
    return {
        "bench": "step",
        "model": args.model,
        "random_init": args.random_init,
        "rows": rows,
        "new_tokens": PEER_NEW,
        "step_s": round(step_s, 2),
        "rollout_s": round(med("time/rollout_s"), 2),
        "pi_old_s": round(med("time/pi_old_s"), 2),
        "update_s": round(med("time/update_s"), 2),
        "tokens_per_s": round(rows * PEER_NEW / step_s, 1),
        "update_fraction_of_peak": round(3 * fwd / med("time/update_s") / peak, 3),
        "peak_rss_gib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2),
    }
