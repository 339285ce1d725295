"""EDEN: GRPO with an appended noisy anchor embedding on a quarter of each group.

    python -m explore_rl.main --config configs/eden.py:smoke --workdir runs/eden-smoke
    python -m explore_rl.main --config configs/eden.py:demo --workdir runs/eden-demo
    python -m explore_rl.main --config configs/eden.py:no_anchor,demo --workdir runs/x
    python -m explore_rl.main --config configs/eden.py:paper --workdir runs/eden-paper \\
        --config.model.path=/models/Qwen2.5-Math-1.5B --config.task.train_path=train.jsonl

The argument is `[<ablation>,][<scale>]` (`base.parse_arg`): scale smoke | demo (default) |
paper (configs/grpo.py's, so runs compare at equal rollout budget), ablation one of
ABLATIONS (the paper's).
"""

from configs import base, grpo
from explore_rl.data import lab
from explore_rl.exploration.eden import EDEN

# Settings outside exploration.eden that go with EDEN (none: its paper runs without TIS)
RUN_SETTINGS = ()


def _scale(c, scale):
    e = c.exploration.eden
    if scale == "smoke":  # tiny random model: 1 noisy of 4, a 2-token bank, a tiny screen
        e.noisy, e.warmup, e.bank_size = 1, 2, 2
        e.candidates, e.probe_prompts, e.probe_samples = 4, 2, 2
    elif scale == "demo":  # SmolLM2-135M: 2 noisy of 8 (the paper's 25%)
        e.noisy, e.rho, e.warmup = 2, 0.12, 6  # rho of the paper's small model (0.5B)
        e.candidates, e.probe_prompts, e.probe_samples = 16, 8, 4
    elif scale in ("lab", "lab2"):  # groups of 8: 2 noisy (the paper's 25%), small-model rho,
        # the warm-up a tenth of training as the paper's 200 of ~2000 steps (docs/lab.md)
        e.noisy, e.rho, e.warmup = 2, 0.12, 30
        e.candidates, e.probe_prompts, e.probe_samples = 16, 8, 4
        e.pool = "all"  # the lab's character vocabulary has no words: its 20 ordinary tokens
        if scale == "lab2":  # the screen probes lab v2's 10 neutral tokens (SFT read past
            # them after the prompt: docs/lab.md), 8 of them the bank (the paper's K)
            e.pool_tokens, e.candidates, e.bank_size = ",".join(lab.NEUTRAL), 10, 8
            # The base's clean probe accuracy is p ~ 0.023 (docs/lab.md), so the absolute 0.1
            # passes everything: viable is accuracy >= (1 - r) x clean, r = 0.6, on 128
            # problems x 4 = n = 512 rollouts a route (11 routes: 5,632 rows of <= 64 tokens).
            # With clean count C and candidate count X ~ Binomial(n, q) (on fixed problems of
            # unequal difficulty the counts vary less, and P(C = 0) stays ~ e^(-np)): a
            # candidate that breaks every answer (q = 0) passes only when C = 0, (1 - p)^n =
            # 7e-6 (0.05 at the 128 of before); a neutral one (q = p) fails, X < 0.4 C, with
            # 0.019, and more than 2 of the 10 neutral fail (the check "K = 8 viable" fails
            # falsely) with 0.007 a seed; a candidate at p / 4 still passes with 0.22, at
            # p / 2 with 0.67 (r = 0.5: 0.04 a seed falsely, 0.13 at p / 4; n = 1024 at
            # r = 0.6: 1e-4 and 0.13, at twice the rows)
            e.tolerance_mode, e.tolerance = "relative", 0.6
            e.probe_prompts, e.probe_samples = 128, 4
    else:  # EDEN paper: Qwen2.5-Math-1.5B, 12 clean + 4 noisy of 16, rho 0.18, warm-up 200
        # (the rest of the setting is configs/grpo.py:paper, EDEN's GRPO baseline; EDEN paper
        # does not state its mini-batch size: 4 mini-batches a batch, as every config here)
        e.noisy, e.rho, e.warmup = 4, 0.18, 200
        e.candidates, e.probe_prompts, e.probe_samples = 32, 16, 4


ABLATIONS = {
    "no_noise": lambda e, g: e.update(rho=0.0),
    "no_anchor": lambda e, g: e.update(anchor="none"),  # norm-matched noise alone
    "anchor_per_rollout": lambda e, g: e.update(anchor="per_rollout"),
    "fixed_anchor": lambda e, g: e.update(anchor="fixed_random"),
    "bank1": lambda e, g: e.update(bank_size=1),
    "bank4": lambda e, g: e.update(bank_size=min(4, e.candidates)),
    "noisy50": lambda e, g: e.update(noisy=g // 2),
    "no_filter": lambda e, g: e.update(keep=1.0),
}


def get_config(arg: str | None = None):
    ablation, scale = base.parse_arg(arg, "eden.py", ABLATIONS)
    c = grpo.get_config(scale)
    c.exploration.methods = ("eden",)
    c.exploration.eden = EDEN.defaults()
    _scale(c, scale)
    if ablation:
        ABLATIONS[ablation](c.exploration.eden, c.rollout.group_size)
    return c


def get_sweep(hyper):
    return hyper.product(
        [
            hyper.sweep("config.seed", [0, 1]),
            hyper.sweep("config.exploration.eden.rho", [0.12, 0.18]),
        ]
    )
