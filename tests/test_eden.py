"""EDEN: noise norms, clean rows exactly clean, the clean-prompt update, the filter, the
bank (screen, determinism, resume), and every ablation's smoke config end to end."""

import dataclasses
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import assert_float32_close, logit_scale

from configs import eden as eden_config
from explore_rl import config as config_lib
from explore_rl import testing
from explore_rl.data import lab
from explore_rl.exploration import base, eden
from explore_rl.logs import read_metrics
from explore_rl.models.tokenizer import Tokenizer
from explore_rl.rewards.math import Verifier
from explore_rl.rl.plan import base_plan
from explore_rl.sampling.sampler import sample
from explore_rl.train import loop, steps

# slow: the tests of a started run (`run` screens its bank: most of the module's time) and
# the training runs
pytestmark = pytest.mark.numerics


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A started smoke run (bank screened) and its verifier."""
    c = eden_config.get_config("smoke")
    c.exploration.eden.rho = 0.5  # a strong slot, so noisy rows visibly differ
    with Verifier(1, 5.0) as verifier:
        r, progress, ckpt = testing.start(c, str(tmp_path_factory.mktemp("run")), verifier)
        ckpt.close()
        yield r, progress


def _plan(r, progress, step=0, key=0):
    (ex,) = r.explorers
    c = r.spec
    q, g = c.rollout.prompts, c.rollout.group_size
    p = base_plan(q * g, c.rollout.sampling.max_new_tokens, 1.0, r.train_set[:q])
    ctx = r.context(progress.state.params, step)
    return ex.plan(progress.explorers["eden"], p, ctx, jax.random.key(key)), ex


@pytest.mark.slow
def test_noise_norm_and_masked_clean_rows(run):
    r, progress = run
    plan, ex = _plan(r, progress)
    g = r.spec.rollout.group_size
    noisy = np.asarray(plan.info["eden"]["noisy"])
    np.testing.assert_array_equal(noisy, np.tile([False] * (g - 1) + [True], 2))
    bank = np.asarray(progress.explorers["eden"]["vectors"])
    anchors = bank[np.repeat(np.asarray(plan.info["eden"]["anchor"]), g)]
    slot = np.asarray(plan.interventions.extra_embeds[:, 0])
    eps = slot - anchors
    np.testing.assert_allclose(
        np.linalg.norm(eps, axis=1), 0.5 * np.linalg.norm(anchors, axis=1), rtol=1e-5
    )
    assert len({tuple(e[:4]) for e in eps}) == len(eps)  # independent per row
    np.testing.assert_array_equal(np.asarray(plan.interventions.extra_mask[:, 0]), noisy)
    # warm-up at step 0: noisy rows at 0.2, clean rows at 1
    np.testing.assert_allclose(np.asarray(plan.temperature)[:, 0], np.where(noisy, 0.2, 1.0))

    # clean rows sample exactly what they would with no intervention at all
    params, cfg = progress.state.params, r.cfg
    prompts, pmask = (jnp.asarray(x) for x in _encode(r, plan.problems))
    sc = r.spec.rollout.sampling
    with_slot = sample(
        params, cfg, prompts, pmask, jax.random.key(3), plan.temperature, sc, plan.interventions
    )
    without = sample(params, cfg, prompts, pmask, jax.random.key(3), plan.temperature, sc)
    clean = ~noisy
    # exact: a row whose appended slot is masked takes the plain attention output unchanged
    for field in ("tokens", "logprobs", "entropy"):
        np.testing.assert_array_equal(
            np.asarray(getattr(with_slot, field))[clean], np.asarray(getattr(without, field))[clean]
        )
    assert not np.array_equal(
        np.asarray(with_slot.logprobs)[noisy], np.asarray(without.logprobs)[noisy]
    )


def _encode(r, problems):
    from explore_rl.rl.rollout import encode

    return encode(r.tok, problems, r.spec.prompt, r.spec.rollout.max_prompt_len)


@pytest.mark.slow
def test_update_scores_every_row_under_the_clean_prompt(run):
    r, progress = run
    ro, _, _ = steps.collect(r, progress, 0)
    assert ro.plan.interventions.extra_embeds is not None
    batch, _, _ = steps.make_batch(r, progress, ro, 0)
    assert not any("extra" in f for f in vars(batch))  # the Batch carries no slot
    clean = steps.score_rollouts(r, progress.state.params, batch, ro)
    # exact: pi_old is this scoring program on these shapes
    np.testing.assert_array_equal(np.asarray(batch.old_logp), np.asarray(clean))
    m, noisy = np.asarray(batch.mask), np.asarray(ro.plan.info["eden"]["noisy"])
    old, mu = np.asarray(batch.old_logp), np.asarray(batch.behaviour_logp)
    # clean rows: mu is pi_old, to the rounding of the logits they come from (sampler vs
    # scoring: other shapes)
    rows = (np.arange(len(m)) // r.spec.rollout.group_size)[~noisy]
    p, pm = np.asarray(batch.prompts)[rows], np.asarray(batch.prompt_mask)[rows]
    tau = np.asarray(ro.plan.temperature)[~noisy]
    scale = logit_scale(
        progress.state.params, r.cfg, p, pm, batch.tokens[~noisy], batch.mask[~noisy], tau
    )
    assert_float32_close(mu[~noisy][m[~noisy]], old[~noisy][m[~noisy]], scale=scale)
    gap = np.abs(old - mu)
    assert gap[noisy][m[noisy]].max() > 1e-2  # noisy rows: mu saw the slot (and tau 0.2)


def _rollouts(rewards, noisy):
    from types import SimpleNamespace

    rewards = np.asarray(rewards, np.float32)
    q, g = rewards.shape
    plan = SimpleNamespace(info={"eden": {"noisy": np.asarray(noisy), "anchor": np.zeros(q, int)}})
    # row r's first token has entropy r, its second is padding (entropy 100, masked out)
    entropy = np.stack([np.arange(q * g, dtype=np.float32), np.full(q * g, 100.0)], axis=1)
    out = SimpleNamespace(entropy=entropy, mask=np.tile([True, False], (q * g, 1)))
    return SimpleNamespace(rewards=rewards, plan=plan, out=out)


def test_filter_keeps_the_top_fraction_and_scales_only_kept_rows():
    abs_adv = np.array([0.1, 0.9, 0.5, 0.5, 0.7, 0.2, 0.5, 0.0])
    noisy = np.array([0, 1, 1, 1, 0, 1, 1, 1], bool)  # noisy |A|: .9 .5 .5 .2 .5 0
    kept = eden.keep_top(abs_adv, noisy, 0.5)  # 3 of 6: .9 then the first two .5 ties
    np.testing.assert_array_equal(np.flatnonzero(kept), [1, 2, 3])
    np.testing.assert_array_equal(np.flatnonzero(eden.keep_top(abs_adv, noisy, 0.34)), [1, 2, 3])
    assert eden.keep_top(abs_adv, noisy, 1.0).sum() == 6
    assert eden.keep_top(abs_adv, np.zeros(8, bool), 0.5).sum() == 0

    c = eden_config.get_config("smoke")  # G = 4, 1 noisy per group
    (ex,) = base.build(config_lib.spec(c))
    rewards = [[1, 0, 0, 1], [0, 0, 0, 0], [1, 1, 1, 0], [0, 1, 0, 1]]
    noisy = np.tile([False, False, False, True], 4)
    adv = np.array([0.8, -0.8, -0.8, 0.8, 0, 0, 0, 0, 0.5, 0.5, 0.5, -1.5, -0.6, 0.6, -0.6, 0.6])
    s = ex.shape_advantages(None, _rollouts(rewards, noisy), adv, np.ones(16, np.float32), None)
    # noisy |A|: .8, 0, 1.5, .6 -> keep 2: rows 11 and 3
    np.testing.assert_array_equal(np.flatnonzero(noisy & (s.weights > 0)), [3, 11])
    np.testing.assert_allclose(s.advantages[[3, 11]], [0.4, -0.75])
    np.testing.assert_array_equal(s.weights[[7, 15]], 0.0)
    np.testing.assert_array_equal(s.advantages[~noisy], adv[~noisy])  # clean untouched
    np.testing.assert_array_equal(s.weights[~noisy], 1.0)
    assert s.metrics["kept_frac"] == 0.5
    assert s.metrics["kept_per_prompt/1"] == 0.5 and s.metrics["kept_per_prompt/0"] == 0.5
    assert s.metrics["reward_noisy"] == 0.5
    assert s.metrics["reward_clean"] == pytest.approx(5 / 12)
    assert s.metrics["clean_zero_adv_frac"] == 0.5  # groups 1 and 2 without their noisy row
    assert s.metrics["clean_entropy"] == (120 - (3 + 7 + 11 + 15)) / 12  # rows 0-15 but noisy


def test_screen_keeps_viable_candidates_in_drawn_order_and_refuses_too_few(monkeypatch, caplog):
    scores = {None: 0.5, 11: 0.45, 12: 0.1, 13: 0.6, 14: 0.39, 15: 0.41}

    def probe(ctx, problems, routes, n, rng):
        return [scores[r] for r in routes]

    monkeypatch.setattr(eden, "_probe", probe)
    e = eden.EDEN.Spec(bank_size=2, tolerance=0.1)
    ctx = base.StepContext(None, None, _Tok(), None, 0, train_set=[None] * 8)
    ids, report = eden.screen(ctx, [12, 11, 14, 13, 15], e, 0)
    assert ids == [11, 13] and report["clean_accuracy"] == 0.5
    assert report["threshold"] == pytest.approx(0.4) and report["tolerance_mode"] == "absolute"
    # only 11, 13 and 15 viable for a bank of 4: refused, naming the count and the remedies
    e = dataclasses.replace(e, bank_size=4)
    with pytest.raises(ValueError) as refused:
        eden.screen(ctx, [12, 11, 14, 13, 15], e, 0)
    message = str(refused.value)
    assert message.startswith(
        "EDEN: 3 of 5 candidates viable (accuracy >= 0.4000 = clean 0.5000 - tolerance 0.1;"
    )
    assert "the bank needs K = 4" in message and "allow_unviable=True" in message
    assert "\n" not in message
    # allowed: topped up with the most accurate other, with a warning
    ids, _ = eden.screen(ctx, [12, 11, 14, 13, 15], dataclasses.replace(e, allow_unviable=True), 0)
    assert ids == [11, 13, 15, 14] and "3 of 5 candidates viable" in caplog.text


def test_threshold_absolute_and_relative_with_their_boundaries():
    # absolute: clean - tolerance; relative: (1 - tolerance) x clean
    assert eden.threshold(0.5, 0.1) == pytest.approx(0.4)
    assert eden.threshold(0.5, 0.1, "relative") == pytest.approx(0.45)
    # a low-accuracy base: the absolute margin is below zero (0 passes), the relative is not
    assert eden.threshold(0.023, 0.1) < 0 < eden.threshold(0.023, 0.6, "relative")
    assert eden.threshold(0.0, 0.6, "relative") < 0  # nothing solved: nothing to tell apart
    # an accuracy on the line is viable, one just below it is not, whatever the rounding:
    # (1 - 0.7) x 0.1 is 0.030000000000000006 in floats
    for mode, tol in (("relative", 0.7), ("absolute", 0.07)):
        limit = eden.threshold(10 / 100, tol, mode)
        assert 3 / 100 >= limit and 3 / 100 - 1e-6 < limit, mode
    spec = config_lib.spec(eden_config.get_config("smoke"))
    ((_, e),) = spec.methods
    for bad, refusal in (
        ({"tolerance_mode": "ratio"}, "tolerance_mode='ratio': allowed"),
        ({"tolerance_mode": "relative", "tolerance": 1.5}, r"tolerance=1.5: must be in \[0, 1.0\]"),
        ({"tolerance": -0.1}, r"tolerance=-0.1: must be in \[0, inf\] \(absolute\)"),
        ({"bank_seed": -2}, "bank_seed=-2: a seed >= 0, or -1"),
    ):
        with pytest.raises(ValueError, match=refusal):
            eden.EDEN.check(dataclasses.replace(e, **bad), spec)


def test_a_relative_tolerance_refuses_a_breaking_anchor_the_absolute_one_passes(monkeypatch):
    """Lab v2's base solves 2.3% of the probe: under an absolute 0.1 a candidate that breaks
    every answer is viable; under lab2's relative 0.6 it is refused, with the threshold."""
    scores = {None: 0.023, 11: 0.027, 12: 0.0, 13: 0.018}
    monkeypatch.setattr(
        eden, "_probe", lambda ctx, problems, routes, n, rng: [scores[r] for r in routes]
    )
    ctx = base.StepContext(None, None, _Tok(), None, 0, train_set=[None] * 8)
    absolute = eden.EDEN.Spec(bank_size=3)
    ids, _ = eden.screen(ctx, [11, 12, 13], absolute, 0)
    assert ids == [11, 12, 13]  # the breaking 12 included
    lab2 = eden_config.get_config("lab2").exploration.eden
    relative = dataclasses.replace(
        absolute, tolerance=lab2.tolerance, tolerance_mode=lab2.tolerance_mode
    )
    with pytest.raises(ValueError) as refused:
        eden.screen(ctx, [11, 12, 13], relative, 0)
    assert str(refused.value).startswith(
        "EDEN: 2 of 3 candidates viable (accuracy >= 0.0092 = (1 - tolerance 0.6) x clean 0.0230;"
    )
    ids, report = eden.screen(ctx, [11, 12, 13], dataclasses.replace(relative, bank_size=2), 0)
    assert ids == [11, 13] and report["threshold"] == pytest.approx(0.4 * 0.023)
    assert report["tolerance_mode"] == "relative" and report["tolerance"] == 0.6


