"""The sampler: exact behaviour log-probs, sampling distribution, interventions, sharing."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.stats
from helpers import (
    G,
    Q,
    T,
    assert_float32_close,
    forward,
    log_softmax,
    logit_scale,
    reference_truncated_logprob,
    response_logits,
)

from explore_rl.models import transformer
from explore_rl.models.transformer import Interventions
from explore_rl.sampling import sampler, schedules
from explore_rl.sampling.sampler import SamplingConfig, greedy, sample

pytestmark = [pytest.mark.usefixtures("highest_precision"), pytest.mark.numerics]


def test_mu_equals_full_forward_logprob_at_temperature_one(tiny):
    params, cfg, prompts, pmask = tiny
    src = jnp.repeat(jnp.arange(Q), G)  # the prompt of each row
    r = sample(
        params,
        cfg,
        prompts,
        pmask,
        jax.random.key(0),
        jnp.ones((Q * G, T)),
        SamplingConfig(T, stop_ids=(5, 9)),
    )
    logits = response_logits(params, cfg, prompts[src], pmask[src], r.tokens, r.mask)
    logp = log_softmax(logits)
    m = np.asarray(r.mask)
    ref = np.take_along_axis(logp, np.asarray(r.tokens)[..., None], -1)[..., 0]
    scale = float(np.abs(logits).max())  # the logits mu and the entropies come from
    assert_float32_close(np.asarray(r.logprobs)[m], ref[m], scale=scale)
    ent = -(np.exp(logp) * logp).sum(-1)
    assert_float32_close(np.asarray(r.entropy)[m], ent[m], scale=scale)
    assert_float32_close(np.asarray(r.sampling_entropy)[m], ent[m], scale=scale)
    # stop ids end a row, and the stop token is its last real token
    lengths = m.sum(1)
    for b in range(Q * G):
        toks = np.asarray(r.tokens[b])[: lengths[b]]
        assert bool(r.finished[b]) == (toks[-1] in (5, 9))
        assert not set(toks[:-1]) & {5, 9}


@pytest.mark.parametrize("top_p,top_k", [(0.8, 0), (0.9, 6), (1.0, 4)])
def test_mu_under_temperature_table_and_truncation(tiny, top_p, top_k):
    params, cfg, prompts, pmask = tiny
    src = jnp.repeat(jnp.arange(Q), G)  # the prompt of each row
    tau = jax.random.uniform(jax.random.key(4), (Q * G, T), minval=0.3, maxval=1.6)
    r = sample(
        params,
        cfg,
        prompts,
        pmask,
        jax.random.key(5),
        tau,
        SamplingConfig(T, top_p=top_p, top_k=top_k),
    )
    logits = response_logits(params, cfg, prompts[src], pmask[src], r.tokens, r.mask)
    tau, toks = np.asarray(tau), np.asarray(r.tokens)
    mu, ent = np.zeros((Q * G, T)), np.zeros((Q * G, T))
    for b in range(Q * G):
        for t in range(T):
            q = reference_truncated_logprob(logits[b, t], tau[b, t], top_p, top_k)
            assert np.isfinite(q[toks[b, t]])  # the token came from the kept set
            mu[b, t] = q[toks[b, t]]
            qf = q[np.isfinite(q)]
            ent[b, t] = -(np.exp(qf) * qf).sum()
    scale = float(np.abs(logits / tau[..., None]).max())  # the tempered logits
    assert_float32_close(r.logprobs, mu, scale=scale)
    assert_float32_close(r.sampling_entropy, ent, scale=scale)


def chi_square_pvalue(counts, expected, min_bins: int) -> float:
    """Pearson chi-square of counts vs expected, rare tokens (expected < 5) pooled."""
    expected = np.asarray(expected, np.float64)
    big = expected >= 5
    assert big.sum() >= min_bins  # a real test: enough categories
    obs = np.append(counts[big], counts[~big].sum())
    exp = np.append(expected[big], expected[~big].sum())
    obs, exp = obs[exp > 0], exp[exp > 0]
    return scipy.stats.chisquare(obs, exp * obs.sum() / exp.sum()).pvalue


@pytest.mark.parametrize("tau,top_p", [(0.8, 1.0), (1.3, 0.7)])
def test_token_frequencies_match_softmax(tiny, tau, top_p):
    params, cfg, prompts, pmask = tiny
    n = 20000
    r = sample(
        params,
        cfg,
        prompts[:1],
        pmask[:1],
        jax.random.key(7),
        jnp.full((n, 1), tau),
        SamplingConfig(1, top_p=top_p),
    )
    counts = np.bincount(np.asarray(r.tokens[:, 0]), minlength=cfg.vocab_size)
    logits = forward(
        params, cfg, prompts[:1], transformer.positions_from_mask(pmask[:1]), pmask[:1]
    ).logits[0, -1]
    expected = n * np.exp(reference_truncated_logprob(np.asarray(logits), tau, top_p, 0))
    assert counts[expected == 0].sum() == 0  # nothing from outside the top-p set
    assert chi_square_pvalue(counts, expected, min_bins=5) > 1e-3


def test_masked_slot_and_zero_steering_sample_the_same_tokens(tiny):
    params, cfg, prompts, pmask = tiny
    b = Q * G
    tau = jnp.ones((b, T))
    sc = SamplingConfig(T)
    run = lambda iv=None: sample(params, cfg, prompts, pmask, jax.random.key(9), tau, sc, iv)  # noqa: E731
    plain = run()
    slot_mask = (jnp.arange(b) % G == 0)[:, None]  # one noisy row per group
    embeds = 3.0 * jax.random.normal(jax.random.key(10), (b, 1, cfg.d_model))
    noisy = run(Interventions(extra_embeds=embeds, extra_mask=slot_mask))
    clean = ~np.asarray(slot_mask[:, 0])
    # exact: a row whose appended slots are all masked takes the plain attention output
    # unchanged (transformer.py), the same shapes and sums as without the slots
    np.testing.assert_array_equal(np.asarray(noisy.tokens)[clean], np.asarray(plain.tokens)[clean])
    np.testing.assert_array_equal(
        np.asarray(noisy.logprobs)[clean], np.asarray(plain.logprobs)[clean]
    )
    assert (np.asarray(noisy.tokens)[~clean] != np.asarray(plain.tokens)[~clean]).any()
    zero = run(Interventions(steer=jnp.zeros((b, cfg.d_model)), steer_layer=0))
    # exact: x + 0 is x, the rest of the program the plain one
    np.testing.assert_array_equal(np.asarray(zero.tokens), np.asarray(plain.tokens))
    np.testing.assert_array_equal(np.asarray(zero.logprobs), np.asarray(plain.logprobs))


def test_appended_slot_logprobs_match_inserted_embedding(tiny):
    """mu of a noisy row is the log-prob with the slot as an extra input position."""
    params, cfg, prompts, pmask = tiny
    slot = jnp.array([[11], [40], [23]])
    r = sample(
        params,
        cfg,
        prompts,
        pmask,
        jax.random.key(2),
        jnp.ones((Q, T)),
        SamplingConfig(T),
        Interventions(extra_embeds=params["embed"][slot], extra_mask=jnp.ones((Q, 1), bool)),
    )
    inserted = jnp.concatenate([prompts, slot], 1)
    imask = jnp.concatenate([pmask, jnp.ones((Q, 1), bool)], 1)
    logits = response_logits(params, cfg, inserted, imask, r.tokens, r.mask)
    ref = np.take_along_axis(log_softmax(logits), np.asarray(r.tokens)[..., None], -1)[..., 0]
    m = np.asarray(r.mask)
    assert_float32_close(np.asarray(r.logprobs)[m], ref[m], scale=float(np.abs(logits).max()))


def test_changing_the_temperature_table_does_not_recompile(tiny):
    params, cfg, prompts, pmask = tiny
    sc = SamplingConfig(T)
    run = lambda tau, seed: sample(params, cfg, prompts, pmask, jax.random.key(seed), tau, sc)  # noqa: E731
    run(schedules.constant(Q * G, T, 1.0), 0)  # compiles (or finds) this signature
    compiled = (sampler.start, sampler.decode_segment)  # the jitted parts behind `sample`
    before = [f._cache_size() for f in compiled]
    for step in range(3):
        run(schedules.table(batch=Q * G, per_position=schedules.ead(T, step, c=2)), step)
    run(schedules.constant(Q * G, T, 0.5), 1)
    assert [f._cache_size() for f in compiled] == before


@pytest.mark.parametrize("top_p,top_k", [(1.0, 1), (1e-6, 0)])
def test_top_k_one_and_tiny_top_p_are_greedy(tiny, top_p, top_k):
    params, cfg, prompts, pmask = tiny
    g = greedy(params, cfg, prompts, pmask, T)
    r = sample(
        params,
        cfg,
        prompts,
        pmask,
        jax.random.key(3),
        jnp.full((Q, T), 1.4),
        SamplingConfig(T, top_p=top_p, top_k=top_k),
    )
    np.testing.assert_array_equal(np.asarray(r.tokens), np.asarray(g.tokens))
    # one kept token: mu = log(p / p) = 0, a value of known size (absolute)
    np.testing.assert_allclose(np.asarray(r.logprobs), 0.0, atol=1e-6)


def test_group_shared_prefill_equals_per_row_prefill(tiny):
    params, cfg, prompts, pmask = tiny
    src, b = jnp.repeat(jnp.arange(Q), G), Q * G
    tau, sc = jnp.full((b, T), 1.1), SamplingConfig(T)
    shared = sample(params, cfg, prompts, pmask, jax.random.key(1), tau, sc)
    own = sample(params, cfg, prompts[src], pmask[src], jax.random.key(1), tau, sc)
    np.testing.assert_array_equal(np.asarray(shared.tokens), np.asarray(own.tokens))
    scale = logit_scale(params, cfg, prompts[src], pmask[src], own.tokens, own.mask, tau)
    assert_float32_close(shared.logprobs, own.logprobs, scale=scale)


def test_steering_routes_share_prefill_per_route(tiny):
    """Two routes per prompt: one prefill per (prompt, route), two rows each."""
    params, cfg, prompts, pmask = tiny
    b = Q * G
    route = (np.arange(b) // 2) % 2  # rows [p0 r0, p0 r0, p0 r1, p0 r1, p1 r0, ...]
    prompt_of = np.arange(b) // G
    bank = jnp.stack(
        [jnp.zeros(cfg.d_model), 2.0 * jax.random.normal(jax.random.key(2), (cfg.d_model,))]
    )
    iv = Interventions(steer=bank[route], steer_layer=0)
    pre = np.repeat(np.arange(Q), 2)  # prefill row 2p + r holds prompt p
    tau, sc = jnp.ones((b, T)), SamplingConfig(T)
    shared = sample(params, cfg, prompts[pre], pmask[pre], jax.random.key(4), tau, sc, iv)
    own = sample(params, cfg, prompts[prompt_of], pmask[prompt_of], jax.random.key(4), tau, sc, iv)
    np.testing.assert_array_equal(np.asarray(shared.tokens), np.asarray(own.tokens))
    clean = sample(params, cfg, prompts, pmask, jax.random.key(4), tau, sc)
    assert (np.asarray(shared.tokens)[route == 1] != np.asarray(clean.tokens)[route == 1]).any()
    np.testing.assert_array_equal(
        np.asarray(shared.tokens)[route == 0], np.asarray(clean.tokens)[route == 0]
    )


def _routed(prompts, pmask, route, bank):
    """Prompt rows and the row -> prefill map of a routing, as `rollout.generate` makes."""
    from explore_rl.rl.rollout import prefill_layout

    prompt_of, rows = prefill_layout(Q, Q * G, route)
    iv = Interventions(steer=bank[route], steer_layer=0)
    rows = None if rows is None else jnp.asarray(rows)
    return prompts[prompt_of], pmask[prompt_of], iv, rows, len(prompt_of)


@pytest.mark.parametrize(
    "layout", ["alternating", "random_per_row", "one_route_per_group", "uneven"]
)
def test_any_steering_layout_equals_a_per_row_prefill(tiny, layout):
    params, cfg, prompts, pmask = tiny
    b = Q * G
    bank = jnp.concatenate(  # route 0 is the clean route
        [jnp.zeros((1, cfg.d_model)), 2.0 * jax.random.normal(jax.random.key(2), (3, cfg.d_model))]
    )
    route = {
        "alternating": np.arange(b) % 2,
        "random_per_row": np.random.default_rng(0).integers(0, 4, b),
        "one_route_per_group": np.repeat(np.arange(Q) % 3 + 1, G),
        "uneven": np.tile([0, 1, 1, 2], Q),  # routes of 1, 2 and 1 rows in each group
    }[layout]
    p, pm, iv, rows, n_prefills = _routed(prompts, pmask, route, bank)
    assert n_prefills == len(set(zip((np.arange(b) // G).tolist(), route.tolist())))
    tau, sc = jnp.full((b, T), 1.1), SamplingConfig(T, top_p=0.95)
    routed = sample(params, cfg, p, pm, jax.random.key(4), tau, sc, iv, rows)
    src = np.arange(b) // G  # reference: every row prefilled on its own, under its vector
    own = sample(params, cfg, prompts[src], pmask[src], jax.random.key(4), tau, sc, iv)
    np.testing.assert_array_equal(np.asarray(routed.tokens), np.asarray(own.tokens))
    scale = logit_scale(params, cfg, prompts[src], pmask[src], own.tokens, own.mask, tau, iv)
    assert_float32_close(routed.logprobs, own.logprobs, scale=scale)
    clean = sample(params, cfg, prompts, pmask, jax.random.key(4), tau, sc)
    steered = route != 0
    assert (np.asarray(routed.tokens)[steered] != np.asarray(clean.tokens)[steered]).any()


def test_plain_rows_share_one_prefill_per_prompt(tiny):
    from explore_rl.rl.rollout import prefill_layout

    prompt_of, rows = prefill_layout(Q, Q * G, None)
    assert prompt_of.tolist() == list(range(Q)) and rows is None  # Q prefills, grouped decode
    prompt_of, rows = prefill_layout(Q, Q * G, np.zeros(Q * G, int))
    assert prompt_of.tolist() == list(range(Q)) and rows is None
    prompt_of, rows = prefill_layout(Q, Q * G, np.arange(Q * G) % 2)
    assert prompt_of.tolist() == [0, 0, 1, 1, 2, 2] and rows.tolist()[:G] == [0, 1, 0, 1]


def test_rows_sharing_a_prefill_with_different_steering_are_refused(tiny):
    params, cfg, prompts, pmask = tiny
    b = Q * G
    steer = jnp.asarray(np.where((np.arange(b) % 2)[:, None], 1.0, 0.0) * np.ones(cfg.d_model))
    iv = Interventions(steer=steer, steer_layer=0)
    tau, sc = jnp.ones((b, T)), SamplingConfig(T)
    with pytest.raises(ValueError, match="rows 0 and 1 continue prompt row 0 but carry"):
        sample(params, cfg, prompts, pmask, jax.random.key(4), tau, sc, iv)
    with pytest.raises(ValueError, match=r"prefill_rows must give each of the 12 rows"):
        sample(params, cfg, prompts, pmask, jax.random.key(4), tau, sc, None, jnp.arange(b))


def test_readout_matches_full_forward(tiny):
    params, cfg, prompts, pmask = tiny
    r = sample(
        params,
        cfg,
        prompts,
        pmask,
        jax.random.key(6),
        jnp.ones((Q, T)),
        SamplingConfig(T),
        Interventions(readout_layer=1),
    )
    for b in range(Q):
        n = int(pmask[b].sum())
        seq = jnp.concatenate([prompts[b][pmask[b]], r.tokens[b]])[None]
        ref = forward(
            params,
            cfg,
            seq,
            jnp.arange(seq.shape[1])[None],
            jnp.ones_like(seq, bool),
            None,
            Interventions(readout_layer=1),
        ).readout[0]
        assert_float32_close(r.readout[b, : T - 1], ref[n : n + T - 1])


def test_bad_sampling_arguments(tiny):
    params, cfg, prompts, pmask = tiny
    with pytest.raises(ValueError, match="top_p=0"):
        SamplingConfig(4, top_p=0.0)
    with pytest.raises(ValueError, match="temperature table has 3 positions"):
        sample(
            params,
            cfg,
            prompts,
            pmask,
            jax.random.key(0),
            jnp.ones((Q, 3)),
            SamplingConfig(4),
        )


@pytest.mark.parametrize("top_p,top_k", [(0.9, 0), (0.995, 0), (0.8, 300), (1.0, 0)])
def test_choose_with_a_large_vocabulary(top_p, top_k):
    """Shortlist path, full-vocabulary fallback, top-k above the shortlist, multi-block CDF."""
    from explore_rl.sampling.sampler import choose

    b, v = 16, 1000
    logits = 3.0 * jax.random.normal(jax.random.key(0), (b, v))
    tau = jnp.linspace(0.3, 4.0, b)
    c = choose(
        logits,
        tau,
        jax.random.uniform(jax.random.key(1), (b,)),
        SamplingConfig(1, top_p=top_p, top_k=top_k),
    )
    sizes, mu, ent = [], np.zeros(b), np.zeros(b)
    for i in range(b):
        q = reference_truncated_logprob(np.asarray(logits[i]), float(tau[i]), top_p, top_k)
        sizes.append(np.isfinite(q).sum())
        assert np.isfinite(q[int(c.token[i])])
        mu[i] = q[int(c.token[i])]
        qf = q[np.isfinite(q)]
        ent[i] = -(np.exp(qf) * qf).sum()
    scale = float(np.abs(logits / tau[:, None]).max())  # the tempered logits
    assert_float32_close(c.logprob, mu, scale=scale)
    assert_float32_close(c.sampling_entropy, ent, scale=scale)
    if (top_p, top_k) == (0.995, 0):
        assert max(sizes) > 256  # some row needed the full-vocabulary path


def test_inverse_cdf_frequencies_across_blocks():
    from explore_rl.sampling.sampler import choose

    n, v = 20000, 600  # 600 tokens: three 256-token blocks, the last one padded
    logits = 2.0 * jax.random.normal(jax.random.key(3), (v,))
    c = choose(
        jnp.broadcast_to(logits, (n, v)),
        jnp.ones(n),
        jax.random.uniform(jax.random.key(4), (n,)),
        SamplingConfig(1),
    )
    counts = np.bincount(np.asarray(c.token), minlength=v)
    expected = n * np.exp(log_softmax(np.asarray(logits)))
    assert chi_square_pvalue(counts, expected, min_bins=100) > 1e-3
