"""The rollout engine: rows scheduled over fewer decode slots give the one-pass rollout."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import assert_float32_close, left_padded_batch, logit_scale

from configs import grpo
from explore_rl import config as config_lib
from explore_rl.logs import read_metrics
from explore_rl.models import presets, transformer
from explore_rl.models.transformer import Interventions
from explore_rl.sampling import engine, sampler
from explore_rl.sampling.engine import EngineConfig
from explore_rl.sampling.sampler import SamplingConfig
from explore_rl.train import loop

pytestmark = [pytest.mark.usefixtures("highest_precision"), pytest.mark.numerics]

Q, G, T = 4, 8, 24
B = Q * G
STOPS = (5, 9, 11)  # frequent enough in the tiny model that lengths run from 1 to T
FLOATS = ("logprobs", "entropy", "sampling_entropy")


@pytest.fixture(scope="module")
def tiny():
    cfg = presets.get_preset("tiny-qwen2")
    params = transformer.init_params(cfg, jax.random.key(1), scale=0.4)
    tokens, mask = left_padded_batch(np.random.default_rng(3), [7, 3, 5, 6], 64, 8)
    return params, cfg, jnp.asarray(tokens), jnp.asarray(mask)


def run(tiny, slots, chunk=16, temperature=None, seed=0, config=None, window=256, **kw):
    params, cfg, prompts, pmask = kw.pop("model", tiny)
    return engine.generate(
        params,
        cfg,
        prompts,
        pmask,
        jax.random.key(seed),
        jnp.ones((B, T)) if temperature is None else temperature,
        config or SamplingConfig(T, stop_ids=STOPS),
        EngineConfig(slots, chunk, window),
        **kw,
    )


def row_prompts(model, prefill_rows=None):
    """Each of the B rows' own prompt row and mask (row b continues prompt b // G)."""
    _, _, prompts, pmask = model
    rows = np.arange(B) // (B // prompts.shape[0]) if prefill_rows is None else prefill_rows
    return prompts[rows], pmask[rows]


def scales(model, ref, temperature=None, steer=None, prefill_rows=None):
    """The magnitude each float of the rows is computed from (`assert_same_rows`): the
    logits for the entropy, the tempered logits for mu and the sampling entropy."""
    params, cfg, _, _ = model
    p, pm = row_prompts(model, prefill_rows)
    iv = None if steer is None else Interventions(steer=steer, steer_layer=0)
    tau = 1.0 if temperature is None else temperature
    plain = logit_scale(params, cfg, p, pm, ref.tokens, ref.mask, 1.0, iv)
    hot = logit_scale(params, cfg, p, pm, ref.tokens, ref.mask, tau, iv)
    return {"logprobs": hot, "entropy": plain, "sampling_entropy": hot}


def assert_same_rows(out, ref, exact: bool, scale=None):
    """Tokens, masks and stops identical; floats bit for bit (`exact`) or to the float
    rounding of a batch of another width (XLA CPU picks its kernels by shape and CPU) of
    the magnitudes they come from: `scale` (`scales`) for the log-probs and entropies,
    the readout's own."""
    for name in ("tokens", "mask", "finished"):
        np.testing.assert_array_equal(
            np.asarray(getattr(out, name)), np.asarray(getattr(ref, name))
        )
    floats = FLOATS + (("readout",) if ref.readout is not None else ())
    for name in floats:
        a, b = np.asarray(getattr(out, name)), np.asarray(getattr(ref, name))
        if exact:
            np.testing.assert_array_equal(a, b, err_msg=name)
        else:
            assert_float32_close(a, b, scale=scale.get(name), err_msg=name)