def test_bank_seed_follows_the_run_seed_unless_given(monkeypatch):
    """By default each run seed draws its own candidates and probe rollouts; the same seed
    the same screen; an explicit bank_seed pins it whatever the run's seed."""
    probed = []

    def probe(ctx, problems, routes, n, rng):
        probed.append((tuple(routes), tuple(np.asarray(jax.random.key_data(rng)).ravel())))
        return [0.5] * len(routes)

    monkeypatch.setattr(eden, "_probe", probe)
    c = eden_config.get_config("smoke")
    c.exploration.eden.pool, c.exploration.eden.candidates = "all", 8
    spec = config_lib.spec(c)
    ((_, settings),) = spec.methods
    assert settings.bank_seed == -1  # the default: the run's
    tok = Tokenizer.from_hf_folder(lab.FOLDER)  # 20 ordinary tokens to draw 8 from

    def screened(seed, bank_seed=-1):
        probed.clear()
        run = dataclasses.replace(spec, seed=seed)
        ex = eden.EDEN(dataclasses.replace(settings, bank_seed=bank_seed), run)
        ctx = base.StepContext({"embed": jnp.zeros((32, 4))}, None, tok, run, 0, [None] * 2)
        ex.init(ctx)
        return list(probed)

    assert screened(0) == screened(0)
    first, second = screened(0), screened(1)
    assert first[0][0] != second[0][0] and first[0][1] != second[0][1]  # order and keys
    assert screened(0, bank_seed=5) == screened(1, bank_seed=5)


