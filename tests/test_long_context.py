"""Long sequences: blockwise attention, rematerialised layers, chunked log-probs and
token-budget micro-batches give what the dense, whole path gives (values and gradients,
every mask the model uses), and the update's memory grows linearly in the length."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import assert_float32_close, left_padded_batch, score

from configs import grpo
from explore_rl import config as config_lib
from explore_rl.models import presets, transformer
from explore_rl.models.transformer import Interventions
from explore_rl.rl import losses
from explore_rl.rl.train_step import (
    Batch,
    OptimConfig,
    _loss,
    init_state,
    make_optimizer,
    plan_micro_batches,
    train_step,
)
from explore_rl.sampling import engine
from explore_rl.sampling.engine import EngineConfig
from explore_rl.sampling.sampler import SamplingConfig, sample

pytestmark = [pytest.mark.usefixtures("highest_precision"), pytest.mark.numerics]

FAMILIES = tuple(n for n in presets.PRESETS if n.startswith("tiny-"))  # the test sizes
Q, G, T = 3, 4, 11  # 11 response tokens, 9-token prompts: several 4-token tiles each way
DENSE = dict(attention="dense", remat="none", logits_chunk=4096)
LONG = dict(attention="blockwise", attention_block=4, remat="block", logits_chunk=3)


def _model(name, **kw):
    cfg = presets.get_preset(name, **kw)
    return transformer.init_params(cfg, jax.random.key(1), scale=0.3), cfg


def _rows(seed=0):
    """Q left-padded prompts (lengths 9, 5, 2) and B = Q x G responses with their own
    lengths (1..T tokens: right padding inside the update's rows)."""
    rng = np.random.default_rng(seed)
    prompts, pmask = left_padded_batch(rng, [9, 5, 2], 64, 9)
    tokens = rng.integers(1, 64, (Q * G, T)).astype(np.int32)
    lengths = rng.integers(1, T + 1, Q * G)
    mask = np.arange(T)[None] < lengths[:, None]
    return tuple(map(jnp.asarray, (prompts, pmask, tokens, mask)))


@pytest.mark.parametrize("name", FAMILIES)
def test_blockwise_prefill_and_scoring_equal_the_dense_path(name):
    """A left-padded forward, and the update's scoring (prompts shared by their group, the
    rows causal after them), at 4-token tiles against dense attention."""
    params, cfg = _model(name, **DENSE)
    long = cfg.replace(**LONG)
    prompts, pmask, tokens, mask = _rows()
    pos = transformer.positions_from_mask(pmask)
    dense = transformer.forward(params, cfg, prompts, pos, pmask).logits
    tiled = transformer.forward(params, long, prompts, pos, pmask).logits
    m = np.asarray(pmask)
    assert_float32_close(np.asarray(tiled)[m], np.asarray(dense)[m])
    ref = score(params, cfg, prompts, pmask, tokens, mask)
    out = score(params, long, prompts, pmask, tokens, mask)
    r = np.asarray(mask)
    scale = float(np.abs(np.asarray(dense)).max())  # the logits the log-probs come from
    for a, b in zip(out, ref):
        assert_float32_close(np.asarray(a)[r], np.asarray(b)[r], scale=scale)


def test_gradients_equal_with_blockwise_attention_remat_and_chunks():
    """The update's loss and its gradient (TIS, entropy bonus and KL on, so every stream's
    gradient flows) are the dense path's under each memory setting, and with the layers
    scanned (each layer's gradient out of the stacked weights' one)."""
    params, cfg = _model("tiny-qwen2", **DENSE)
    prompts, pmask, tokens, mask = _rows(1)
    rng = np.random.default_rng(2)
    old = jnp.asarray(-rng.random((Q * G, T)) * 3, jnp.float32)
    batch = Batch(
        prompts, pmask, tokens, mask,
        advantages=jnp.asarray(rng.normal(size=Q * G), jnp.float32),
        behaviour_logp=old - 0.1, old_logp=old, weights=jnp.ones(Q * G),
        ref_logp=old + 0.05,
    )  # fmt: skip
    lc = losses.LossConfig(tis_cap=2.0, entropy_coef=0.01, kl_coef=0.1)
    n = jnp.sum(mask)

    def loss_and_grads(c):
        f = jax.jit(jax.value_and_grad(lambda p: _loss(p, c, lc, batch, n)[0]))
        return f(params)

    ref_loss, ref_grads = loss_and_grads(cfg)
    variants = [
        LONG,
        dict(LONG, remat="dots"),
        dict(attention="auto", attention_block=4),
        dict(LONG, scan_layers=True),
    ]
    for kw in variants:
        loss, grads = loss_and_grads(cfg.replace(**kw))
        assert_float32_close(loss, ref_loss, err_msg=str(kw))
        for (path, a), b in zip(
            jax.tree_util.tree_leaves_with_path(grads), jax.tree.leaves(ref_grads)
        ):
            assert_float32_close(a, b, ulps=1024, err_msg=f"{kw} {jax.tree_util.keystr(path)}")


def test_appended_slots_steering_and_slot_decode_under_blockwise_attention():
    """EDEN's appended slots (a masked one exactly the clean forward), ASE's steering and
    per-row decode positions in the slot engine, at 4-token tiles: the dense path's
    tokens and mu."""
    params, cfg = _model("tiny-llama", **DENSE)
    long = cfg.replace(attention="blockwise", attention_block=4)
    prompts, pmask, *_ = _rows(3)
    b, t = Q * G, 9
    extra_mask = jnp.asarray(np.random.default_rng(4).random((b, 2)) < 0.5).at[0].set(False)
    iv = Interventions(
        extra_embeds=jax.random.normal(jax.random.key(5), (b, 2, cfg.d_model)),
        extra_mask=extra_mask,
        steer=jnp.repeat(jax.random.normal(jax.random.key(6), (Q, cfg.d_model)), G, axis=0),
        steer_layer=0,
    )
    temps = jnp.ones((b, t))
    config = SamplingConfig(t, stop_ids=(5, 9))
    ref = sample(params, cfg, prompts, pmask, jax.random.key(7), temps, config, iv)
    out = sample(params, long, prompts, pmask, jax.random.key(7), temps, config, iv)
    np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(ref.tokens))
    assert_float32_close(out.logprobs, ref.logprobs, scale=10.0)
    slotted, _ = engine.generate(
        params, long, prompts, pmask, jax.random.key(7), temps, config, EngineConfig(5, 3), iv
    )
    np.testing.assert_array_equal(np.asarray(slotted.tokens), np.asarray(ref.tokens))
    assert_float32_close(slotted.logprobs, ref.logprobs, scale=10.0)
    # a row whose appended slots are all masked is exactly the row without them
    clean = sample(
        params, long, prompts, pmask, jax.random.key(7), temps, config,
        iv.replace(extra_mask=jnp.zeros_like(extra_mask)),
    )  # fmt: skip
    plain = sample(
        params, long, prompts, pmask, jax.random.key(7), temps, config,
        Interventions(steer=iv.steer, steer_layer=0),
    )  # fmt: skip
    np.testing.assert_array_equal(np.asarray(clean.logprobs), np.asarray(plain.logprobs))


