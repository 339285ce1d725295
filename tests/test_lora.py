"""LoRA adapters (models/lora.py): the forward with adapters, their gradients, what trains,
and PEFT's format in and out."""

import functools
import json
import re
import shutil
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import (
    assert_float32_close,
    forward,
    left_padded_batch,
    make_hf_checkpoint,
    run_on_devices,
    torch_logits,
)

from configs import grpo
from explore_rl import caching, checkpoint, testing
from explore_rl import config as config_lib
from explore_rl.logs import read_metrics
from explore_rl.models import family, lora, presets, transformer, weights
from explore_rl.models.lora import LoraConfig
from explore_rl.models.transformer import positions_from_mask
from explore_rl.modes import export
from explore_rl.rl import losses
from explore_rl.rl.scoring import score
from explore_rl.rl.train_step import Batch, OptimConfig, init_state, make_optimizer, train_step
from explore_rl.train import build, loop, sft


def _setup(name="tiny-qwen2", rank=2, targets=lora.ALL_TARGETS, rslora=False, **kw):
    cfg = presets.get_preset(name, **kw)
    cfg = cfg.replace(lora=LoraConfig(rank, alpha=3.0, targets=targets, rslora=rslora))
    base = transformer.init_params(cfg, jax.random.key(0))
    return cfg, base, lora.init(cfg, jax.random.key(1))


def _batch(cfg, b=2, t=6):
    tokens = jax.random.randint(jax.random.key(2), (b, t), 0, cfg.vocab_size)
    mask = jnp.ones((b, t), bool).at[0, :2].set(False)
    return tokens, transformer.positions_from_mask(mask), mask


def _nonzero_b(adapters, key=3):
    """Adapters whose B is random (a trained adapter), so every term is exercised."""
    leaves, tree = jax.tree.flatten_with_path(adapters)
    keys = jax.random.split(jax.random.key(key), len(leaves))
    out = [
        0.1 * jax.random.normal(k, x.shape) if p[-1].key.endswith(family.LORA_B) else x
        for k, (p, x) in zip(keys, leaves)
    ]
    return jax.tree.unflatten(tree, out)


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen2", "tiny-qwen3"])
def test_new_adapters_leave_the_base_model_bit_for_bit(name):
    cfg, base, adapters = _setup(name)
    tokens, pos, mask = _batch(cfg)
    plain = transformer.forward(base, cfg, tokens, pos, mask).logits
    adapted = transformer.forward(lora.attach(base, adapters), cfg, tokens, pos, mask).logits
    np.testing.assert_array_equal(np.asarray(adapted), np.asarray(plain))


def test_adapters_init_as_peft_does():
    cfg, _, adapters = _setup(rank=4)
    a, b = adapters["layers"][0]["q_lora_a"], adapters["layers"][0]["q_lora_b"]
    assert a.shape == (cfg.d_model, 4) and b.shape == (4, cfg.n_heads, cfg.head_dim)
    assert a.dtype == jnp.float32 and not np.any(np.asarray(b))
    bound = 1 / np.sqrt(cfg.d_model)  # kaiming_uniform_(a=sqrt(5)) on [r, in]
    assert np.abs(np.asarray(a)).max() <= bound and np.abs(np.asarray(a)).max() > 0.8 * bound
    o = adapters["layers"][0]["o_lora_a"]  # o's input is every head's output
    assert o.shape == (cfg.n_heads, cfg.head_dim, 4)


def _merged_loss_grads(cfg, base, adapters, tokens, pos, mask):
    """d loss / dA, dB through the merged weight W' = W + s A B by the chain rule:
    dA = s dW' B^T, dB = s A^T dW' (the weight's input dims flattened)."""
    merged = lora.merged(lora.attach(base, adapters), cfg)

    def loss(params):
        return jnp.sum(transformer.forward(params, cfg, tokens, pos, mask).logits ** 2) * 1e-3

    g = jax.grad(loss)(merged)
    s, out = cfg.lora.scale, []
    for lg, ad in zip(g["layers"], adapters["layers"]):
        layer = {}
        for name in cfg.lora.targets:
            a, b = ad[name + family.LORA_A], ad[name + family.LORA_B]
            n_in = int(np.prod(a.shape[:-1]))
            dw = np.asarray(lg[name], np.float64).reshape(n_in, -1)
            a2, b2 = np.asarray(a, np.float64).reshape(n_in, -1), np.asarray(b, np.float64)
            b2 = b2.reshape(b2.shape[0], -1)
            layer[name + family.LORA_A] = (s * dw @ b2.T).reshape(a.shape)
            layer[name + family.LORA_B] = (s * a2.T @ dw).reshape(b.shape)
        out.append(layer)
    return loss, {"layers": out}


