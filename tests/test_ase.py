"""ASE: routing, the bank estimate (PCA, K-means, Hungarian, EMA), steering, the replayed
readout, TIS against the steered mu, smoke runs of every ablation, resume, composition."""

import dataclasses
import json
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import G, Q, T, assert_float32_close, forward, logit_scale, run_main, score

from configs import ase as ase_config
from explore_rl import config as config_lib
from explore_rl import testing
from explore_rl.data.tasks import Problem
from explore_rl.exploration import ase, base
from explore_rl.logs import read_metrics
from explore_rl.models import transformer
from explore_rl.rl import losses, rollout
from explore_rl.rl.plan import base_plan
from explore_rl.sampling.sampler import SamplingConfig, sample
from explore_rl.train import loop

pytestmark = [pytest.mark.usefixtures("highest_precision"), pytest.mark.numerics]


def _explorer(**overrides):
    c = ase_config.get_config("smoke")
    c.exploration.ase.update(overrides)
    (ex,) = base.build(config_lib.spec(c))
    return ex, c


def _banked_state(ex, cfg, rng=0):
    """A state holding a bank of K random directions (as after one update)."""
    state = ex.template(types.SimpleNamespace(cfg=cfg))
    u = jax.random.normal(jax.random.key(rng), state["u"].shape)
    return {**state, "u": u, "updates": jnp.ones((), jnp.int32)}


def _problems(n):
    return [Problem(f"q{i}", str(i)) for i in range(n)]


# ----------------------------------------------------------------------------- routing


def test_routes_spread_evenly_with_a_clean_route():
    np.testing.assert_array_equal(ase.routes(8, 3), [0, 0, 1, 1, 2, 2, 3, 3])
    assert np.bincount(ase.routes(6, 3)).tolist() == [2, 1, 2, 1]  # as even as possible
    assert np.bincount(ase.routes(16, 3)).tolist() == [4, 4, 4, 4]


def test_an_empty_bank_plans_every_row_clean_and_a_bank_steers_by_route(tiny):  # noqa: F811
    _, cfg, _, _ = tiny
    ex, c = _explorer(alpha=0.7)
    plan = base_plan(Q * G, T, 1.0, _problems(Q))
    empty = ex.plan(ex.template(types.SimpleNamespace(cfg=cfg)), plan, None, jax.random.key(0))
    assert empty.interventions is None and empty.route is None
    state = _banked_state(ex, cfg)
    p = ex.plan(state, plan, None, jax.random.key(0))
    route = np.tile(ase.routes(G, 3), Q)
    np.testing.assert_array_equal(p.route, route)
    v = np.asarray(ase.unit(state["u"]))
    expected = np.concatenate([np.zeros((1, v.shape[1])), v])[route] * 0.7
    np.testing.assert_allclose(np.asarray(p.interventions.steer), expected, rtol=1e-6)
    assert p.interventions.steer_layer == 0
    assert ex.eval_plan(state, plan, None) is plan  # evaluation: the plain policy
    at_eval, _ = _explorer(alpha=0.7, at_eval=True)  # inference-time steering: as training
    steered = at_eval.eval_plan(state, plan, None)
    np.testing.assert_array_equal(steered.route, route)
    np.testing.assert_allclose(np.asarray(steered.interventions.steer), expected, rtol=1e-6)


# ----------------------------------------------------------------------------- the bank


def _planted(rng, directions, m, scale=3.0):
    """m pairs: h- random content, h+ = h- + scale x one planted direction + noise."""
    d = directions.shape[1]
    labels = rng.integers(0, len(directions), m)
    neg = rng.standard_normal((m, d))
    pos = neg + scale * directions[labels] + 0.1 * rng.standard_normal((m, d))
    return pos.astype(np.float32), neg.astype(np.float32)


def test_the_bank_recovers_planted_directions_and_keeps_each_index_on_its_own():
    rng = np.random.default_rng(0)
    directions = np.linalg.qr(rng.standard_normal((32, 3)))[0].T  # 3 orthonormal in R^32
    e = ase.ASE.Spec(k=3, d_pca=16, kmeans_init=4)
    cands, labels = ase.estimate(*_planted(rng, directions, 150), e, rng)
    u, slot_of = ase.smooth(np.zeros_like(cands), cands, 0.5, first=True, match=True)
    cos = ase.unit(u) @ directions.T  # [slot, planted]
    assert (cos.max(axis=1) > 0.95).all()  # every slot is one planted direction
    owner = cos.argmax(axis=1)
    assert sorted(owner) == [0, 1, 2]
    # the same clusters again, planted in permuted order: each slot stays on its direction
    again, _ = ase.estimate(*_planted(rng, directions[[2, 0, 1]], 150), e, rng)
    u2, _ = ase.smooth(u, again, 0.5, first=False, match=True)
    np.testing.assert_array_equal((ase.unit(u2) @ directions.T).argmax(axis=1), owner)
    assert ((ase.unit(u2) @ directions.T).max(axis=1) > 0.95).all()
    # shares: each planted cluster holds about a third of the pairs
    assert np.allclose(np.bincount(labels) / 150, 1 / 3, atol=0.1)  # proportions: absolute


