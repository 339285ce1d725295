"""The exploration lab: a tiny model trained from scratch on a synthetic task where
exploration matters, on a CPU. `sft` fine-tunes the random lab model on the task's
canonical solutions (one strategy of several: data/countdown.py); the RL settings train
the result further with GRPO, from its export:

    python -m explore_rl.main --mode sft --config configs/lab.py:sft,smoke --workdir runs/lab-sft
    python -m explore_rl.main --mode export --config configs/lab.py:sft,smoke \\
        --config.eval.checkpoint=runs/lab-sft --workdir runs/lab-base
    python -m explore_rl.main --config configs/lab.py:smoke --workdir runs/lab-rl \\
        --config.model.path=runs/lab-base

The task is Countdown, 4 numbers in [1, 20], targets in [10, 100]
(`--config.task.name=multistep --config.reward.name=multistep`: multi-step arithmetic).
smoke runs in seconds; demo is the lab's starting point, its difficulty and lengths not
yet measured against the regime the lab aims at (Pass@1 0.1-0.4, Pass@64 at least twice
that, after SFT).
"""

from configs import base
from explore_rl.data import lab, tasks


def get_config(arg: str | None = None):
    variant, scale = base.parse_arg(arg, "lab.py", variants=("sft",))
    if scale not in ("smoke", "demo", "lab"):  # lab: demo (configs/<method>.py:lab are it)
        raise ValueError(f"configs/lab.py:{arg}: the lab's scales are smoke and demo")
    c = base.get_config()
    c.model.path, c.model.random_init = lab.FOLDER, "lab-1m"  # random weights: SFT's start
    # the fixed splits: data/countdown/ (data/lab.py writes them); task.name=countdown draws
    # problems of other difficulties (task.countdown.*) in code instead
    c.task.name, c.task.preset, c.reward.name = "jsonl", "countdown", "countdown"
    c.task.countdown = tasks.defaults("countdown")
    c.task.multistep = tasks.defaults("multistep")
    c.task.instruction, c.task.raw_prompt = "", "{question}\n"  # no chat: the lab's vocabulary
    # questions of at most 19 tokens; canonical solutions of at most 32 with EOS (SFT's)
    c.rollout.max_prompt_len, c.rollout.max_new_tokens = 24, 64
    c.rollout.prompts, c.rollout.group_size = 16, 8
    c.eval.samples, c.eval.temperature, c.eval.top_p = 8, 1.0, 1.0
    c.eval.max_new_tokens, c.eval.batch_prompts = 64, 64
    c.reward.workers = 1
    c.train.checkpoint_every, c.train.samples_to_log = 100, 2
    if variant == "sft":
        c.sft.batch_size, c.rollout.max_new_tokens = 64, 32
        c.optim.lr, c.optim.warmup_steps, c.optim.weight_decay = 3e-3, 20, 0.0
        c.train.steps, c.train.eval_every = 2000, 500
    else:
        # the base model: the sft variant's run on this run's task, once per machine
        c.model.base = f"configs/lab.py:sft,{'smoke' if scale == 'smoke' else 'demo'}"
        c.optim.lr = 1e-5
        c.train.steps, c.train.eval_every = 300, 50
    # task.name=countdown: as many problems as the files hold
    c.task.train_size, c.task.test_size = lab.SPLIT_SIZES["train"], lab.SPLIT_SIZES["test"]
    if scale == "smoke":
        c.eval.num_prompts = 16
        c.sft.batch_size, c.rollout.prompts, c.rollout.group_size = 8, 2, 4
        c.rollout.max_new_tokens = c.eval.max_new_tokens = 24
        c.eval.samples, c.eval.batch_prompts = 2, 16
        c.train.steps, c.train.eval_every, c.train.checkpoint_every = 2, 2, 2
    return c


def get_sweep(hyper):
    return hyper.product([hyper.sweep("config.seed", [0, 1, 2, 3, 4])])
