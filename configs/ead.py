"""EAD (seed 003): GRPO with exploratory annealed decoding and TIS, c_IS = 2.

    python -m explore_rl.main --config configs/ead.py:smoke --workdir runs/ead-smoke
    python -m explore_rl.main --config configs/ead.py:demo --workdir runs/ead-demo
    python -m explore_rl.main --config configs/ead.py:demo --workdir runs/ead-code \\
        --config.exploration.ead.convention=code      # the authors' public code: k = 20
    python -m explore_rl.main --config configs/ead.py:paper --workdir runs/ead-paper \\
        --config.model.path=/models/Qwen2.5-Math-1.5B --config.task.train_path=numina.jsonl

smoke and demo are configs/grpo.py's with EAD on (same budget, so runs compare);
paper is the seed's Appendix A (Minimal-RL recipe in the DAPO framework).
"""

from configs import base, grpo
from explore_rl.exploration.ead import EAD


def get_config(arg: str | None = None):
    _, arg = base.parse_arg(arg, "ead.py")
    c = grpo.get_config(arg)
    c.exploration.methods = ("ead",)
    c.exploration.ead = EAD.defaults()  # tau_max 1.2, tau_min 0.1, d0 25, c 10, k = 1
    c.rl.tis_cap = 2.0  # w = min(2, pi_old / mu)
    if arg == "paper":
        c.rollout.prompts, c.rollout.group_size, c.rollout.max_new_tokens = 1024, 8, 3072
        c.rollout.dynamic_sampling = True  # DAPO framework
        c.rl.minibatches = 4  # mini-batch 256 of the 1024 prompts
        c.rl.entropy_coef = 0.0
        c.optim.lr, c.optim.micro_batches = 1e-6, 64
        c.eval.samples = 16  # the seed reports Pass@16 / Worst@16
    return c


def get_sweep(hyper):
    return hyper.product(
        [
            hyper.sweep("config.seed", [0, 1]),
            hyper.sweep("config.exploration.ead.convention", ["paper", "code"]),
        ]
    )