class _Tok:
    def decode(self, ids):
        return f"t{ids[0]}"


@pytest.mark.slow
def test_word_pool_and_bank_determinism(run, tmp_path):
    r, progress = run
    pool = eden.lexical_pool(r.tok)
    words = [r.tok.decode([i]) for i in pool[:200]]
    assert all(w.startswith(" ") and w[1:].isalpha() and len(w) >= 4 for w in words)
    # a character vocabulary (the lab's) has no words: "all" takes every ordinary token
    lab_tok = Tokenizer.from_hf_folder(lab.FOLDER)
    with pytest.raises(ValueError, match="no whole-word tokens .*pool='all'"):
        eden.lexical_pool(lab_tok)
    chars = [lab_tok.backend.id_to_token(int(i)) for i in eden.lexical_pool(lab_tok, "all")]
    assert chars == list("0123456789+-*/=()> \n")  # not <pad>, not <eos>
    (ex,) = r.explorers
    ctx = r.context(progress.state.params, 0)
    again = ex.init(ctx)
    # exact: the same screening programs on the same shapes and seed
    for k in ("ids", "vectors"):
        np.testing.assert_array_equal(
            np.asarray(again[k]), np.asarray(progress.explorers["eden"][k])
        )
    other = eden.EDEN(dataclasses.replace(ex.settings, bank_seed=7), r.spec)
    assert not np.array_equal(np.asarray(other.init(ctx)["ids"]), np.asarray(again["ids"]))