def test_scanned_layers_give_the_unrolled_layers_results():
    """`scan_layers` (one compiled layer over the stacked weights) on 4 layers, cut into
    scans at the steered and the read-out layers: the forward with EDEN's appended slots,
    ASE's steering and a readout, and the update's scoring (each prompt's cache filled by a
    scan, the rows after it scanned over their shared prefix) give the unrolled path's
    values. (The update's gradient: `test_gradients_equal_with_...`.)"""
    params, cfg = _model("tiny-qwen3", n_layers=4, **LONG)
    scan = cfg.replace(scan_layers=True)
    prompts, pmask, tokens, mask = _rows(13)
    b = Q * G
    rows = np.repeat(np.arange(Q), G)
    iv = Interventions(
        extra_embeds=jax.random.normal(jax.random.key(15), (b, 2, cfg.d_model)),
        extra_mask=jnp.asarray(np.random.default_rng(16).random((b, 2)) < 0.5),
        steer=jax.random.normal(jax.random.key(17), (b, cfg.d_model)),
        steer_layer=1,
        readout_layer=2,
    )
    forward = jax.jit(transformer.forward, static_argnums=1)
    inputs = (prompts[rows], transformer.positions_from_mask(pmask[rows]), pmask[rows])
    ref, out = (forward(params, c, *inputs, interventions=iv) for c in (cfg, scan))
    m = np.asarray(pmask[rows])
    for name in ("logits", "readout"):
        got, want = np.asarray(getattr(out, name)), np.asarray(getattr(ref, name))
        assert_float32_close(got[m], want[m], err_msg=name)
    assert_float32_close(out.extra_logits, ref.extra_logits)
    scores = jax.jit(score, static_argnums=1)
    r = np.asarray(mask)
    for got, want in zip(*(scores(params, c, prompts, pmask, tokens, mask) for c in (scan, cfg))):
        assert_float32_close(
            np.asarray(got)[r], np.asarray(want)[r], scale=float(np.abs(ref.logits).max())
        )


