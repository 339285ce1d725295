"""ASE: GRPO with routed activation steering from an online vector bank, TIS
with c_IS = 2.

    python -m explore_rl.main --config configs/ase.py:smoke --workdir runs/ase-smoke
    python -m explore_rl.main --config configs/ase.py:demo --workdir runs/ase-demo
    python -m explore_rl.main --config configs/ase.py:unstructured,demo --workdir runs/x
    python -m explore_rl.main --config configs/ase.py:paper --workdir runs/ase-paper \\
        --config.model.path=/models/Qwen3-1.7B-Base --config.task.train_path=dapo17k.jsonl

The argument is `[<ablation>,][<scale>]` (`base.parse_arg`): scale smoke | demo (default)
| paper; smoke and demo are configs/grpo.py's with ASE on (the same rollout budget, so runs
compare), paper is the ASE paper's setting, each value with its source below. Ablations are
ABLATIONS (the paper's controls, Sec. 4 and App. D).
"""

from configs import base, grpo
from explore_rl.exploration.ase import ASE

# Settings outside exploration.ase that go with ASE at every scale: a run that composes ASE
# onto another method's config must have them as this file's config at its scale does.
RUN_SETTINGS = ("rl.tis_cap",)

ABLATIONS = {
    "random_directions": lambda e: e.update(directions="random"),
    "shuffled_labels": lambda e: e.update(directions="shuffled"),
    "reversed": lambda e: e.update(directions="reversed"),
    "unstructured": lambda e: e.update(routing="unstructured"),
    "no_ema": lambda e: e.update(beta=0.0),
    "no_hungarian": lambda e: e.update(match=False),
}


def get_config(arg: str | None = None):
    ablation, scale = base.parse_arg(arg, "ase.py", ABLATIONS)
    c = grpo.get_config(scale)
    c.exploration.methods = ("ase",)
    c.exploration.ase = e = ASE.defaults()  # K 3, alpha 0.5, block 0, f 0.25, beta 0.5
    c.rl.tis_cap = 2.0  # ASE paper, App. C.2: verl's token-level TIS, c_IS = 2
    if scale == "smoke":  # a bank after the first step with any mixed group
        e.min_pairs, e.interval, e.capacity, e.kmeans_init = 3, 1, 32, 2
    elif scale in ("demo", "lab", "lab2"):  # ~4 pairs a step: an update every 3-4 steps
        e.min_pairs, e.interval, e.capacity = 12, 3, 256
        if scale != "demo":  # the pilot's rule (docs/lab.md): the smallest alpha of 0.5-4
            # whose steered tokens' KL(mu, pi_old) is >= 0.01 nats; 4 at lab and at lab2
            # (results/lab/pilot_ase.md, results/lab/pilot_lab2.md)
            e.alpha = 4.0
    else:  # ASE paper, Sec. 4.1 and App. B-C (its Tables 7-9 are not in the text we cite)
        c.model.path = "models/Qwen3-1.7B-Base"  # Sec. 4.1: Qwen3-1.7B-Base (and 8B)
        c.task.train_path = "data/dapo_math_17k.jsonl"  # Sec. 4.1: DAPO-Math-17k
        c.rollout.prompts = 64  # Sec. 4.1: a training batch of 64 prompts
        # Sec. 4.1: an actor mini-batch of 64 too, one pass: one optimizer step per batch, so
        # the ratio is 1 at the update and only the importance weight (TIS) acts
        c.rl.minibatches, c.rl.ppo_epochs = 1, 1
        c.rollout.group_size = 8  # Sec. 4.1: 8 rollouts, G = 8 (two per route)
        c.rollout.temperature, c.rollout.top_p = 1.0, 1.0  # Sec. 4.1: temperature 1.0, top-p 1
        c.rollout.max_prompt_len = 1024  # Sec. 4.1: maximum prompt length 1024
        c.rollout.max_new_tokens = 4096  # Sec. 4.1: maximum response length 4096
        c.rl.eps_low = c.rl.eps_high = 0.2  # Eq. 10: one clip range epsilon (verl's 0.2)
        c.rl.aggregation = "token_mean"  # Eq. 10: the mean over response tokens
        c.rl.kl_coef, c.rl.entropy_coef = 0.0, 0.0  # App. C.1: no KL, no entropy term
        c.optim.lr, c.optim.weight_decay = 1e-6, 0.01  # lr 1e-6, AdamW wd 0.01
        base.paper_memory(c)  # memory only: 8 x 80 GB (remat, token budget, slots)
        # Sec. 4.1: four epochs of App. D.3's 17,390 filtered prompts in batches of 64; verl's
        # training loader drops the last partial batch: 4 x 271
        c.train.steps = 4 * (17_390 // 64)
        c.train.eval_every = c.train.checkpoint_every = 100  # App. B: every 100 steps
        # App. B: MATH500 is evaluated during training and picks the checkpoint (its highest
        # Mean@8); the other benchmarks are evaluated on that one only (--mode eval with
        # eval.checkpoint=<workdir>/checkpoints/best and their task.test_paths)
        c.task.test_paths = "data/math500.jsonl"
        c.train.best_metric = "eval/math500/mean@8"
        c.eval.samples, c.eval.temperature, c.eval.top_p = 8, 0.6, 0.95  # App. B: Mean@8
        c.eval.max_new_tokens = 4096  # App. D: 4096
        e.min_pairs, e.interval, e.capacity = 128, 5, 2048  # B_min, Delta: ours
        e.kmeans_init = 512  # App. D's analysis: K-means n_init = 512
    if ablation:
        ABLATIONS[ablation](e)
    return c


def get_sweep(hyper):
    return hyper.product(
        [
            hyper.sweep("config.seed", [0, 1, 2]),
            hyper.sweep("config.exploration.ase.alpha", [0.25, 0.5]),
        ]
    )