def test_adapter_gradients_are_the_merged_weights_by_the_chain_rule():
    cfg, base, adapters = _setup("tiny-qwen2", rank=3, rslora=True)
    adapters = _nonzero_b(adapters)
    tokens, pos, mask = _batch(cfg)
    loss, want = _merged_loss_grads(cfg, base, adapters, tokens, pos, mask)
    got = jax.grad(lambda ad: loss(lora.attach(base, ad)))(adapters)
    for lg, lw in zip(got["layers"], want["layers"]):
        for k in lw:
            np.testing.assert_allclose(np.asarray(lg[k]), lw[k], rtol=2e-4, atol=1e-6, err_msg=k)


def test_merged_weights_give_the_adapted_logits():
    cfg, base, adapters = _setup("tiny-llama", rank=2, targets=("v", "o", "down"))
    params = lora.attach(base, _nonzero_b(adapters))
    tokens, pos, mask = _batch(cfg)
    adapted = transformer.forward(params, cfg, tokens, pos, mask).logits
    merged = transformer.forward(lora.merged(params, cfg), cfg, tokens, pos, mask).logits
    np.testing.assert_allclose(np.asarray(merged), np.asarray(adapted), rtol=1e-5, atol=1e-5)
    plain = transformer.forward(base, cfg, tokens, pos, mask).logits
    assert not np.allclose(np.asarray(adapted), np.asarray(plain))


def test_split_and_join_separate_adapters_from_the_base():
    cfg, base, adapters = _setup(targets=("q",))
    trainable, frozen = lora.split(lora.attach(base, adapters))
    assert jax.tree.structure(trainable) == jax.tree.structure(adapters)
    assert jax.tree.structure(frozen) == jax.tree.structure(base)
    assert lora.split(base) == (base, None) and lora.base(base) is base
    joined = lora.join(trainable, frozen)
    assert set(joined["layers"][0]) == set(base["layers"][0]) | {"q_lora_a", "q_lora_b"}


