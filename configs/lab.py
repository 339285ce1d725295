"""The exploration lab: a tiny model trained from scratch on a synthetic task where
exploration matters, on a CPU. `sft` fine-tunes the random lab model on the task's
canonical solutions (one strategy of several: data/countdown.py); the RL settings train
its result further with GRPO (`model.base`: built on the first run, then read from the
cache), and every method's `lab` scale is these settings with the method on:

    python -m explore_rl.main --config configs/lab.py:demo --workdir runs/lab-grpo
    python -m explore_rl.main --config configs/ead.py:lab --workdir runs/lab-ead
    python -m explore_rl.main --mode sft --config configs/lab.py:sft,demo \
        --workdir runs/lab-sft                       # the base model's own run, by hand

The task is Countdown, 3 numbers in [1, 20], targets in [10, 100], its problems the files
in data/countdown/ (`--config.task.name=countdown --config.task.countdown.inputs=4`: drawn
in code at another difficulty; `--config.task.name=multistep --config.reward.name=multistep`:
multi-step arithmetic). At this difficulty the base model (1000 SFT steps, cosine to 0)
solves about a sixth of the test problems at Pass@1 and most at Pass@64, and about 40% of
GRPO's groups of 8 have no signal (BENCHMARKS.md, `python -m explore_rl.bench lab`). smoke
runs in seconds.

lab2 is lab v2 (docs/lab.md, "Lab v2"), where study 1 found the methods had no room:
4-number problems drawn in code (3 lines a response), SFT data with a tenth of its
solutions by the strategies the chains leave out (`task.countdown.other_share`), a
vocabulary with ten neutral tokens (data/lab2/) one of which SFT puts after the prompt of
a tenth of its examples (`sft.neutral_share`: EDEN's anchors), and RL drawing from 640
training problems (`rollout.pool`), so each recurs 7.5 times in 300 steps:

    python -m explore_rl.main --config configs/extra.py:lab2 --workdir runs/lab2-extra
"""

from configs import base
from explore_rl.data import lab, tasks


def get_config(arg: str | None = None):
    # lab: demo (configs/<method>.py:lab are it); lab2: lab v2 (configs/<method>.py:lab2)
    variant, scale = base.parse_arg(
        arg, "lab.py", ("sft",), scales=("smoke", "demo", "lab", "lab2")
    )
    c = base.get_config()
    c.model.path, c.model.random_init = lab.FOLDER, "lab-1m"  # random weights: SFT's start
    # the fixed splits: data/countdown/ (data/lab.py writes them); task.name=countdown draws
    # problems of other difficulties (task.countdown.*) in code instead
    c.task.name, c.task.preset, c.reward.name = "jsonl", "countdown", "countdown"
    c.task.countdown = tasks.defaults("countdown")
    c.task.multistep = tasks.defaults("multistep")
    c.task.instruction, c.task.raw_prompt = "", "{question}\n"  # no chat: the lab's vocabulary
    # questions of at most 16 tokens; canonical solutions of at most 21 with EOS (SFT's)
    c.rollout.max_prompt_len, c.rollout.max_new_tokens = 24, 64
    c.rollout.prompts, c.rollout.group_size = 16, 8
    c.eval.samples, c.eval.temperature, c.eval.top_p = 8, 1.0, 1.0
    c.eval.max_new_tokens, c.eval.batch_prompts = 64, 64
    c.reward.workers = 1
    c.train.checkpoint_every, c.train.samples_to_log = 100, 2
    if variant == "sft":
        c.sft.batch_size, c.rollout.max_new_tokens = 64, 32
        c.optim.lr, c.optim.warmup_steps, c.optim.weight_decay = 3e-3, 20, 0.0
        c.train.steps, c.train.eval_every = 1000, 500
        c.optim.decay_steps = c.train.steps - c.optim.warmup_steps  # to 0 at the end
    else:
        # the base model: the sft variant's run on this run's task, once per machine
        c.model.base = "configs/lab.py:sft,demo"
        c.rl.minibatches = 4  # 4 optimizer steps a batch, as every scale (configs/grpo.py)
        # each minibatch's rows cut to its longest response (a budget all 4 groups fit)
        c.optim.micro_batch_tokens = 4 * (32 + c.rollout.group_size * c.rollout.max_new_tokens)
        c.optim.lr = 3e-5  # 1e-4 and above: the reward falls (a pilot: BENCHMARKS.md)
        c.train.steps, c.train.eval_every, c.train.eval_before = 300, 50, True
        c.exploration.scale = "lab"  # a method composed here takes its lab settings
    # task.name=countdown: as many problems as the files hold
    c.task.train_size, c.task.test_size = lab.SPLIT_SIZES["train"], lab.SPLIT_SIZES["test"]
    if scale == "lab2":
        v2(c, sft=variant == "sft")
    return smoke(c) if scale == "smoke" else c


def v2(c, sft: bool):
    """Lab v2's settings on a lab config (docs/lab.md, "Lab v2", says why each)."""
    # 4 numbers: 3 lines a response, so ExTra's prefixes have 2 cuts (study 1's ExTra arms'
    # task, drawn in code: as many training and test problems as the files' split)
    c.task.name = "countdown"
    c.task.countdown.inputs = 4
    # a tenth of SFT's solutions by division or two separate pairs: a prior on the
    # strategies the test's "other" problems need (3% left the base at Pass@64 0 on them)
    c.task.countdown.other_share = 0.10
    # the lab's characters and ten neutral ones (data/lab.py), study 1's folder untouched
    c.model.path = lab.V2_FOLDER
    if sft:
        # a tenth of SFT's examples carry one neutral token where EDEN appends its anchor
        # (after the prompt), so the base reads past one as a pretrained model reads a word
        c.sft.neutral_share, c.sft.neutral_tokens = 0.10, ",".join(lab.NEUTRAL)
        # the lab's 1000 steps left the 4-number base at held-out Pass@1 0.021, its loss
        # still falling (0.27 at step 700, 0.18 at 1000): twice as long, cosine to 0 as there
        c.train.steps, c.train.eval_every = 2000, 1000
        c.optim.decay_steps = c.train.steps - c.optim.warmup_steps
    else:
        c.model.base = "configs/lab.py:sft,lab2"
        # 300 steps x 16 prompts draw each of 640 problems 7.5 times, as ExTra's paper
        # drew each of MATH-DAPO's 17k problems (128k prompts: 512 x 250): its memories act
        c.rollout.pool = 640
        c.exploration.scale = "lab2"


def smoke(c):
    """A lab config at the smoke sizes (seconds): also a method's `lab` config made quick
    (`smoke(config.load("configs/ead.py:lab"))`, notebooks/06_lab.ipynb)."""
    c.model.base = c.model.base and "configs/lab.py:sft,smoke"
    c.eval.num_prompts = 16
    c.sft.batch_size, c.rollout.prompts, c.rollout.group_size = 8, 2, 4
    c.rl.minibatches = min(c.rl.minibatches, c.rollout.prompts)  # a step a group, at most
    c.rollout.max_new_tokens = c.eval.max_new_tokens = 24
    c.eval.samples, c.eval.batch_prompts = 2, 16
    c.train.steps, c.train.eval_every, c.train.checkpoint_every = 2, 2, 2
    return c


def get_sweep(hyper):
    return hyper.product([hyper.sweep("config.seed", [0, 1, 2, 3, 4])])
