"""Loading errors: each bad checkpoint gives one clear line naming the file and the problem."""

import json
import os
import shutil

import numpy as np
import pytest
from helpers import make_hf_checkpoint

from explore_rl.models import weights


def _one_line_error(fn, *args, contains=()):
    with pytest.raises(ValueError) as info:
        fn(*args)
    msg = str(info.value)
    assert "\n" not in msg, msg
    for part in contains:
        assert part in msg, msg
    return msg


@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny-qwen3")
    make_hf_checkpoint(folder, "qwen3")
    return folder


def _copy(src, dst, skip=()):
    os.makedirs(dst, exist_ok=True)
    for name in os.listdir(src):
        if name not in skip:
            shutil.copy(os.path.join(src, name), dst)
    return str(dst)


def test_folder_without_weights(hf_folder, tmp_path):
    folder = _copy(hf_folder, tmp_path / "empty", skip=("model.safetensors",))
    _one_line_error(weights.load_hf, folder, contains=(folder, "no *.safetensors"))


def test_index_naming_a_missing_shard(tmp_path):
    make_hf_checkpoint(tmp_path, "llama", max_shard_size="20KB")
    shards = sorted(p for p in os.listdir(tmp_path) if p.endswith(".safetensors"))
    os.remove(tmp_path / shards[-1])
    _one_line_error(
        weights.load_hf,
        str(tmp_path),
        contains=("model.safetensors.index.json", shards[-1], "not in the folder"),
    )


def test_folder_without_config(tmp_path):
    _one_line_error(weights.load_hf, str(tmp_path), contains=(str(tmp_path), "config.json"))


def test_shapes_do_not_match_config(hf_folder, tmp_path):
    folder = _copy(hf_folder, tmp_path / "bad")
    conf = json.load(open(os.path.join(folder, "config.json")))
    conf["intermediate_size"] = 48
    json.dump(conf, open(os.path.join(folder, "config.json"), "w"))
    _one_line_error(weights.load_hf, folder, contains=(folder, "layers/0/gate", "(32, 48)"))


def test_missing_tensor(hf_folder, tmp_path):
    folder = _copy(hf_folder, tmp_path / "qwen3-as-qwen2")
    conf = json.load(open(os.path.join(folder, "config.json")))
    conf["architectures"] = ["Qwen2ForCausalLM"]  # Qwen2 wants biases this file lacks
    json.dump(conf, open(os.path.join(folder, "config.json"), "w"))
    _one_line_error(weights.load_hf, folder, contains=(folder, "q_proj.bias"))


def test_unknown_architecture(hf_folder, tmp_path):
    folder = _copy(hf_folder, tmp_path / "gpt2")
    conf = json.load(open(os.path.join(folder, "config.json")))
    conf["architectures"] = ["GPT2LMHeadModel"]
    json.dump(conf, open(os.path.join(folder, "config.json"), "w"))
    _one_line_error(weights.load_hf, folder, contains=(folder, "GPT2LMHeadModel", "allowed"))


def test_truncated_safetensors(hf_folder, tmp_path):
    folder = _copy(hf_folder, tmp_path / "trunc")
    path = os.path.join(folder, "model.safetensors")
    data = open(path, "rb").read()
    open(path, "wb").write(data[: len(data) // 2])
    _one_line_error(weights.load_hf, folder, contains=(path, "truncated"))


def test_corrupt_gguf(tmp_path, embedded_gguf):
    garbage = tmp_path / "garbage.gguf"
    garbage.write_bytes(np.random.default_rng(0).bytes(4096))
    _one_line_error(weights.load, str(garbage), contains=(str(garbage), "not a valid GGUF"))
    truncated = tmp_path / "truncated.gguf"
    with open(embedded_gguf, "rb") as f:
        truncated.write_bytes(f.read(5_000_000))
    _one_line_error(weights.load, str(truncated), contains=(str(truncated),))


def test_missing_path():
    _one_line_error(weights.load, "/nonexistent/model", contains=("/nonexistent/model",))