@pytest.mark.parametrize(
    "settings, message",
    [
        (dict(rank=0, alpha=1.0), "rank=0: must be >= 1"),
        (dict(rank=2, alpha=1.0, targets=("q", "lm_head")), "'lm_head' is not a linear layer"),
        (dict(rank=2, alpha=1.0, targets=("q_bias",)), "'q_bias' is not a linear layer"),
        (dict(rank=17, alpha=1.0, targets=("k",)), "rank=17: larger than weight 'k' (32 x 16)"),
        (dict(rank=2, alpha=1.0, targets=("q", "q")), "need distinct weight names"),
    ],
)
def test_bad_lora_settings_are_one_line(settings, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")) as e:
        presets.get_preset("tiny-qwen2").replace(lora=LoraConfig(**settings))
    assert "\n" not in str(e.value)


def test_every_family_adapts_its_linear_layers_and_shards_adapters_by_their_weight():
    for fam in family.every():
        assert set(fam.adaptable) >= set(lora.ALL_TARGETS)
    assert family.axes("q_lora_a") == ("embed", None)
    assert family.axes("q_lora_b") == (None, "heads", "head_dim")
    assert family.axes("o_lora_a") == ("heads", "head_dim", None)
    assert family.axes("down_lora_b") == (None, "embed")


@pytest.mark.parametrize("param_dtype", ["float32", "bfloat16"])
def test_only_adapters_train_and_hold_optimizer_state(param_dtype):
    cfg, base, adapters = _setup("tiny-qwen3", rank=2, targets=("q", "v", "up"),
                                 param_dtype=param_dtype)  # fmt: skip
    q, g, t = 2, 3, 5
    prompts = jax.random.randint(jax.random.key(4), (q, 4), 0, cfg.vocab_size)
    pmask = jnp.ones((q, 4), bool)
    tokens = jax.random.randint(jax.random.key(5), (q * g, t), 0, cfg.vocab_size)
    mask = jnp.ones((q * g, t), bool)
    logp, _ = score(lora.attach(base, adapters), cfg, prompts, pmask, tokens, mask)
    batch = Batch(prompts, pmask, tokens, mask, jnp.linspace(-1.0, 1.0, q * g), logp, logp,
                  jnp.ones(q * g))  # fmt: skip
    oc = OptimConfig(lr=1e-2)
    opt = make_optimizer(oc)
    state = init_state(lora.attach(jax.tree.map(jnp.copy, base), adapters), opt)
    n_adapter = sum(x.size for x in jax.tree.leaves(adapters))
    moments = [x for x in jax.tree.leaves(state.opt_state) if x.ndim]
    assert sum(x.size for x in moments) == 2 * n_adapter  # Adam's mu and nu, adapters only
    state, metrics = train_step(state, batch, cfg, losses.LossConfig(), oc, opt)
    assert int(state.skipped) == 0 and float(metrics["train/grad_norm"]) > 0
    trained, frozen = lora.split(state.params)
    for a, b in zip(jax.tree.leaves(frozen), jax.tree.leaves(base)):
        assert a.dtype == b.dtype and np.array_equal(np.asarray(a), np.asarray(b))
    b_after = trained["layers"][0]["up_lora_b"]
    assert b_after.dtype == jnp.float32 and np.abs(np.asarray(b_after)).max() > 1e-3


def _peft_model(folder, variant):
    """A tiny HF checkpoint of `variant` in `folder` and ours: (torch model, params, cfg)."""
    torch_model = make_hf_checkpoint(folder, variant)
    params, cfg = weights.load_hf(folder)
    return torch_model, params, cfg


def _logits_pair(peft_model, params, cfg):
    rng = np.random.default_rng(0)
    tokens, mask = left_padded_batch(rng, [7, 4], cfg.vocab_size, 7)
    ours = forward(params, cfg, jnp.asarray(tokens), positions_from_mask(jnp.asarray(mask)),
                   jnp.asarray(mask)).logits  # fmt: skip
    return np.asarray(ours)[mask], torch_logits(peft_model, tokens, mask)[mask]


@pytest.mark.numerics
@pytest.mark.usefixtures("highest_precision")
@pytest.mark.parametrize("variant", ["qwen2", "llama3-scaled"])
def test_an_exported_peft_adapter_loads_in_peft_with_our_logits(variant, tmp_path):
    peft = pytest.importorskip("peft")
    torch_model, base, cfg = _peft_model(str(tmp_path / "base"), variant)
    cfg = cfg.replace(lora=LoraConfig(3, alpha=5.0, targets=("q", "k", "o", "gate", "down")))
    params = lora.attach(base, _nonzero_b(lora.init(cfg, jax.random.key(7))))
    lora.save_peft(str(tmp_path / "adapter"), params, cfg, str(tmp_path / "base"))
    model = peft.PeftModel.from_pretrained(torch_model, str(tmp_path / "adapter")).eval()
    ours, theirs = _logits_pair(model, params, cfg)
    plain = _logits_pair(model, base, cfg)[0]  # the adapters act: far beyond float rounding
    assert np.abs(ours - plain).max() > 1e-3 * np.abs(plain).max()
    assert_float32_close(ours, theirs, ulps=1024)


@pytest.mark.numerics
@pytest.mark.usefixtures("highest_precision")
def test_an_adapter_peft_wrote_loads_in_ours_with_its_logits(tmp_path):
    peft = pytest.importorskip("peft")
    torch_model, base, cfg = _peft_model(str(tmp_path / "base"), "qwen3")
    settings = peft.LoraConfig(r=2, lora_alpha=7, target_modules=["v_proj", "up_proj"],
                               use_rslora=True, init_lora_weights=False)  # fmt: skip
    model = peft.get_peft_model(torch_model, settings).eval()  # B random: not the base
    model.save_pretrained(str(tmp_path / "adapter"))
    lc = lora.read_peft_config(str(tmp_path / "adapter"))
    assert lc == LoraConfig(2, 7.0, ("v", "up"), rslora=True)
    cfg = cfg.replace(lora=lc)
    params = lora.attach(base, lora.load_peft(str(tmp_path / "adapter"), cfg))
    ours, theirs = _logits_pair(model, params, cfg)
    assert_float32_close(ours, theirs, ulps=1024)
    other = presets.get_preset("tiny-llama").replace(n_layers=3)  # another base model
    with pytest.raises(ValueError, match=r"layers\.2\.self_attn\.v_proj\.lora_A\.weight is "
                       r"missing, this model needs .* another base model"):  # fmt: skip
        lora.load_peft(str(tmp_path / "adapter"), other.replace(lora=lc))


def _lora_run_config(**lora_settings):
    """The smoke run (tiny random model) with LoRA, the KL term on, mixed groups at every
    step (so the adapters, their moments and the data position all move)."""
    c = grpo.get_config("smoke")
    c.reward.fn = testing.PARITY
    c.train.steps, c.train.checkpoint_every, c.train.eval_every = 4, 2, 0
    c.rl.kl_coef = 0.05
    c.model.lora.rank, c.model.lora.targets = 2, "q,v,o,up"
    c.optim.lr = 1e-2
    for k, v in lora_settings.items():
        c.model.lora[k] = v
    return c


@pytest.mark.slow
def test_a_lora_run_resumes_exactly_checkpoints_adapters_and_exports_both_ways(tmp_path):
    straight = loop.train(config_lib.spec(_lora_run_config()), str(tmp_path / "a"))
    skip_step_4 = lambda folder, names: ["4", "4.sha256"] if folder.endswith("checkpoints") else []  # noqa: E501, E731
    shutil.copytree(tmp_path / "a", tmp_path / "b", ignore=skip_step_4)
    resumed = loop.train(config_lib.spec(_lora_run_config()), str(tmp_path / "b"))
    a, b = read_metrics(str(tmp_path / "a")), read_metrics(str(tmp_path / "b"))
    drop = ("time/", "perf/")
    for ra, rb in zip(a, b, strict=True):
        assert {k: v for k, v in ra.items() if not k.startswith(drop)} == {
            k: v for k, v in rb.items() if not k.startswith(drop)
        }
    leaves = zip(jax.tree.leaves(straight.state), jax.tree.leaves(resumed.state), strict=True)
    assert all(np.array_equal(np.asarray(x), np.asarray(y)) for x, y in leaves)
    assert a[0]["groups/zero_adv_frac"] < 1 and all(r["groups/zero_adv_frac"] < 1 for r in a[2:])
    trained = straight.state.params
    assert np.abs(np.asarray(trained["layers"][0]["up_lora_b"])).max() > 0  # adapters moved

    # the checkpoint holds the adapters alone: no base weight is in it
    folder = str(tmp_path / "a" / "checkpoints")
    with pytest.raises(ValueError, match="no state/params/embed in the checkpoint"):
        checkpoint.restore_subset(folder, 4, {"state": {"params": lora.base(trained)}})

    # another rank on resume is another run: refused before any weight is read
    with pytest.raises(ValueError, match=r"model\.lora\.rank: 2 -> 4"):
        loop.train(config_lib.spec(_lora_run_config(rank=4)), str(tmp_path / "a"))

    # PEFT out, then a new run's start from it: the trained adapters, as they were
    c = _lora_run_config()
    c.eval.checkpoint, c.export.format = str(tmp_path / "a"), "peft"
    export.run_export(config_lib.spec(c, "export"), str(tmp_path / "peft"))
    c = _lora_run_config(rank=0, path=str(tmp_path / "peft"))
    spec = config_lib.spec(c)
    cfg, _ = spec.model.config()
    started = build.new_adapters(spec, cfg, spec.mesh.make())
    for x, y in zip(jax.tree.leaves(started), jax.tree.leaves(lora.split(trained)[0])):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))

    # the merged model: a plain HF folder whose logits are the adapted model's
    c = _lora_run_config()
    c.eval.checkpoint = str(tmp_path / "a")
    export.run_export(config_lib.spec(c, "export"), str(tmp_path / "hf"))
    merged, plain_cfg, _ = weights.load(str(tmp_path / "hf"))
    assert plain_cfg.lora is None and not lora.split(merged)[1]
    tokens, pos, mask = _batch(plain_cfg)
    want = forward(trained, cfg, tokens, pos, mask).logits
    got = forward(merged, plain_cfg, tokens, pos, mask).logits
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-4, atol=1e-5)