def test_an_empty_cluster_gives_a_finite_direction():
    e = ase.ASE.Spec(k=3, d_pca=4, kmeans_init=1)
    neg = np.tile(np.random.default_rng(0).standard_normal((1, 6)), (8, 1)).astype(np.float32)
    pos = neg + np.float32(1.0)  # 8 copies of one pair: K-means finds 1 cluster of 3
    cands, labels = ase.estimate(pos, neg, e, np.random.default_rng(0))
    assert len(np.unique(labels)) < 3 and np.isfinite(cands).all()
    np.testing.assert_allclose(cands, np.ones((3, 6)), rtol=1e-5)


def test_hungarian_ema_and_normalisation_by_hand():
    prev = np.array([[1.0, 0.0], [0.0, 2.0]])
    cands = np.array([[0.0, 4.0], [2.0, 0.0]])  # the same directions, swapped
    u, slot_of = ase.smooth(prev, cands, 0.5, first=False, match=True)
    np.testing.assert_array_equal(slot_of, [1, 0])
    np.testing.assert_allclose(u, [[1.5, 0.0], [0.0, 3.0]])  # 0.5 old + 0.5 matched
    np.testing.assert_allclose(ase.unit(u), [[1.0, 0.0], [0.0, 1.0]])
    unmatched, _ = ase.smooth(prev, cands, 0.5, first=False, match=False)  # the ablation
    np.testing.assert_allclose(unmatched, [[0.5, 2.0], [1.0, 1.0]])
    first, slot_of = ase.smooth(np.zeros((2, 2)), cands, 0.5, first=True, match=True)
    np.testing.assert_array_equal(first, cands)  # the first update takes them as they are
    no_ema, _ = ase.smooth(prev, cands, 0.0, first=False, match=True)
    np.testing.assert_allclose(no_ema, cands[[1, 0]])


def test_the_direction_ablations():
    rng = np.random.default_rng(1)
    directions = np.eye(3, 16)
    pos, neg = _planted(rng, directions, 60)
    e = ase.ASE.Spec(k=3, d_pca=8, kmeans_init=2)
    plain, labels = ase.estimate(pos, neg, e, np.random.default_rng(5))
    e = dataclasses.replace(e, directions="reversed")
    reversed_, _ = ase.estimate(pos, neg, e, np.random.default_rng(5))
    np.testing.assert_allclose(reversed_, -plain, rtol=1e-6)
    e = dataclasses.replace(e, directions="random")
    random_, _ = ase.estimate(pos, neg, e, np.random.default_rng(5))
    np.testing.assert_allclose(
        np.linalg.norm(random_, axis=1), np.linalg.norm(plain, axis=1), rtol=1e-5
    )  # norm-matched
    assert np.abs(ase.unit(random_) @ directions.T).max() < 0.8  # not the planted ones
    # shuffled labels: every pair differs by the same +d; a random half of them swapped
    # reads as -d, so clusters form on both signs, about half the pairs on -d
    d = np.eye(1, 16)[0]
    neg = rng.standard_normal((60, 16)).astype(np.float32)
    pos = (neg + 3 * d + 0.1 * rng.standard_normal((60, 16))).astype(np.float32)
    e = dataclasses.replace(e, directions="contrast")
    plain, _ = ase.estimate(pos, neg, e, np.random.default_rng(2))
    assert (ase.unit(plain) @ d > 0.99).all()
    e = dataclasses.replace(e, directions="shuffled")
    shuffled, labels = ase.estimate(pos, neg, e, np.random.default_rng(2))
    cos = ase.unit(shuffled) @ d
    assert (np.abs(cos) > 0.99).all() and (cos > 0).any() and (cos < 0).any()
    assert 0.25 < np.isin(labels, np.flatnonzero(cos < 0)).mean() < 0.75


