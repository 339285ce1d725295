"""The Explorer interface: explorers written here plug in without touching core modules,
compose in order, keep their state through checkpoints, and conflicting ones are refused."""

import dataclasses
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import subprocess_env

from configs import grpo
from explore_rl import config as config_lib
from explore_rl.exploration import base
from explore_rl.hoststate import HostState
from explore_rl.logs import read_metrics
from explore_rl.models.transformer import Interventions
from explore_rl.rl.plan import RolloutPlan, base_plan
from explore_rl.train import loop


@base.register("test_noop")
class Noop(base.Explorer):
    """Changes nothing: a run with it must equal a run without it."""


@base.register("test_toy")
class Toy(base.Explorer):
    """Cools the second half of every group to `tau`, halves those rows' loss weight,
    and counts the steps and rows it has shaped (its checkpointed state), and how often it
    saw each problem (host-side state keyed by the problems' stable ids)."""

    @dataclasses.dataclass(frozen=True)
    class Spec:
        tau: float = 0.5  # the cooled rows' temperature factor
        weight: float = 0.5  # their loss weight

    def init(self, ctx):
        return {
            "steps": jnp.zeros((), jnp.int32),
            "rows": jnp.zeros((), jnp.int32),
            "seen": HostState({}),
        }

    def plan(self, state, plan, ctx, rng):
        g = ctx.spec.rollout.group_size
        cool = (jnp.arange(plan.temperature.shape[0]) % g) >= g // 2
        tau = jnp.where(cool[:, None], self.settings.tau * plan.temperature, plan.temperature)
        return plan.replace(temperature=tau, info={**plan.info, self.name: {"cool": cool}})

    def shape_advantages(self, state, rollouts, advantages, weights, ctx):
        cool = np.asarray(rollouts.plan.info[self.name]["cool"])
        weights = np.where(cool, self.settings.weight * weights, weights)
        seen = dict(state["seen"].data)
        for p in rollouts.problems:
            seen[p.id] = seen.get(p.id, 0) + 1
        state = {
            "steps": state["steps"] + 1,
            "rows": state["rows"] + int(cool.sum()),
            "seen": HostState(seen),
        }
        return base.Shaped(advantages, weights, state, {"cool_frac": float(cool.mean())})


@base.register("test_bonus")
class Bonus(base.Explorer):
    """An intrinsic reward before the advantage estimator: +1 for each group's first row."""

    def rewards(self, state, rollouts, rewards, ctx):
        bonus = np.zeros_like(rewards)
        bonus[:, 0] = 1.0
        return rewards + bonus


@base.register("test_anchor_a")
class AnchorA(base.Explorer):
    intervenes = ("extra_embeds",)


@base.register("test_anchor_b")
class AnchorB(base.Explorer):
    intervenes = ("extra_embeds",)


def _config(methods, steps=2):
    c = grpo.get_config("smoke")
    c.exploration.methods = methods
    c.train.steps, c.train.checkpoint_every, c.train.eval_every = steps, 1, 0
    return c