def test_token_budget_micro_batches_cover_every_group_once_at_its_length():
    rng = np.random.default_rng(8)
    lengths = rng.integers(1, 200, (13, 4))
    oc = OptimConfig(micro_batch_tokens=2000)
    plan = plan_micro_batches(lengths, oc, prompt_len=48, t=200, shards=2)
    live = np.concatenate([p.groups[p.live] for p in plan])
    assert sorted(live) == list(range(13))  # each group once
    for p in plan:
        assert len(p.groups) % 2 == 0  # whole groups on each of the 2 batch shards
        longest = lengths[p.groups[p.live]].max()
        assert longest <= p.length <= 200
        # rows cut to the fine grid: under a quarter of padding past the longest
        assert p.length < 1.25 * longest or p.length == 16
        # within the budget per shard, unless one group a shard is already over it
        per_shard = len(p.groups) // 2 * (48 + 4 * p.length)
        assert per_shard <= 2000 or len(p.groups) == 2
    # longest first: every micro-batch's rows are no longer than the one before's
    assert [p.length for p in plan] == sorted((p.length for p in plan), reverse=True)
    equal = plan_micro_batches(lengths, OptimConfig(), prompt_len=48, t=200)
    assert len(equal) == 1 and equal[0].length == 200 and equal[0].live.all()
    # a budget wider than the step: its 3 groups and one filler, not the budget's 80 a shard
    (whole,) = plan_micro_batches(lengths[:3], OptimConfig(micro_batch_tokens=10**5), 48, 200, 2)
    assert len(whole.groups) == 4 and whole.live.sum() == 3


def test_a_token_budget_gives_the_whole_batch_update():
    """Micro-batches cut by tokens (groups sorted, rows cut short) sum to the one-batch
    gradient: the same loss and params after an optimizer step."""
    params, cfg = _model("tiny-llama")
    prompts, pmask, tokens, mask = _rows(9)
    old, _ = score(params, cfg, prompts, pmask, tokens, mask)
    adv = jax.random.normal(jax.random.key(10), (Q * G,))
    batch = Batch(prompts, pmask, tokens, mask, adv, old, old, jnp.ones(Q * G))
    lc = losses.LossConfig(aggregation="seq_mean_token_mean")
    out = []
    for oc in (OptimConfig(lr=1e-3), OptimConfig(lr=1e-3, micro_batch_tokens=40)):
        opt = make_optimizer(oc)
        state = init_state(jax.tree.map(jnp.copy, params), opt)
        state, metrics = train_step(state, batch, cfg, lc, oc, opt)
        out.append((state.params, metrics))
    (p1, m1), (p2, m2) = out
    assert_float32_close(m2["train/loss"], m1["train/loss"])
    for k in ("policy/entropy", "policy/approx_kl", "policy/clip_frac_low"):
        assert_float32_close(m2[k], m1[k], scale=1.0, err_msg=k)
    for a, b in zip(jax.tree.leaves(p2), jax.tree.leaves(p1)):
        # Adam moves every weight by ~lr: the update's rounding is lr's, not the weight's
        assert_float32_close(a, b, scale=1e-3, ulps=2048)


