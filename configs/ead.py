"""EAD: GRPO with exploratory annealed decoding and TIS, c_IS = 2.

    python -m explore_rl.main --config configs/ead.py:smoke --workdir runs/ead-smoke
    python -m explore_rl.main --config configs/ead.py:demo --workdir runs/ead-demo
    python -m explore_rl.main --config configs/ead.py:demo --workdir runs/ead-code \\
        --config.exploration.ead.convention=code      # the authors' public code: k = 20
    python -m explore_rl.main --config configs/ead.py:paper --workdir runs/ead-paper \\
        --config.model.path=/models/Qwen2.5-Math-1.5B --config.task.train_path=numina.jsonl

smoke and demo are configs/grpo.py's with EAD on (same budget, so runs compare);
paper is the paper's Appendix A (Minimal-RL recipe in the DAPO framework), each value
with its source below.
"""

from configs import base, grpo
from explore_rl.exploration.ead import EAD

# Settings outside exploration.ead that go with EAD at every scale: a run that composes EAD
# onto another method's config must have them as this file's config at its scale does.
RUN_SETTINGS = ("rl.tis_cap",)


def get_config(arg: str | None = None):
    _, arg = base.parse_arg(arg, "ead.py")
    c = grpo.get_config(arg)
    c.exploration.methods = ("ead",)
    c.exploration.ead = EAD.defaults()  # tau_max 1.2, tau_min 0.1, d0 25, c 10, k = 1
    # EAD paper, App. B.2: TIS with a cap it does not state; ours: per token, cap 2, the TIS it
    # cites (Yao et al. 2025) as verl applies it (the EAD module docstring says why)
    c.rl.tis_cap = 2.0
    # rl.score_temperature "rollout" = the base temperature 1.0: pi_old and pi_theta at
    # tau = 1 and TIS against the annealed mu, as EAD paper, App. B.2
    if arg in ("lab", "lab2"):  # the paper's schedule rescaled to 32-token answers, 300 steps:
        # k d_s at lab step s = (32 / 3072) (25 + 5 * 2000 s / 300), c = 10 * 32 / 3072 < 1
        # (docs/lab.md): the hot prefix grows to 59% of the bucket by the end, as the paper's
        c.exploration.ead.update(k=0.0694, d0=3.75, c=1)
    if arg == "paper":  # EAD paper, Sec. 5.1 and App. A (Table 1, the Minimal-RL recipe)
        c.rollout.prompts = 1024  # Table 1: training batch size 1024
        c.rollout.group_size = 8  # Sec. 5.2: n = 8 (Fig. 7: "the commonly used 4 or 8")
        c.rollout.max_prompt_len = 1024  # Table 1: max prompt length 1024
        c.rollout.max_new_tokens = 3072  # Table 1: max response length 3072
        c.rollout.dynamic_sampling = False  # Sec. 5.1: disabled for all methods
        c.rl.minibatches = 4  # Table 1: mini-batch size 256 of the 1024
        c.rl.eps_low, c.rl.eps_high = 0.2, 0.28  # the DAPO framework (Sec. 5.1): clip-higher
        c.rl.aggregation = "token_mean"  # the DAPO framework: token-level loss
        c.rl.kl_coef, c.rl.entropy_coef = 0.0, 0.0  # the DAPO framework: no KL, no bonus
        c.optim.lr = 1e-6  # Table 1 (Sec. 5.3: 2e-6 was best for Qwen2.5-Math-1.5B, n = 8)
        base.paper_memory(c)  # memory only: 8 x 80 GB (remat, token budget, slots)
        c.train.steps = 2000  # not stated in EAD paper: the GRPO setting's
        c.eval.samples = 16  # Sec. 5.2: Pass@16 and Worst@16
        c.eval.temperature, c.eval.top_p = 1.0, 1.0  # not stated: verl's sampling defaults
    return c


def get_sweep(hyper):
    return hyper.product(
        [
            hyper.sweep("config.seed", [0, 1]),
            hyper.sweep("config.exploration.ead.convention", ["paper", "code"]),
        ]
    )