def test_pairing_and_the_buffer():
    correct = np.array([[1, 0, 0, 0], [1, 1, 1, 1], [1, 1, 0, 1]], bool)
    pairs = ase.pair_rollouts(correct, np.random.default_rng(0))
    assert len(pairs) == 1 + 1  # min(|P|, |N|) per mixed group; none from the solved one
    assert all(correct.reshape(-1)[p] and not correct.reshape(-1)[n] for p, n in pairs)
    # group 0: its one correct row with one of its three incorrect ones; group 2: its one
    # incorrect row with one of its three correct ones; the partner drawn at random
    assert pairs[0][0] == 0 and pairs[0][1] in (1, 2, 3)
    assert pairs[1][0] in (8, 9, 11) and pairs[1][1] == 10
    partners = {int(ase.pair_rollouts(correct, np.random.default_rng(s))[0][1]) for s in range(40)}
    assert partners == {1, 2, 3}
    state = {"pos": np.zeros((3, 2)), "neg": np.zeros((3, 2)), "count": np.int32(0)}
    state.update(ase.append(state, np.ones((2, 2)), -np.ones((2, 2))))
    state.update(ase.append(state, 2 * np.ones((2, 2)), -2 * np.ones((2, 2))))
    assert int(state["count"]) == 3  # capacity 3: the oldest pair left
    np.testing.assert_array_equal(np.asarray(state["pos"])[:, 0], [1, 2, 2])


# ----------------------------------------------------------------------------- steering


def test_a_steered_block_output_moves_by_exactly_alpha_v(tiny):  # noqa: F811
    params, cfg, prompts, pmask = tiny
    v = np.asarray(ase.unit(jax.random.normal(jax.random.key(2), (Q, cfg.d_model))))
    pos = transformer.positions_from_mask(pmask)
    for layer in (0, 1):
        iv = transformer.Interventions(readout_layer=layer)
        clean = forward(params, cfg, prompts, pos, pmask, interventions=iv)
        steered = forward(
            params,
            cfg,
            prompts,
            pos,
            pmask,
            interventions=iv.replace(steer=0.5 * jnp.asarray(v), steer_layer=layer),
        )
        # the steered output is the clean one plus alpha v, to the bit (one float32 add)
        expected = np.asarray(clean.readout) + (0.5 * v[:, None]).astype(np.float32)
        np.testing.assert_array_equal(np.asarray(steered.readout), expected)


def _sample_plan(params, cfg, prompts, pmask, plan, key=7):
    prompt_of, rows = rollout.prefill_layout(Q, Q * G, plan.route)
    return sample(
        params,
        cfg,
        prompts[prompt_of],
        pmask[prompt_of],
        jax.random.key(key),
        plan.temperature,
        SamplingConfig(T),
        plan.interventions,
        None if rows is None else jnp.asarray(rows),
    )