def test_the_memory_estimate_counts_adapters_not_the_bases_gradients_or_moments():
    from explore_rl.rl import footprint

    cfg, base, adapters = _setup("tiny-qwen2", rank=2, targets=("q", "down"))
    sizes = footprint.StepSizes(2, 8, 16, 16, 2, 8)
    opt = make_optimizer(OptimConfig())
    est = lambda c: footprint.estimate(c, {"fsdp": 1}, opt, sizes, True, (2**30, "x")).terms  # noqa: E731
    full, adapted = est(cfg.replace(lora=None)), est(cfg)
    n_base = sum(x.size * 4 for x in jax.tree.leaves(base))
    n_adapters = sum(x.size * 4 for x in jax.tree.leaves(adapters))
    assert full["params"] == n_base and adapted["params"] == n_base + n_adapters
    assert full["reference params"] == n_base and adapted["reference params"] == 0
    assert full["gradients"] == n_base and adapted["gradients"] == n_adapters
    # Adam's mu and nu of what trains, beside its step count
    assert adapted["optimizer moments"] - 2 * n_adapters == full["optimizer moments"] - 2 * n_base


@pytest.mark.slow
@pytest.mark.parametrize("method", ["eden", "ase", "extra", "ead"])
def test_every_method_trains_adapters_on_a_frozen_base(method, tmp_path):
    c = config_lib.load(f"configs/{method}.py:smoke")
    c.model.lora.rank, c.train.steps, c.train.eval_every = 2, 2, 0
    spec = config_lib.spec(c)
    progress = loop.train(spec, str(tmp_path))
    cfg, _ = spec.model.config()
    start = spec.model.load_params(spec.seed, cfg)
    trained, frozen = lora.split(progress.state.params)
    assert frozen is not None and set(trained["layers"][0]) == {
        n + s for n in lora.ALL_TARGETS for s in (family.LORA_A, family.LORA_B)
    }
    for a, b in zip(jax.tree.leaves(frozen), jax.tree.leaves(start), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    rows = read_metrics(str(tmp_path))
    assert [r["step"] for r in rows] == [1, 2]
    assert all(np.isfinite(r["train/loss"]) and r["train/skipped_updates"] == 0 for r in rows)


@pytest.mark.slow
def test_sft_trains_adapters(tmp_path):
    c = config_lib.load("configs/lab.py:sft,smoke")
    c.model.lora.rank, c.train.steps, c.train.eval_every = 4, 2, 0
    progress = sft.train_sft(config_lib.spec(c, "sft"), str(tmp_path))
    trained, frozen = lora.split(progress.state.params)
    assert frozen is not None
    assert np.abs(np.asarray(trained["layers"][0]["down_lora_b"])).max() > 0


SHARDED = textwrap.dedent("""
    import jax, jax.numpy as jnp, numpy as np
    jax.config.update("jax_default_matmul_precision", "highest")
    from explore_rl import caching
    caching.enable_compilation_cache(write=False)  # as test_sharded_step.py says why
    from explore_rl import parallel
    from explore_rl.models import family, lora, presets, transformer
    from helpers import assert_float32_close, logit_scale, sampled_updates
    assert jax.device_count() == 8
    cfg = presets.get_preset("tiny-qwen2").replace(lora=lora.LoraConfig(2, 4.0))
    base = transformer.init_params(cfg, jax.random.key(0), scale=0.3)
    adapters = lora.init(cfg, jax.random.key(5))
    adapters = jax.tree_util.tree_map_with_path(  # B as trained: the adapters act
        lambda p, x: 0.3 * jax.random.normal(jax.random.key(6), x.shape)
        if p[-1].key.endswith(family.LORA_B) else x, adapters)
    params = lora.attach(base, adapters)
    q, g, t = 4, 4, 6
    prompts = jax.random.randint(jax.random.key(1), (q, 5), 1, 64)
    pmask = jnp.ones((q, 5), bool).at[1, :2].set(False)
    mesh = parallel.make_mesh(devices=jax.devices()[:1])
    r1, _, single, _ = sampled_updates(params, cfg, mesh, prompts, pmask, g, t)
    src = jnp.repeat(jnp.arange(q), g)
    z = logit_scale(params, cfg, prompts[src], pmask[src], r1.tokens, r1.mask)
    mesh = parallel.make_mesh(data=2, fsdp=2, tensor=2)
    with parallel.use(mesh):
        placed = parallel.place(params, mesh, family.axes)
        placed_prompts = parallel.shard_batch((prompts, pmask), mesh)
        r2, _, sharded, _ = sampled_updates(placed, cfg, mesh, *placed_prompts, g, t)
    layer = sharded.params["layers"][1]  # adapters along their weight's axes
    spec = lambda x: tuple(x.sharding.spec) + (None,) * (x.ndim - len(x.sharding.spec))
    specs = {n: spec(layer[n]) for n in ("q_lora_a", "q_lora_b", "o_lora_a", "down_lora_b")}
    assert specs == {"q_lora_a": ("fsdp", None), "q_lora_b": (None, "tensor", None),
                     "o_lora_a": ("tensor", None, None), "down_lora_b": (None, "fsdp")}, specs
    mu = sharded.opt_state[1][0].mu["layers"][1]["q_lora_b"]
    assert spec(mu) == (None, "tensor", None), mu.sharding
    assert "q" not in sharded.opt_state[1][0].mu["layers"][1]  # no moments of the base
    np.testing.assert_array_equal(np.asarray(r1.tokens), np.asarray(r2.tokens))
    assert_float32_close(r2.logprobs, r1.logprobs, scale=z)
    for a, b, w in zip(jax.tree.leaves(sharded.params), jax.tree.leaves(single.params),
                       jax.tree.leaves(params)):  # the moves, at lr's scale
        w = np.asarray(w, np.float64)
        assert_float32_close(np.asarray(a) - w, np.asarray(b) - w, scale=1e-3, ulps=16384)
    print("ok")
""")


@pytest.mark.slow
@pytest.mark.numerics
def test_sharded_lora_on_a_data_fsdp_tensor_mesh_equals_one_device():
    run_on_devices(SHARDED, 8)


@pytest.mark.parametrize(
    "settings, message",
    [
        ({"model.lora.rank": -1}, "model.lora.rank=-1: must be an integer >= 0"),
        ({"model.lora.rank": 2, "model.lora.targets": "q,lm_head"}, "'lm_head' is not a linear"),
        ({"export.format": "peft"}, "export.format=peft: model.lora.rank=0 (no adapters)"),
        ({"export.format": "gguf"}, "export.format='gguf': allowed 'hf', 'peft'"),
        ({"model.lora.rank": 2, "model.lora.path": "x"}, "model.lora.path sets the adapters'"),
        ({"model.lora.path": "/nonexistent"}, "not a PEFT adapter folder"),
    ],
)
def test_bad_lora_config_is_one_line_before_any_work(settings, message):
    c = grpo.get_config("smoke")
    for key, value in settings.items():
        section, name = key.rsplit(".", 1)
        setattr(functools.reduce(getattr, section.split("."), c), name, value)
    with pytest.raises(ValueError, match=re.escape(message)) as e:
        config_lib.spec(c).model.config()  # the model's shape checks the targets and rank
    assert "\n" not in str(e.value)


def test_a_lora_run_names_its_base_by_digest_and_a_resume_refuses_another(tmp_path):
    c = grpo.get_config("smoke")
    c.model.random_init, c.model.lora.rank = "", 2  # the embedded model's GGUF
    spec = config_lib.spec(c)
    ((path, digest),) = spec.record["model"]["base_digests"].items()
    assert path == weights.embedded_model_path() and digest == caching.file_digest(path)
    before = json.loads(json.dumps(spec.record))
    before["model"]["base_digests"][path] = "0" * 64  # the run started on other weights
    (tmp_path / "config.json").write_text(json.dumps(before))
    with pytest.raises(ValueError, match=r"holds a run of another config \(model\.base_digests"):
        build.check_same_run(spec, str(tmp_path))