def test_rows_do_not_depend_on_slots_chunks_or_refill_order(tiny):
    ref, one = run(tiny, slots=0)
    lengths = np.asarray(ref.lengths)
    assert lengths.min() <= 2 and (lengths == T).sum() >= 4 and len(set(lengths)) > 10
    assert one.refills == 0 and one.slots == B
    scale = scales(tiny, ref)
    for slots in (B // 4, 3):
        by_chunk = {}
        for chunk in (1, 7):
            out, stats = run(tiny, slots, chunk)
            assert stats.refills == B - slots  # every row after the first S took a freed slot
            assert_same_rows(out, ref, exact=False, scale=scale)
            by_chunk[chunk] = out
        # one slot width, two schedules (chunk 1 refills after every step, chunk 7 lets
        # slots idle and rows enter other slots): the same programs on the same shapes, so
        # the same bits
        assert_same_rows(by_chunk[7], by_chunk[1], exact=True)


def test_stats_count_the_work(tiny):
    ref, one = run(tiny, slots=0)
    out, stats = run(tiny, slots=B // 4, chunk=3)
    lengths = np.asarray(ref.lengths)
    for s in (one, stats):
        assert s.useful_tokens == lengths.sum() and s.rows == B
        assert s.prefill_s > 0 and s.decode_s > 0
    assert one.steps == lengths.max() - 1
    assert one.occupancy == pytest.approx((lengths - 1).sum() / (B * (lengths.max() - 1)))
    # a slot feeds at most one useful token per step: the steps are at least the work
    # divided by the slots, and the long rows are the tail
    assert stats.steps >= (lengths - 1).sum() / stats.slots
    assert 0 < one.occupancy < stats.occupancy <= 1
    merged = engine.merge_metrics([one, stats])
    assert merged["rollout/useful_tokens"] == 2 * lengths.sum()
    assert merged["rollout/slot_occupancy"] == pytest.approx(
        2 * (lengths - 1).sum() / (one.slots * one.steps + stats.slots * stats.steps)
    )


def per_row_settings(tiny):
    """Temperature rows (greedy ones too), top-p, steering routes laid out inside groups,
    appended slots, a readout and prompts with response prefixes: `run`'s keywords."""
    params, cfg, prompts, pmask = tiny
    # two routes per problem, interleaved in each group; the second route's prompt row
    # carries a response prefix (three tokens after the question)
    p, m = np.asarray(prompts), np.asarray(pmask)
    prompt_rows = np.concatenate([np.pad(p, ((0, 0), (3, 0))), np.concatenate([p, p[:, -3:]], 1)])
    prompt_mask = np.concatenate(
        [np.pad(m, ((0, 0), (3, 0))), np.pad(m, ((0, 0), (0, 3)), constant_values=True)]
    )
    route = np.arange(B) % 2
    prefill_rows = jnp.asarray(np.arange(B) // G + Q * route, jnp.int32)
    vectors = jax.random.normal(jax.random.key(2), (2 * Q, cfg.d_model))
    extra = jax.random.normal(jax.random.key(3), (B, 2, cfg.d_model))
    extra_mask = jnp.asarray(np.random.default_rng(4).random((B, 2)) < 0.6)
    iv = Interventions(
        extra_embeds=extra,
        extra_mask=extra_mask,
        steer=vectors[prefill_rows],
        steer_layer=0,
        readout_layer=1,
    )
    tau = jax.random.uniform(jax.random.key(5), (B, T), minval=0.3, maxval=1.6)
    tau = tau.at[::5].set(0.0)  # greedy rows
    model = (params, cfg, jnp.asarray(prompt_rows), jnp.asarray(prompt_mask))
    return dict(
        model=model,
        temperature=tau,
        config=SamplingConfig(T, top_p=0.9, stop_ids=STOPS),
        interventions=iv,
        prefill_rows=prefill_rows,
    )


def test_per_row_settings_follow_their_row_through_refills(tiny):
    """Each setting on the row that carries it, whichever slot it lands in."""
    kw = per_row_settings(tiny)
    ref, _ = run(tiny, slots=0, **kw)
    assert ref.readout is not None and np.asarray(ref.readout).any()
    iv, rows = kw["interventions"], kw["prefill_rows"]
    scale = scales(kw["model"], ref, kw["temperature"], iv.steer, rows)
    for slots, chunk in ((5, 3), (B // 4, 1)):
        out, stats = run(tiny, slots, chunk, **kw)
        assert stats.refills == B - slots
        assert_same_rows(out, ref, exact=False, scale=scale)


def test_window_follows_the_furthest_live_slot():
    assert [sampler.window_for(4, r, T) for r in (1, 4, 5, 9, 17, 100)] == [4, 4, 8, 16, 24, 24]
    assert sampler.window_for(0, 1, T) == T
    with pytest.raises(ValueError, match="window=-1: must be >= 0"):
        sampler.window_for(-1, 1, T)  # the library's callers: not a loop without end


def recorded_windows(monkeypatch) -> list[int]:
    """The windows the decodes pick from here on, in order."""
    windows, window_for = [], sampler.window_for

    def recorded(base, reach, n_new):
        windows.append(window_for(base, reach, n_new))
        return windows[-1]

    monkeypatch.setattr(sampler, "window_for", recorded)
    return windows


def test_attention_window_changes_only_float_rounding(tiny, monkeypatch):
    """Chunks that attend only the first W response slots (W growing 4, 8, 16, 24 as the
    slots' rows advance) give every row the tokens of chunks that attend all T, and its
    floats to rounding: masked slots add exact zeros, but a reduction over W slots may be
    grouped unlike one over T (on CPU some shapes keep the bits, others do not). With
    every per-row setting, for two slot counts, each against another chunk size."""
    windows = recorded_windows(monkeypatch)
    kw = per_row_settings(tiny)
    for slots in (5, B // 4):
        ref, _ = run(tiny, slots, chunk=1, window=0, **kw)
        assert set(windows) == {T}
        windows.clear()
        out, _ = run(tiny, slots, chunk=3, window=4, **kw)
        assert {4, 8, 16, T} <= set(windows), windows
        windows.clear()
        scale = scales(kw["model"], ref, kw["temperature"], kw["interventions"].steer,
                       kw["prefill_rows"])  # fmt: skip
        assert_same_rows(out, ref, exact=False, scale=scale)


@pytest.mark.parametrize("settings", ["greedy", "sampled", "short", "per_row"])
def test_one_pass_window_changes_only_float_rounding(tiny, monkeypatch, settings):
    """The one pass (slots 0) in segments attending the first 4, 8, 16, 24 response slots
    gives every row window 0's tokens, and its floats to rounding (as the engine's chunks):
    greedy, sampled with a fixed key, and with every
    per-row setting (EDEN's appended slots, ASE's steering and readout, top-p, response
    prefixes); rows stop mid-way, prompts are left-padded. The host runs the segments up
    to the one in which the last row stops (`short`: every row within 16 tokens, so the
    last segment never runs); one program a window, all T being window 0's."""
    windows = recorded_windows(monkeypatch)
    kw = {
        "greedy": dict(temperature=jnp.zeros((B, T))),
        "sampled": {},
        "short": dict(config=SamplingConfig(T, stop_ids=tuple(range(1, 64, 4)))),
        "per_row": per_row_settings(tiny),
    }[settings]
    ref, _ = run(tiny, 0, window=0, **kw)
    assert windows == [T]
    lengths = np.asarray(ref.lengths)
    assert lengths.min() < T // 2 and (lengths.max() < 16) == (settings == "short"), lengths
    windows.clear()
    before = sampler.decode_segment._cache_size()
    out, _ = run(tiny, 0, window=4, **kw)
    # segment W runs the steps writing slots below W; the longest row's last is slot L - 2
    ladder = [4, 8, 16, T]
    last = next(i for i, w in enumerate(ladder) if w > lengths.max() - 2)
    assert windows == ladder[: last + 1], (windows, lengths.max())
    if settings == "per_row":  # the only test of these shapes and windows
        assert sampler.decode_segment._cache_size() - before == len(set(windows) - {T})
    iv = kw.get("interventions")
    scale = scales(kw.get("model", tiny), ref, kw.get("temperature"),
                   iv and iv.steer, kw.get("prefill_rows"))  # fmt: skip
    assert_same_rows(out, ref, exact=False, scale=scale)


def test_one_token_responses(tiny):
    config = SamplingConfig(1, stop_ids=STOPS)
    ref, _ = run(tiny, 0, temperature=jnp.ones((B, 1)), config=config)
    out, stats = run(tiny, 3, temperature=jnp.ones((B, 1)), config=config)
    assert_same_rows(out, ref, exact=False, scale=scales(tiny, ref))
    assert stats.steps == 0 and stats.useful_tokens == B


def test_no_recompile_across_length_mixes(tiny):
    first, _ = run(tiny, slots=5, chunk=4, seed=0)
    programs = (engine._prefill_prompts, engine._empty, engine._enter, engine._chunk)
    before = [p._cache_size() for p in programs]
    tau = jax.random.uniform(jax.random.key(9), (B, T), minval=0.5, maxval=1.5)
    second, stats = run(tiny, slots=5, chunk=4, temperature=tau, seed=1)
    assert not np.array_equal(np.asarray(first.lengths), np.asarray(second.lengths))
    assert stats.refills == B - 5
    assert [p._cache_size() for p in programs] == before


@pytest.mark.parametrize("slots,chunk", [(-1, 4), (4, 0)])
def test_bad_engine_settings_name_the_key(slots, chunk):
    with pytest.raises(ValueError, match="slots=.*chunk="):
        EngineConfig(slots, chunk)
    with pytest.raises(ValueError, match="window=-1"):
        EngineConfig(4, 4, window=-1)


@pytest.mark.slow
def test_training_and_evaluation_run_on_the_engine(tmp_path):
    """The smoke run with 3 decode slots for its 8 rows a step (and its evaluation's)
    logs what the one-pass run logs, and what the engine did."""

    def metrics(slots):
        c = grpo.get_config("smoke")
        c.train.steps, c.train.eval_every = 2, 2
        c.rollout.slots, c.rollout.decode_chunk = slots, 3
        loop.train(config_lib.spec(c), str(tmp_path / str(slots)))
        return read_metrics(str(tmp_path / str(slots)))

    one, slotted = metrics(0), metrics(3)
    rows = 2 * 4  # smoke: 2 prompts x 4 rollouts
    scheduling = ("time/", "perf/", "rollout/slot_occupancy", "rollout/refills")
    for a, b in zip(one, slotted):
        assert a["rollout/refills"] == 0 and b["rollout/refills"] == rows - 3
        assert a["rollout/useful_tokens"] == b["rollout/useful_tokens"] > 0
        same = {k: v for k, v in a.items() if not k.startswith(scheduling)}
        assert set(same) <= set(b) and "eval/arithmetic/pass@1" in one[-1]
        # means of rewards, lengths, log-probs and entropies: the largest magnitude any is
        # computed from is the log-probs' (~ln V, 10.8, for the near-uniform smoke model)
        scale = max(abs(a["rollout/entropy"]), 1.0)
        for k, v in same.items():
            assert_float32_close(b[k], v, scale=scale, err_msg=k)