def test_clean_route_rows_sample_exactly_as_without_ase_and_tis_uses_the_steered_mu(
    tiny,  # noqa: F811
):
    params, cfg, prompts, pmask = tiny
    ex, _ = _explorer(alpha=2.0, layer=1)
    plan = base_plan(Q * G, T, 1.0, _problems(Q))
    steered_plan = ex.plan(_banked_state(ex, cfg), plan, None, jax.random.key(0))
    plain = _sample_plan(params, cfg, prompts, pmask, plan)
    r = _sample_plan(params, cfg, prompts, pmask, steered_plan)
    route = np.asarray(steered_plan.route)
    clean, m = route == 0, np.asarray(r.mask)
    np.testing.assert_array_equal(np.asarray(r.tokens)[clean], np.asarray(plain.tokens)[clean])
    # mu to float rounding of the logits it comes from: the routed layout reads its prompt
    # keys through a per-row gather, a different summation order from the plain
    # group-shared path
    src = np.arange(Q * G) // G
    scale = logit_scale(params, cfg, prompts[src], pmask[src], plain.tokens, plain.mask)
    assert_float32_close(
        np.asarray(r.logprobs)[clean], np.asarray(plain.logprobs)[clean], scale=scale
    )
    assert (np.asarray(r.tokens)[~clean] != np.asarray(plain.tokens)[~clean]).any()

    # mu of a steered row: the steered policy's log-prob (full forward with the vector)
    b = int(np.flatnonzero(route == 3)[0])
    p = np.asarray(prompts[b // G])[np.asarray(pmask[b // G])]
    seq = jnp.asarray(np.concatenate([p, np.asarray(r.tokens[b])]))[None]
    iv = transformer.Interventions(steer=steered_plan.interventions.steer[b : b + 1], steer_layer=1)
    logits = forward(
        params, cfg, seq, jnp.arange(seq.shape[1])[None], jnp.ones_like(seq, bool), interventions=iv
    ).logits[0][len(p) - 1 : -1]
    mu_ref = np.asarray(jax.nn.log_softmax(logits))[np.arange(T), np.asarray(r.tokens[b])]
    steered_scale = float(jnp.abs(logits).max())
    assert_float32_close(np.asarray(r.logprobs[b])[m[b]], mu_ref[m[b]], scale=steered_scale)

    # TIS: w = min(2, pi_old / mu) with pi_old the clean policy on the same tokens
    old, _ = score(params, cfg, prompts, pmask, r.tokens, r.mask)
    w = np.minimum(2.0, np.exp(np.asarray(old) - np.asarray(r.logprobs)))
    # clean rows: mu = pi_old, w = exp(pi_old - mu) = 1 to the log-probs' rounding
    assert_float32_close(w[clean][m[clean]], np.ones(m[clean].sum()), scale=scale)
    assert (np.abs(w[~clean][m[~clean]] - 1.0) > 1e-3).any()
    adv = jnp.linspace(-1.0, 1.0, Q * G)
    x = losses.LossInputs(old, old, adv, r.mask, behaviour_logp=r.logprobs)
    _, metrics = losses.policy_loss(losses.LossConfig(tis_cap=2.0), x)
    np.testing.assert_allclose(float(metrics["tis/mean"]), w[m].mean(), rtol=1e-5)
    np.testing.assert_allclose(float(metrics["tis/clipped_frac"]), (w[m] >= 2.0).mean())


@pytest.mark.parametrize("position", ["fraction", "mean"])
def test_the_replayed_readout_equals_a_full_forward(tiny, position):  # noqa: F811
    params, cfg, prompts, pmask = tiny
    ex, _ = _explorer(layer=1, f=0.4, position=position)
    tokens = jax.random.randint(jax.random.key(3), (Q * G, T), 1, cfg.vocab_size)
    lengths = np.array([8, 5, 1, 3, 8, 2, 7, 6, 4, 8, 3, 5])  # one row per length kind
    mask = jnp.asarray(np.arange(T)[None] < lengths[:, None])
    correct = np.zeros((Q, G), bool)
    correct[:, 0] = correct[1, 2] = True
    ro = types.SimpleNamespace(
        prompts=np.asarray(prompts),
        prompt_mask=np.asarray(pmask),
        out=types.SimpleNamespace(tokens=tokens, mask=mask),
        rewards=correct.astype(np.float32),
    )
    pairs = ase.pair_rollouts(correct, np.random.default_rng(0))
    ctx = types.SimpleNamespace(params=params, cfg=cfg)
    h_pos, h_neg = ex.replay(ctx, ro, pairs)
    for (row_p, row_n), hp, hn in zip(pairs, h_pos, h_neg):
        for row, h in ((row_p, hp), (row_n, hn)):
            p = np.asarray(prompts[row // G])[np.asarray(pmask[row // G])]
            n = int(lengths[row])
            seq = jnp.asarray(np.concatenate([p, np.asarray(tokens[row])[:n]]))[None]
            full = forward(
                params,
                cfg,
                seq,
                jnp.arange(seq.shape[1])[None],
                jnp.ones_like(seq, bool),
                interventions=transformer.Interventions(readout_layer=1),
            ).readout[0, len(p) :]
            ref = full[int(np.floor(0.4 * n))] if position == "fraction" else full.mean(axis=0)
            assert_float32_close(h, ref)  # to the block output's own scale (~40)


# ----------------------------------------------------------------------------- end to end


def _smoke(arg="smoke", steps=3):
    return testing.smoke(f"configs/ase.py:{arg}", steps)


# what each ablation must hand the bank's estimate and smoothing (their behaviour under
# each value is tested above): e.directions, beta, match
_REACHES = {
    None: ("contrast", 0.5, True),
    "random_directions": ("random", 0.5, True),
    "shuffled_labels": ("shuffled", 0.5, True),
    "reversed": ("reversed", 0.5, True),
    "no_ema": ("contrast", 0.0, True),
    "no_hungarian": ("contrast", 0.5, False),
}


@pytest.mark.slow
@pytest.mark.parametrize("ablation", [None, *sorted(ase_config.ABLATIONS)])
def test_smoke_and_every_ablation_train(ablation, tmp_path, monkeypatch):
    c = _smoke("smoke" if ablation is None else f"{ablation},smoke", steps=5)
    c.exploration.ase.interval = 2  # bank updates at least 2 steps apart
    seen = {"estimate": [], "smooth": []}
    estimate, smooth = ase.estimate, ase.smooth

    def seen_estimate(pos, neg, e, rng):
        seen["estimate"].append(e.directions)
        return estimate(pos, neg, e, rng)

    def seen_smooth(u, candidates, beta, first, match):
        seen["smooth"].append((beta, first, match))
        return smooth(u, candidates, beta, first, match)

    monkeypatch.setattr(ase, "estimate", seen_estimate)
    monkeypatch.setattr(ase, "smooth", seen_smooth)
    progress = loop.train(config_lib.spec(c), str(tmp_path))
    rows = read_metrics(str(tmp_path))
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5]
    if ablation == "unstructured":  # every row steered from the first step, no bank
        assert all("ase/route0/reward" not in r and r["policy/kl_mu_old"] != 0 for r in rows)
        assert int(progress.explorers["ase"]["updates"]) == 0 and not seen["estimate"]
        return
    # the bank is updated at least `interval` steps apart, and twice: the second update
    # smooths into the first (where beta and match act)
    updated = [r["step"] for r, u in zip(rows, [0] + [r["ase/updates"] for r in rows]) if
               r["ase/updates"] > u]  # fmt: skip
    assert len(updated) >= 2 and all(b - a >= 2 for a, b in zip(updated, updated[1:]))
    directions, beta, match = _REACHES[ablation]
    assert set(seen["estimate"]) == {directions}
    assert {(b, m) for b, _, m in seen["smooth"]} == {(beta, match)}
    assert [first for _, first, _ in seen["smooth"]][:2] == [True, False]
    # before the bank every row is clean and mu is pi_old: every TIS weight exactly 1; the
    # step after it steers, and the trainer weights by the steered mu
    first = updated[0]
    assert all(r["tis/mean"] == 1.0 and r["policy/kl_mu_old"] == 0.0 for r in rows[:first])
    assert "ase/route1/reward" not in rows[first - 1] and "ase/route3/accuracy" in rows[first]
    assert rows[first]["tis/mean"] != 1.0 and rows[first]["policy/kl_mu_old"] != 0.0
    u = np.asarray(progress.explorers["ase"]["u"])
    assert np.isfinite(u).all() and (np.linalg.norm(u, axis=1) > 0).all()


@pytest.mark.slow
def test_the_bank_and_buffer_survive_an_exact_resume(tmp_path):
    straight = loop.train(config_lib.spec(_smoke(steps=4)), str(tmp_path / "a"))
    loop.train(config_lib.spec(_smoke(steps=2)), str(tmp_path / "b"))
    resumed = loop.train(config_lib.spec(_smoke(steps=4)), str(tmp_path / "b"))
    assert int(straight.explorers["ase"]["updates"]) >= 2
    # exact: a resume runs the same programs on the same shapes and restored state
    for x, y in zip(jax.tree.leaves(straight), jax.tree.leaves(resumed)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


@pytest.mark.slow
def test_ase_composes_with_ead_through_the_cli(tmp_path):
    out = run_main(
        "--config=configs/ase.py:smoke",
        f"--workdir={tmp_path}",
        "--config.exploration.methods=('ase', 'ead')",
        f"--config.reward.fn={testing.PARITY}",
        "--config.train.steps=4",
        "--config.train.eval_every=0",
        "--config.rollout.max_new_tokens=16",  # EAD anneals from the 10th token
    )
    assert out.returncode == 0, out.stderr[-3000:]
    rows = read_metrics(str(tmp_path))
    built = next(i for i, r in enumerate(rows) if r["ase/updates"] >= 1)
    assert "ase/route3/reward" in rows[built + 1]  # steered after the first bank update
    assert all(r["rollout/temperature"] < 1.0 and r["tis/mean"] > 0 for r in rows)  # EAD
    written = json.load(open(tmp_path / "config.json"))["exploration"]
    assert written["methods"] == ["ase", "ead"] and written["ead"]["tau_max"] == 1.2


def test_config_errors_name_the_field():
    for field, value, message in [
        ("k", 0, "k=0"),
        ("directions", "sideways", "directions='sideways'"),
        ("min_pairs", 2, "min_pairs=2: K-means needs >= k=3"),
        ("f", 1.0, "f=1.0: must be in"),
    ]:
        with pytest.raises(ValueError, match=f"config: exploration.ase.{message}"):
            _explorer(**{field: value})
    c = ase_config.get_config("smoke")
    c.exploration.methods = ("eden", "ase")  # different fields: they compose
    c.exploration.eden = base.get("eden").defaults()
    c.exploration.eden.noisy = 1
    assert [ex.name for ex in base.build(config_lib.spec(c))] == ["eden", "ase"]
    ex, _ = _explorer(layer=5)
    with pytest.raises(ValueError, match="layer=5: the model has blocks 0..1"):
        ex.template(types.SimpleNamespace(cfg=types.SimpleNamespace(d_model=8, n_layers=2)))
