"""The controls (configs/controls.py): each changes what it says, and each one's smoke
config trains end to end."""

import pytest

from configs import controls, grpo
from explore_rl.logs import read_metrics
from explore_rl.rl import trainer


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
    trainer.train(c, str(tmp_path))
    rows = read_metrics(str(tmp_path))
    assert [r["step"] for r in rows] == [1, 2]
    assert all(r["train/skipped_updates"] == 0 for r in rows)


@pytest.mark.slow
def test_a_control_trains_and_records_its_config(tmp_path):
    c = controls.get_config("gspo,smoke")
    c.train.eval_every = 0
    trainer.train(c, str(tmp_path))
    assert [r["step"] for r in read_metrics(str(tmp_path))] == [1, 2, 3]
    assert '"policy": "gspo"' in (tmp_path / "config.json").read_text()
