"""A fourth model family, added in this file alone: Mistral (the Llama block under its own
Hugging Face architecture) is registered here, with no edit to the package, and then
loads from a transformers checkpoint with its logits, shards on a mesh and exports back
to transformers, as the built-in families do."""

import json
import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import assert_float32_close, make_hf_checkpoint, subprocess_env, torch_logits

from explore_rl.models import family, presets, weights
from explore_rl.models.family import Family, Weight
from explore_rl.models.transformer import forward, positions_from_mask

pytestmark = [pytest.mark.usefixtures("highest_precision"), pytest.mark.numerics]

MISTRAL = family.register(
    Family(
        "mistral",
        hf_architecture="MistralForCausalLM",
        layer=family.LAYER,
        top=family.TOP,
        hf_unsupported=("sliding_window",),  # no sliding-window attention here
        hf_fields={"sliding_window": None},  # transformers' default is 4096
    )
)
HF_MISTRAL = ("mistral", dict(sliding_window=None, tie_word_embeddings=False))


def _logits(params, cfg, tokens, mask):
    out = forward(
        params, cfg, jnp.asarray(tokens), positions_from_mask(jnp.asarray(mask)), jnp.asarray(mask)
    )
    return np.asarray(out.logits)


def _batch():
    tokens = np.random.default_rng(0).integers(0, 64, (3, 10))
    mask = np.ones((3, 10), bool)
    mask[1, :4] = mask[2, :7] = False  # left padding
    return tokens, mask


def test_the_new_family_loads_from_transformers_with_its_logits(tmp_path):
    model = make_hf_checkpoint(tmp_path, HF_MISTRAL)
    params, cfg = weights.load_hf(str(tmp_path))
    assert cfg.family == "mistral" and not cfg.tie_embeddings
    assert set(params["layers"][0]) == set(family.LAYER) and "lm_head" in params
    assert cfg.num_params() == sum(p.numel() for p in model.parameters())
    tokens, mask = _batch()
    ref = torch_logits(model, tokens, mask)
    assert_float32_close(_logits(params, cfg, tokens, mask)[mask], ref[mask], ulps=1024)


def test_the_new_family_exports_for_transformers_and_reloads_exactly(tmp_path):
    import torch
    import transformers

    make_hf_checkpoint(tmp_path / "in", HF_MISTRAL, seed=1)
    params, cfg = weights.load_hf(str(tmp_path / "in"))
    out = str(tmp_path / "out")
    weights.save_hf(out, params, cfg, "float32", max_shard_bytes=8_000)  # several shards
    with open(os.path.join(out, "config.json")) as f:
        hf = json.load(f)
    assert hf["architectures"] == ["MistralForCausalLM"] and hf["model_type"] == "mistral"
    assert hf["sliding_window"] is None
    again, cfg_again = weights.load_hf(out)
    assert cfg_again == cfg
    for a, b in zip(jax.tree.leaves(again), jax.tree.leaves(params), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))  # stored as is
    model = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    tokens, mask = _batch()
    ref = torch_logits(model, tokens, mask)
    assert_float32_close(_logits(params, cfg, tokens, mask)[mask], ref[mask], ulps=1024)


SHARDED = textwrap.dedent("""
    import sys
    import jax, numpy as np
    from jax.sharding import PartitionSpec as P
    sys.path.insert(0, sys.argv[2])
    import test_adding_a_family as t  # registers the family, as a user's module would
    from explore_rl import parallel
    from explore_rl.models import family, weights
    mesh = parallel.make_mesh(data=1, fsdp=2, tensor=2)
    sharded, cfg = weights.load_hf(sys.argv[1], parallel.placer(mesh, family.axes))
    plain, _ = weights.load_hf(sys.argv[1])
    layer = sharded["layers"][0]
    assert layer["q"].sharding.spec == P("fsdp", "tensor", None), layer["q"].sharding
    assert layer["down"].sharding.spec == P("tensor", "fsdp"), layer["down"].sharding
    assert sharded["lm_head"].sharding.spec == P("fsdp", "tensor"), sharded["lm_head"].sharding
    assert layer["attn_norm"].sharding.spec == P(), layer["attn_norm"].sharding
    tokens, mask = t._batch()
    tokens, mask = np.tile(tokens, (2, 1)), np.tile(mask, (2, 1))  # rows over fsdp
    with parallel.use(mesh):
        ours = t._logits(sharded, cfg, tokens, mask)
    ref = t._logits(plain, cfg, tokens, mask)
    t.assert_float32_close(ours[mask], ref[mask])
    print("ok")
""")


@pytest.mark.slow
def test_the_new_family_shards_on_a_mesh(tmp_path):
    make_hf_checkpoint(tmp_path, HF_MISTRAL)
    here = os.path.dirname(os.path.abspath(__file__))
    out = subprocess.run(
        [sys.executable, "-c", SHARDED, str(tmp_path), here],
        env=subprocess_env(4),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-3000:]


def test_a_checkpoint_with_what_the_family_lacks_is_refused_naming_it(tmp_path):
    make_hf_checkpoint(tmp_path, ("mistral", dict(sliding_window=16)))
    with pytest.raises(ValueError, match="sliding_window=16 is not supported for mistral"):
        presets.from_hf_config(str(tmp_path))
    with pytest.raises(ValueError, match="'nope'.*known.*'llama'.*'mistral'.*'qwen2'"):
        presets.get_preset("tiny-llama", family="nope")


@pytest.mark.parametrize(
    "change, error",
    [
        (dict(layer={k: w for k, w in family.LAYER.items() if k != "up"}), r"no layer.*'up'"),
        (dict(layer={**family.LAYER, "gate": Weight(("d_model", "d_ff"), ("embed",), "g")}),
         r"weight 'gate' needs .* one axis name per dimension"),
        (dict(layer={**family.LAYER, "gate": Weight(("d_model", "d_ff"), ("embed", "mlp"), "")}),
         r"weight 'gate' needs an HF name"),
        (dict(layer={**family.LAYER, "up": Weight(("d_model", "d_ff"), ("mlp", "embed"), "u")}),
         r"weight 'up' has axes \('mlp', 'embed'\), another family gives it"),
    ],
)  # fmt: skip
def test_an_incomplete_or_inconsistent_family_is_refused_naming_the_weight(change, error):
    broken = Family("broken", "BrokenForCausalLM", layer=family.LAYER, top=family.TOP)
    with pytest.raises(ValueError, match=error):
        family.register(broken.__class__(**{**broken.__dict__, **change}))
    assert "broken" not in family.FAMILIES
