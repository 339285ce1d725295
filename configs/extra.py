"""ExTra: GRPO with a correctness-gated novelty reward (ExTra-N) and
entropy-guided prefix regeneration (ExTra-R); both together are ExTra.

    python -m explore_rl.main --config configs/extra.py:smoke --workdir runs/extra-smoke
    python -m explore_rl.main --config configs/extra.py:demo --workdir runs/extra-demo
    python -m explore_rl.main --config configs/extra.py:novelty,demo --workdir runs/extra-n
    python -m explore_rl.main --config configs/extra.py:paper --workdir runs/extra-paper \\
        --config.model.path=/models/Qwen3-1.7B --config.task.train_path=math_dapo.jsonl

The argument is `[<variant>,][<scale>]` (`base.parse_arg`): variant novelty (ExTra-N) |
regen (ExTra-R) | none (ExTra), scale smoke | demo (default) | paper. smoke and demo are
configs/grpo.py's with ExTra on (the same rollout budget, so runs compare); paper is seed
002's App. B, each value with its source below.
"""

from configs import base, grpo
from explore_rl.exploration.extra import ExTra

# Settings outside exploration.extra that go with ExTra at the lab and paper scales (none;
# the smoke scale's 16-token responses are the smoke run's, not the method's)
RUN_SETTINGS = ()

VARIANTS = {
    "novelty": lambda e: e.update(regen=False),  # ExTra-N
    "regen": lambda e: e.update(novelty=False),  # ExTra-R
}


def get_config(arg: str | None = None):
    variant, scale = base.parse_arg(arg, "extra.py", VARIANTS)
    c = grpo.get_config(scale)
    c.exploration.methods = ("extra",)
    c.exploration.extra = e = ExTra.defaults()
    if scale == "smoke":  # regeneration from step 1, cuts at any line break
        e.warmup, e.min_gap = 1, 1
        c.rollout.max_new_tokens = 16
    elif scale == "demo":  # 32-token answers: cuts 4 tokens apart, regeneration from step 3
        e.warmup, e.min_gap = 3, 4
    elif scale == "lab":  # Countdown: a step a line, cuts at line breaks 4 tokens apart
        e.min_gap = 4  # the rest ExTra's (warm-up 30 steps of the 300)
    elif scale == "lab2":  # lab v2 (docs/lab.md): the lab's cuts, the paper's hard rule and share
        e.min_gap = 4
        e.hard = "all_incorrect"  # Sec. 4.2 and App. B.5: a group with no correct response
        e.guided_frac = 1 / 16  # Sec. 5.5: 1/16 of the traffic, 1 of the 16 groups a step
    else:  # ExTra paper, Sec. 5 and App. B
        c.model.path = "models/Qwen3-1.7B"  # Sec. 5: Qwen3-1.7B (and Nemotron-1.5B)
        c.task.train_path = "data/math_dapo.jsonl"  # Sec. 5: MATH-DAPO
        c.rollout.prompts = 512  # App. B: batch size 512
        c.rollout.group_size = 6  # App. B: G = 6
        c.rollout.max_prompt_len = 2000  # App. B: max prompt length 2,000 tokens
        c.rollout.max_new_tokens = 4096  # App. B: max response 4,096 tokens in training
        c.rl.kl_coef, c.rl.entropy_coef = 0.0, 0.0  # App. B: beta 0, entropy coefficient 0
        # App. B.1 (and E.1): GRPO's objective with one clip range epsilon, not DAPO's
        # clip-higher that configs/grpo.py:paper takes from EDEN; its value is not stated
        c.rl.eps_low = c.rl.eps_high = 0.2  # (ours: PPO's 0.2)
        c.optim.lr = 3e-6  # App. B: learning rate 3e-6
        base.paper_memory(c)  # memory only: 8 x 80 GB (remat, token budget, slots)
        c.train.steps = 250  # App. B: 250 training steps
        e.hard = "all_incorrect"  # Sec. 4.2 and App. B.5: a group with no correct response
        # Sec. 5.5: 136k prompt instances against GRPO's 128k (512 x 250) at an equal batch,
        # so guided prompts are (136 - 128) / 128 = 1/16 of the traffic: 32 of 512 groups.
        # Here they replace groups rather than add to them (the rollout budget stays equal).
        e.guided_frac = 1 / 16
        # the public code embeds a response's last 512 tokens (the paper does not say; MiniLM
        # reads 256 word pieces, so a whole response would be compared by its opening)
        e.last_tokens = 512
        c.eval.samples = 16  # App. B.6: n = 16, pass@1 and pass@16
        c.eval.temperature, c.eval.top_p = 0.7, 0.9  # App. B.6: temperature 0.7, top-p 0.9
        c.eval.max_new_tokens = 31744  # App. B.6: 31,744 tokens
        # the rest are ExTra.defaults(): gamma 1.0, memory = G = 6, all-MiniLM-L6-v2,
        # warm-up 30 steps, tau 0.1, 128 prefixes per prompt, a queue of 4,096 (App. B)
    if variant:
        VARIANTS[variant](e)
    return c


def get_sweep(hyper):
    return hyper.product(
        [
            hyper.sweep("config.seed", [0, 1, 2]),
            hyper.sweep("config.exploration.extra.novelty_at", ["after", "before"]),
        ]
    )
