"""GRPO (Shao et al. 2024) with DAPO's clip-higher: the baseline every method is compared to.

    python -m explore_rl.main --config configs/grpo.py:smoke --workdir runs/smoke   # seconds
    python -m explore_rl.main --config configs/grpo.py:demo --workdir runs/demo     # minutes
    python -m explore_rl.main --config configs/grpo.py:paper --workdir runs/paper \\
        --config.model.path=/models/Qwen2.5-Math-1.5B --config.task.train_path=train.jsonl
"""

from configs import base, lab


def get_config(arg: str | None = None):
    c = base.get_config()
    _, arg = base.parse_arg(arg, "grpo.py")
    # Every scale takes several optimizer steps per rollout batch (rl.minibatches), as the
    # papers' framework does: pi_theta moves away from pi_old within a batch, so the ratio
    # clip, clip-higher, dual clip and GSPO's sequence clip act (with one step per batch
    # the ratio is 1 at the update and they change nothing).
    if arg == "smoke":  # a tiny random model with the embedded tokenizer: a few seconds
        c.model.random_init = "tiny-llama"
        c.rollout.prompts, c.rollout.group_size, c.rollout.max_new_tokens = 2, 4, 8
        c.rl.minibatches = 2
        c.optim.lr = 1e-3
        c.train.steps, c.train.checkpoint_every, c.train.eval_every = 3, 2, 3
        c.task.test_size, c.eval.samples, c.eval.max_new_tokens = 4, 2, 8
        c.eval.num_prompts = 8  # a preset's test set (GSM8K: 1,319) capped: seconds, not hours
        c.reward.workers = 1
    elif arg == "demo":  # the embedded SmolLM2-135M on 1-digit additions: a few minutes
        c.rollout.prompts, c.rollout.group_size, c.rollout.max_new_tokens = 4, 8, 32
        c.rl.minibatches = 4  # 4 optimizer steps of one group each (EAD paper: 1024 / 256)
        c.optim.lr = 1e-5
        c.train.steps, c.train.checkpoint_every, c.train.eval_every = 12, 6, 6
        c.task.test_size, c.eval.samples, c.eval.max_new_tokens = 32, 4, 32
        c.eval.num_prompts = 64  # a preset's test set capped (GSM8K has 1,319 questions)
    elif arg == "lab":  # the exploration lab: every method's `lab` scale starts from it
        c = lab.get_config("demo")
    elif arg == "lab2":  # lab v2 (docs/lab.md): every method's `lab2` scale starts from it
        c = lab.get_config("lab2")
    elif arg == "paper":  # EDEN's GRPO baseline (EDEN paper) on Qwen2.5-Math-1.5B
        # Each value's source; "ours" where EDEN paper does not state it.
        c.model.path = "models/Qwen2.5-Math-1.5B"  # EDEN paper: the math model of its tables
        c.model.param_dtype, c.model.dtype = "float32", "bfloat16"  # ours (verl: bf16 compute)
        c.task.name = "jsonl"
        c.task.train_path = "data/train.jsonl"  # your copy of the training set
        c.rollout.prompts = 128  # EDEN paper: batch size 128
        c.rollout.group_size = 16  # EDEN paper: 16 rollouts a prompt (12 clean + 4 noisy)
        c.rollout.temperature, c.rollout.top_p = 1.0, 1.0  # not stated: verl's defaults
        c.rollout.max_prompt_len = 1024  # not stated: the EAD paper's Table 1
        c.rollout.max_new_tokens = 3072  # not stated: the EAD paper's Table 1
        c.rl.eps_low, c.rl.eps_high = 0.2, 0.28  # EDEN paper: eps_low 0.2, eps_high 0.28
        c.rl.kl_coef = 0.0  # EDEN paper: beta = 0
        c.rl.entropy_coef = 0.001  # EDEN paper: alpha = 0.001
        c.rl.minibatches = 4  # not stated in EDEN paper: the EAD paper's 4 per batch (1024 / 256)
        c.optim.lr = 1e-6  # EDEN paper: 1e-6
        base.paper_memory(c)  # memory only: 8 x 80 GB (remat, token budget, slots)
        c.train.steps = 2000  # EDEN paper: about 2000 steps (10 epochs) for the math models
        c.train.checkpoint_every, c.train.eval_every = 100, 100  # ours
        c.eval.temperature, c.eval.top_p = 0.6, 0.95  # EDEN paper: Pass@k at T 0.6, top-p 0.95
        c.eval.samples = 8  # EDEN paper reports Pass@8 (Pass@256 on AIME: raise it)
        c.eval.max_new_tokens = 3072  # as training
    c.exploration.scale = arg
    return c


def get_sweep(hyper):
    return hyper.product([hyper.sweep("config.seed", [0, 1])])