@pytest.mark.slow
def test_user_supplied_bank_tokens(run):
    r, progress = run
    e = eden.EDEN.Spec(bank_tokens="apple, river", bank_size=2, noisy=1)
    eden.EDEN.check(e, r.spec)
    ex = eden.EDEN(e, r.spec)
    state = ex.init(r.context(progress.state.params, 0))
    assert [r.tok.decode([i]) for i in np.asarray(state["ids"])] == [" apple", " river"]
    # exact: a bank vector is the word's embedding row, copied
    np.testing.assert_array_equal(
        np.asarray(state["vectors"][1]), np.asarray(progress.state.params["embed"][state["ids"][1]])
    )
    e = dataclasses.replace(e, bank_tokens="apple, pneumonoultramicroscopic")
    with pytest.raises(ValueError, match="'pneumonoultramicroscopic' is"):
        eden.EDEN(e, r.spec).init(r.context(progress.state.params, 0))
    with pytest.raises(ValueError, match="bank_tokens has 2 words, bank_size=3"):
        eden.EDEN.check(dataclasses.replace(e, bank_size=3), r.spec)


@pytest.mark.slow
def test_bank_survives_resume(tmp_path):
    c = eden_config.get_config("smoke")
    c.train.steps, c.train.eval_every = 2, 0
    first = loop.train(config_lib.spec(c), str(tmp_path))
    bank_file = (tmp_path / "eden_bank.json").read_text()
    c.train.steps = 3
    resumed = loop.train(
        config_lib.spec(c), str(tmp_path)
    )  # restores the bank, does not screen again
    # exact: the restored bank is the saved one, not computed again
    np.testing.assert_array_equal(
        np.asarray(first.explorers["eden"]["vectors"]),
        np.asarray(resumed.explorers["eden"]["vectors"]),
    )
    assert (tmp_path / "eden_bank.json").read_text() == bank_file
    bank = json.loads(bank_file)["bank"]
    assert [b["id"] for b in bank] == np.asarray(first.explorers["eden"]["ids"]).tolist()


