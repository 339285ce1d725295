"""GRPO (Shao et al. 2024) with DAPO's clip-higher: the baseline every method is compared to.

    python -m explore_rl.main --config configs/grpo.py:smoke --workdir runs/smoke   # seconds
    python -m explore_rl.main --config configs/grpo.py:demo --workdir runs/demo     # minutes
    python -m explore_rl.main --config configs/grpo.py:paper --workdir runs/paper \\
        --config.model.path=/models/Qwen2.5-Math-1.5B --config.task.train_path=train.jsonl
"""

from configs import base


def get_config(arg: str | None = None):
    c = base.get_config()
    _, arg = base.parse_arg(arg, "grpo.py")
    if arg == "smoke":  # a tiny random model with the embedded tokenizer: a few seconds
        c.model.random_init = "tiny-llama"
        c.rollout.prompts, c.rollout.group_size, c.rollout.max_new_tokens = 2, 4, 8
        c.optim.lr = 1e-3
        c.train.steps, c.train.checkpoint_every, c.train.eval_every = 3, 2, 3
        c.task.test_size, c.eval.samples, c.eval.max_new_tokens = 4, 2, 8
        c.reward.workers = 1
    elif arg == "demo":  # the embedded SmolLM2-135M on 1-digit additions: a few minutes
        c.rollout.prompts, c.rollout.group_size, c.rollout.max_new_tokens = 4, 8, 32
        c.optim.lr, c.optim.micro_batches = 1e-5, 4  # one group per micro-batch: ~2x less memory
        c.train.steps, c.train.checkpoint_every, c.train.eval_every = 12, 6, 6
        c.task.test_size, c.eval.samples, c.eval.max_new_tokens = 32, 4, 32
    elif arg == "paper":  # EDEN's GRPO setting (seed 000): Qwen2.5-Math-1.5B, 128 x 16
        c.model.path = "models/Qwen2.5-Math-1.5B"
        c.model.param_dtype, c.model.dtype = "float32", "bfloat16"
        c.task.name = "jsonl"
        c.task.train_path = "data/train.jsonl"
        c.rollout.prompts, c.rollout.group_size, c.rollout.max_new_tokens = 128, 16, 3072
        c.rl.eps_low, c.rl.eps_high, c.rl.kl_coef, c.rl.entropy_coef = 0.2, 0.28, 0.0, 0.001
        c.optim.lr, c.optim.micro_batches = 1e-6, 32
        c.train.steps, c.train.checkpoint_every, c.train.eval_every = 500, 50, 50
        c.eval.max_new_tokens = 3072
    return c


def get_sweep(hyper):
    return hyper.product([hyper.sweep("config.seed", [0, 1])])