def test_log_probs_past_a_rows_end_do_not_reach_the_update():
    """Scoring cuts a row at its own micro-batch's length and leaves 0 past it; the update
    may cut it longer. Whatever the stored log-probs there (here 200: exp(200) overflows
    float32), the loss and gradients are those of a batch without them."""
    params, cfg = _model("tiny-qwen2")
    prompts, pmask, tokens, mask = _rows(11)
    old, _ = score(params, cfg, prompts, pmask, tokens, mask)
    lc = losses.LossConfig(tis_cap=2.0, kl_coef=0.1)
    adv = jax.random.normal(jax.random.key(12), (Q * G,))

    def loss_and_grads(stored):
        batch = Batch(prompts, pmask, tokens, mask, adv, stored, stored, jnp.ones(Q * G), stored)
        f = jax.jit(jax.value_and_grad(lambda p: _loss(p, cfg, lc, batch, jnp.sum(mask))[0]))
        return f(params)

    loss, grads = loss_and_grads(jnp.where(mask, old, 200.0))
    ref_loss, ref_grads = loss_and_grads(old)
    assert np.isfinite(loss) and loss == ref_loss
    for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(ref_grads)):
        np.testing.assert_array_equal(a, b)  # the same program on equal values


def _update_temp_bytes(cfg, t: int) -> int:
    """XLA's working memory (buffers beyond arguments and outputs) for the gradient of the
    update's loss over one prompt and 2 rows of t response tokens."""
    params = jax.eval_shape(lambda: transformer.init_params(cfg, jax.random.key(0)))
    prompts = jax.ShapeDtypeStruct((1, 16), jnp.int32)
    rows = jax.ShapeDtypeStruct((2, t), jnp.int32)
    masks = (jax.ShapeDtypeStruct((1, 16), bool), jax.ShapeDtypeStruct((2, t), bool))
    f32 = jax.ShapeDtypeStruct((2, t), jnp.float32)
    batch = Batch(prompts, masks[0], rows, masks[1], jax.ShapeDtypeStruct((2,), jnp.float32),
                  f32, f32, jax.ShapeDtypeStruct((2,), jnp.float32))  # fmt: skip
    lc = losses.LossConfig()
    grad = jax.grad(lambda p, b: _loss(p, cfg, lc, b, 1.0)[0])
    return jax.jit(grad).lower(params, batch).compile().memory_analysis().temp_size_in_bytes


@pytest.mark.slow
def test_the_update_memory_grows_linearly_with_the_length():
    """From 512 to 2048 response tokens (4x): the dense path's working memory grows ~16x
    (the [T, S] scores of every layer are kept for the backward), the blockwise one's
    about 4x."""
    _, cfg = _model("tiny-llama", **DENSE)
    long = cfg.replace(attention="blockwise", attention_block=128, logits_chunk=128)
    dense = _update_temp_bytes(cfg, 2048) / _update_temp_bytes(cfg, 512)
    tiled = _update_temp_bytes(long, 2048) / _update_temp_bytes(long, 512)
    assert dense > 10 and tiled < 5, (dense, tiled)


def test_memory_settings_are_checked():
    for kw, message in (
        (dict(attention="flash"), "attention='flash'"),
        (dict(remat="all"), "remat='all'"),
        (dict(attention_block=0), "attention_block=0"),
        (dict(logits_chunk=0), "logits_chunk=0"),
    ):
        with pytest.raises(ValueError, match=message):
            presets.get_preset("tiny-llama", **kw)
    assert dataclasses.replace(presets.get_preset("tiny-llama"), remat="dots").remat == "dots"
    c = grpo.get_config("smoke")
    c.optim.micro_batch_tokens, c.optim.micro_batches = 4096, 2
    with pytest.raises(ValueError, match="micro_batches=2 with optim.micro_batch_tokens=4096"):
        config_lib.spec(c)