@pytest.mark.slow
@pytest.mark.parametrize("ablation", sorted(eden_config.ABLATIONS))
def test_ablation_smoke_configs_train(ablation, tmp_path):
    c = eden_config.get_config(f"{ablation},smoke")
    c.train.steps, c.train.eval_every = 1, 0
    c.lock()
    loop.train(config_lib.spec(c), str(tmp_path))
    (row,) = read_metrics(str(tmp_path))
    assert row["train/skipped_updates"] == 0 and "eden/kept_frac" in row


@pytest.mark.slow
def test_smoke_config_composed_with_ead(tmp_path):
    c = eden_config.get_config("smoke")
    c.exploration.methods = ("eden", "ead")
    c.rollout.max_new_tokens, c.rl.tis_cap = 16, 2.0
    loop.train(config_lib.spec(c), str(tmp_path))
    rows = read_metrics(str(tmp_path))
    assert [r["step"] for r in rows] == [1, 2, 3] and "eval/arithmetic/pass@1" in rows[-1]
    assert all("eden/kept_frac" in r and "tis/mean" in r for r in rows)
    # EAD anneals after token 10 (to 0.1 by token 15 at step 0) on top of EDEN's warm-up
    assert rows[0]["rollout/temperature"] < rows[1]["rollout/temperature"] < 0.95
    assert os.path.exists(tmp_path / "eden_bank.json")
