"""--mode export: a trained run's weights as an HF folder that transformers loads as the
original architecture (logits against our forward) and our loader reads back bit for bit."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import assert_float32_close, run_main, torch_logits

from explore_rl import checkpoint as checkpoint_lib
from explore_rl import config as config_lib
from explore_rl import testing
from explore_rl.models import weights
from explore_rl.models.transformer import forward, positions_from_mask
from explore_rl.modes import export
from explore_rl.train import loop

pytestmark = [pytest.mark.usefixtures("highest_precision"), pytest.mark.slow, pytest.mark.numerics]

ARCHITECTURES = {
    "tiny-llama": "LlamaForCausalLM",
    "tiny-qwen2": "Qwen2ForCausalLM",
    "tiny-qwen3": "Qwen3ForCausalLM",
}


def _trained_run(preset, folder):
    c = config_lib.load("configs/grpo.py:smoke")
    c.model.random_init = preset
    c.reward.fn = testing.PARITY  # mixed groups: the params really move
    c.train.steps, c.train.eval_every, c.train.checkpoint_every = 2, 0, 1
    progress = loop.train(config_lib.spec(c), folder)
    c.eval.checkpoint = folder
    return c, progress.state.params


def _same(a, b) -> bool:
    leaves = zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True)
    return all(np.array_equal(np.asarray(x), np.asarray(y)) for x, y in leaves)


def _transformers_matches(folder, params, cfg, tok):
    import torch
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    model.eval()
    rows = [tok.encode_chat([{"role": "user", "content": q}]) for q in ("2+3?", "What is 17?")]
    width = max(map(len, rows))
    tokens = np.array([[tok.pad_id] * (width - len(r)) + r for r in rows])
    mask = np.array([[False] * (width - len(r)) + [True] * len(r) for r in rows])
    ours = forward(
        params, cfg, jnp.asarray(tokens), positions_from_mask(jnp.asarray(mask)), jnp.asarray(mask)
    ).logits
    # float32 over up to 30 layers and a 49k vocabulary, in another library's kernels and
    # summation orders (which round differently on AVX2 and AVX-512 CPUs)
    ref = torch_logits(model, tokens, mask)
    assert_float32_close(np.asarray(ours)[mask], ref[mask], ulps=1024)
    hf_tok = transformers.AutoTokenizer.from_pretrained(folder)
    text = "What is 12 + 30? Put the answer in \\boxed{}."
    assert hf_tok.encode(text, add_special_tokens=False) == tok.encode(text)


@pytest.mark.parametrize("preset", sorted(ARCHITECTURES))
def test_a_trained_run_exports_for_transformers_and_reloads_exactly(preset, tmp_path):
    c, trained = _trained_run(preset, str(tmp_path / "run"))
    out = export.run_export(config_lib.spec(c), str(tmp_path / "hf"))
    with open(os.path.join(out, "config.json")) as f:
        hf = json.load(f)
    assert hf["architectures"] == [ARCHITECTURES[preset]] and hf["torch_dtype"] == "float32"
    for name in ("model.safetensors", "tokenizer.json", "tokenizer_config.json"):
        assert os.path.isfile(os.path.join(out, name)), name
    with open(os.path.join(out, "generation_config.json")) as f:
        assert json.load(f)["eos_token_id"]
    params, cfg, tok = weights.load(out)
    assert _same(params, trained)  # the trained step's params, bit for bit (stored as is)
    _transformers_matches(out, params, cfg, tok)


def test_export_shards_casts_and_refuses_a_used_folder(tmp_path):
    import ml_dtypes

    c, trained = _trained_run("tiny-qwen2", str(tmp_path / "run"))
    c.export.dtype, c.export.max_shard_gb, c.export.step = "bfloat16", 2e-4, 1  # ~200 KB
    out = export.run_export(config_lib.spec(c), str(tmp_path / "hf"))
    with open(os.path.join(out, "model.safetensors.index.json")) as f:
        shards = set(json.load(f)["weight_map"].values())
    assert len(shards) > 1 and all(os.path.isfile(os.path.join(out, s)) for s in shards)
    params, _, _ = weights.load(out, param_dtype="bfloat16", dtype="bfloat16")
    folder, step = checkpoint_lib.locate(str(tmp_path / "run"), 1)
    step1 = checkpoint_lib.restore_subset(folder, step, {"state": {"params": trained}})
    step1 = step1["state"]["params"]
    assert not _same(step1, trained)  # export.step chose step 1, not the newest
    assert _same(params, jax.tree.map(lambda x: np.asarray(x).astype(ml_dtypes.bfloat16), step1))
    with pytest.raises(ValueError, match="not empty"):
        export.run_export(config_lib.spec(c), out)
    for inside in ("run/checkpoints/hf", "run/hf"):  # resume and eval would break on it
        with pytest.raises(ValueError, match=f"inside the run directory {tmp_path / 'run'};"):
            export.run_export(config_lib.spec(c), str(tmp_path / inside))
        assert not (tmp_path / inside).exists()


def test_the_embedded_model_exports_through_the_cli(tmp_path):
    """No checkpoint: the GGUF-loaded model itself, as an HF folder of its architecture."""
    out = run_main(
        "--mode", "export", "--config", "configs/grpo.py:demo", "--workdir", str(tmp_path / "hf")
    )
    assert out.returncode == 0, out.stderr[-3000:]
    params, cfg, tok = weights.load(str(tmp_path / "hf"))
    reference, _, _ = weights.load("embedded")
    assert _same(params, reference)
    _transformers_matches(str(tmp_path / "hf"), params, cfg, tok)