@pytest.mark.slow
def test_noop_explorer_changes_nothing(tmp_path):
    plain = loop.train(config_lib.spec(_config(())), str(tmp_path / "plain"))
    noop = loop.train(config_lib.spec(_config(("test_noop",))), str(tmp_path / "noop"))
    drop = ("time/", "perf/")
    # exact: a no-op explorer leaves the same programs on the same shapes
    for a, b in zip(read_metrics(str(tmp_path / "plain")), read_metrics(str(tmp_path / "noop"))):
        assert {k: v for k, v in a.items() if not k.startswith(drop)} == {
            k: v for k, v in b.items() if not k.startswith(drop)
        }
    for x, y in zip(jax.tree.leaves(plain.state), jax.tree.leaves(noop.state)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


@pytest.mark.slow
def test_toy_explorer_plans_shapes_and_resumes(tmp_path):
    c = _config(("test_toy",), steps=3)
    c.rollout.max_new_tokens = 8
    straight = loop.train(config_lib.spec(c), str(tmp_path / "a"))
    assert int(straight.explorers["test_toy"]["steps"]) == 3
    assert int(straight.explorers["test_toy"]["rows"]) == 3 * 2 * 2  # half of 2 x 4 rows
    rows = read_metrics(str(tmp_path / "a"))
    # half the rows at 0.5: the mean temperature over response tokens is between 0.5 and 1
    assert all(0.5 < r["rollout/temperature"] < 1.0 for r in rows)
    assert all(r["test_toy/cool_frac"] == 0.5 for r in rows)
    assert all(r["time/pi_old_s"] > 0 for r in rows)  # mu is not pi_old: recomputed
    short = _config(("test_toy",), steps=2)
    short.rollout.max_new_tokens = 8
    loop.train(config_lib.spec(short), str(tmp_path / "b"))
    resumed = loop.train(config_lib.spec(c), str(tmp_path / "b"))
    # exact: a resume runs the same programs on the same shapes and restored state
    for x, y in zip(jax.tree.leaves(straight), jax.tree.leaves(resumed)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    seen = straight.explorers["test_toy"]["seen"].data
    assert sum(seen.values()) == 3 * 2  # 3 steps x 2 problems
    assert resumed.explorers["test_toy"]["seen"].data == seen  # restored from step 2's JSON


def test_plans_compose_in_order():
    c = _config(("ead", "test_toy"))
    c.exploration.ead = base.get("ead").defaults()  # its own section: no TIS asked for
    c.rollout.temperature = 1.0
    with pytest.warns(UserWarning, match="EAD without TIS"):
        spec = config_lib.spec(c)
    explorers = base.build(spec)
    ctx = base.StepContext(None, None, None, spec, step=0)
    states = {"ead": {}, "test_toy": None}
    p = base.plan(explorers, states, base_plan(8, 16, 1.0, []), ctx, jax.random.key(0))
    ead = np.asarray(explorers[0].table(16, 0))
    tau = np.asarray(p.temperature)
    np.testing.assert_allclose(tau[0], ead, rtol=1e-6)  # a hot row: EAD's table
    np.testing.assert_allclose(tau[2], 0.5 * ead, rtol=1e-6)  # a cooled row: the product


@pytest.mark.slow
def test_config_errors_name_the_problem():
    with pytest.raises(ValueError, match="exploration.methods='nope': known"):
        config_lib.spec(_config(("nope",)))
    # in a process that has imported no method yet (the registry is filled on import)
    out = subprocess.run(
        [sys.executable, "-c", "from explore_rl.exploration import base; base.get('nope')"],
        env=subprocess_env(), capture_output=True, text=True,
    )  # fmt: skip
    last = out.stderr.strip().splitlines()[-1]
    assert all(repr(m) in last for m in ("ase", "ead", "eden", "extra")), last
    with pytest.raises(ValueError, match="'test_anchor_a' and 'test_anchor_b' both set extra"):
        config_lib.spec(_config(("test_anchor_a", "test_anchor_b")))
    c = _config(("ead",))
    c.exploration.ead = base.get("ead").defaults()
    c.exploration.ead.convention = "book"
    with pytest.raises(ValueError, match="convention='book'"):
        config_lib.spec(c)


def test_plan_rows_of_one_group():
    p = RolloutPlan(
        jnp.arange(12.0).reshape(6, 2),
        Interventions(steer=jnp.arange(6.0)[:, None]),
        {"x": {"row": np.arange(6), "group": np.arange(3) * 10}},
    )
    one = p.rows(1, 2)
    np.testing.assert_array_equal(one.temperature, [[4, 5], [6, 7]])
    np.testing.assert_array_equal(one.interventions.steer[:, 0], [2, 3])
    np.testing.assert_array_equal(one.info["x"]["row"], [2, 3])
    np.testing.assert_array_equal(one.info["x"]["group"], [10])
    with pytest.raises(ValueError, match="per row"):
        RolloutPlan(jnp.ones((6, 2)), info={"bad": np.ones(4)}).rows(0, 2)


@pytest.mark.slow
def test_a_reward_hook_acts_before_the_advantage_estimator(tmp_path):
    # the smoke model never answers correctly: without the bonus no group carries signal
    plain = loop.train(config_lib.spec(_config((), steps=1)), str(tmp_path / "plain"))
    bonus = loop.train(config_lib.spec(_config(("test_bonus",), steps=1)), str(tmp_path / "bonus"))
    (p,) = read_metrics(str(tmp_path / "plain"))
    (b,) = read_metrics(str(tmp_path / "bonus"))
    assert p["reward/mean"] == b["reward/mean"] == 0.0  # logged rewards are the verifier's
    assert p["train/grad_norm"] == 0.0 and b["train/grad_norm"] > 0.0
    moved = [
        not np.array_equal(np.asarray(x), np.asarray(y))
        for x, y in zip(jax.tree.leaves(plain.state.params), jax.tree.leaves(bonus.state.params))
    ]
    assert any(moved)


def test_a_method_defined_outside_the_package_is_named_module_colon_class():
    """`exploration.methods=("test_exploration:Toy",)`: a module of the user's own, its
    class registered there under its own name, which names its config section."""
    c = _config(("test_exploration:Toy",))
    c.exploration.test_toy = Toy.defaults()
    c.exploration.test_toy.tau = 0.25
    (toy,) = base.build(config_lib.spec(c))
    assert isinstance(toy, Toy) and toy.settings == Toy.Spec(tau=0.25)
    assert config_lib.resolved(c).exploration.test_toy.tau == 0.25
    for name, words in [
        ("no_such_module_xyz:Toy", "cannot import no_such_module_xyz"),
        ("test_exploration:Missing", "test_exploration has no 'Missing'"),
        ("test_exploration:_config", "not an Explorer subclass decorated with @register"),
    ]:
        with pytest.raises(ValueError, match=f"^config: exploration.methods.*{words}"):
            config_lib.spec(_config((name,)))
