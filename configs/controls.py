"""The controls every exploration method is compared against (docs/methods.md):
configs/grpo.py with one value changed, at the same scale and seeds.

    python -m explore_rl.main --config configs/controls.py:temperature --workdir runs/t12
    python -m explore_rl.main --config configs/controls.py:entropy,smoke --workdir runs/x

The argument is `<control>[,<scale>]` (`base.parse_arg`), scale one of smoke | demo
(default) | paper.
"""

from configs import base, grpo


def _temperature(c):  # EDEN's "Higher Temperature (T=1.2)"
    # rl.score_temperature stays "rollout": pi_old and pi_theta at T = 1.2, on-policy, as
    # in verl (the papers' framework). "1.0" + rl.tis_cap = the other reading.
    c.rollout.temperature = 1.2


def _entropy(c):  # a larger entropy bonus: 10x EDEN's default alpha = 0.001 (ours)
    c.rl.entropy_coef = 0.01


def _clip_higher(c):  # grpo.py already has DAPO's 0.28; the control widens it (value ours)
    c.rl.eps_high = 0.4


def _group(c):  # twice the rollouts per prompt, same prompts per step
    c.rollout.group_size *= 2
    # twice the rows per micro-batch is twice the memory: split further where groups allow
    # (a token budget, optim.micro_batch_tokens, already counts the rows)
    if not c.optim.micro_batch_tokens:
        per_minibatch = c.rollout.prompts // c.rl.minibatches
        c.optim.micro_batches = min(2 * c.optim.micro_batches, per_minibatch)


def _dapo(c):  # dynamic sampling: refill until 0 < correct < G (Yu et al. 2025)
    c.rollout.dynamic_sampling = True


def _dr_grpo(c):  # no std division, constant normaliser (Liu et al. 2025)
    c.rl.advantage, c.rl.aggregation = "dr_grpo", "seq_mean_token_sum_norm"


def _gspo(c):  # sequence-level ratio (Zheng et al. 2025)
    c.rl.policy, c.rl.aggregation = "gspo", "seq_mean_token_mean"


CONTROLS = {
    "temperature": _temperature,
    "entropy": _entropy,
    "clip_higher": _clip_higher,
    "group": _group,
    "dapo": _dapo,
    "dr_grpo": _dr_grpo,
    "gspo": _gspo,
}


def get_config(arg: str | None = None):
    control, scale = base.parse_arg(arg, "controls.py", CONTROLS, require_variant=True)
    c = grpo.get_config(scale)
    CONTROLS[control](c)
    return c


def get_sweep(hyper):
    return hyper.product([hyper.sweep("config.seed", [0, 1])])
