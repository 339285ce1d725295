"""The controls (configs/controls.py): each changes what it says, and each one's smoke
config trains end to end."""

import pytest

from configs import controls, grpo
from explore_rl import config as config_lib
from explore_rl import testing
from explore_rl.logs import read_metrics
from explore_rl.train import loop, steps
from explore_rl.train.build import Progress


def _flat(c, prefix=""):
    out = {}
    for k, v in c.items():
        if hasattr(v, "items"):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[prefix + k] = v
    return out


EXPECTED = {
    "temperature": {"rollout.temperature": 1.2},
    "entropy": {"rl.entropy_coef": 0.01},
    "clip_higher": {"rl.eps_high": 0.4},
    "group": {"rollout.group_size": 16},  # demo: already one group per micro-batch
    "dapo": {"rollout.dynamic_sampling": True},
    "dr_grpo": {"rl.advantage": "dr_grpo", "rl.aggregation": "seq_mean_token_sum_norm"},
    "gspo": {"rl.policy": "gspo", "rl.aggregation": "seq_mean_token_mean"},
}


def test_each_control_changes_only_its_values():
    assert set(EXPECTED) == set(controls.CONTROLS)
    base = _flat(grpo.get_config("demo"))
    for name, expected in EXPECTED.items():
        changed = _flat(controls.get_config(name))
        diff = {k: v for k, v in changed.items() if base[k] != v}
        assert diff == expected, name
    with pytest.raises(ValueError, match="controls.py:colder: give .* variants"):
        controls.get_config("colder")
    with pytest.raises(ValueError, match="controls.py:smoke: name one of"):
        controls.get_config("smoke")
    assert controls.get_config("smoke,gspo").rl.policy == "gspo"  # either order


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_smoke_configs_train(name, tmp_path):
    c = controls.get_config(f"{name},smoke")
    c.train.steps, c.train.eval_every = 2, 0
    c.lock()
    loop.train(config_lib.spec(c), str(tmp_path))
    rows = read_metrics(str(tmp_path))
    assert [r["step"] for r in rows] == [1, 2]
    assert all(r["train/skipped_updates"] == 0 for r in rows)


@pytest.mark.slow
def test_a_control_trains_and_records_its_config(tmp_path):
    c = controls.get_config("gspo,smoke")
    c.train.eval_every = 0
    loop.train(config_lib.spec(c), str(tmp_path))
    assert [r["step"] for r in read_metrics(str(tmp_path))] == [1, 2, 3]
    assert '"policy": "gspo"' in (tmp_path / "config.json").read_text()


@pytest.mark.slow
@pytest.mark.optimized
def test_the_clip_controls_bind_in_the_demo_setting(tmp_path):
    """Several optimizer steps per rollout batch (rl.minibatches = 4): pi_theta leaves
    pi_old within the batch, so the ratio clip acts and clip-higher and GSPO update
    differently from GRPO on the same batch. At the demo's first step no positive-advantage
    token's ratio passes 1.28 (1.12 at most); which later batch first has one between 1.2
    and 1.28 depends on the CPU's kernels (the second step's with AVX2, the third's with
    AVX-512: their rollouts differ), so the first of steps 2-4 that has one is compared."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from explore_rl.rewards.math import Verifier

    c = grpo.get_config("demo")
    c.reward.workers = 1

    def update(name, run, state, batch, lengths):
        cc = grpo.get_config("demo") if name == "grpo" else controls.get_config(name)
        state = jax.tree.map(jnp.copy, state)  # update donates its state
        return steps.update(state, batch, run.cfg, config_lib.spec(cc), run.optimizer, lengths)

    with Verifier(1, 5.0) as verifier:
        run, progress, _ = testing.start(c, str(tmp_path), verifier)
        progress, first, _ = steps.train_one_step(run, progress, 0)
        for step in (1, 2, 3):
            ro, position, _ = steps.collect(run, progress, step)
            batch, explorers, _ = steps.make_batch(run, progress, ro, step)
            args = (run, progress.state, batch, steps.response_lengths(ro))
            states, metrics = {}, {}
            for name in ("grpo", "clip_higher"):
                states[name], metrics[name] = update(name, *args)
            high = {n: m["policy/clip_frac_high"] for n, m in metrics.items()}
            if high["clip_higher"] < high["grpo"]:
                states["gspo"], metrics["gspo"] = update("gspo", *args)  # on this batch only
                break
            # GRPO's update of this batch is the step `train_one_step` takes: go on from it
            # (not a second rollout and update of the same step)
            progress = Progress(states["grpo"], jnp.asarray(position, jnp.int32), explorers)
        params = {name: s.params for name, s in states.items()}

    def differ(a, b):
        return any(not np.array_equal(x, y) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))

    assert first["policy/clip_frac_low"] > 0  # the first step already clips below 1 - 0.2
    assert (
        metrics["grpo"]["policy/clip_frac_high"] > 0 and metrics["grpo"]["policy/clip_frac_low"] > 0
    )
    assert (
        metrics["clip_higher"]["policy/clip_frac_high"] < metrics["grpo"]["policy/clip_frac_high"]
    )
    assert metrics["gspo"]["policy/clip_frac_high"] + metrics["gspo"]["policy/clip_frac_low"] > 0
    assert differ(params["grpo"], params["clip_higher"])
    assert differ(params["grpo"], params["gspo"])
