"""The user cache: the GGUF -> HF conversion done once, folders built atomically, and the
persistent XLA compilation cache."""

import json
import os
import subprocess
import sys

import gguf
import numpy as np
import pytest

from explore_rl import caching
from explore_rl.models import gguf_io, presets, safetensors_io, weights


def test_build_once_builds_in_a_temporary_folder_and_keeps_the_first(tmp_path):
    calls = []

    def build(out):
        calls.append(out)
        with open(os.path.join(out, "x.txt"), "w") as f:
            f.write("one")

    final = str(tmp_path / "cache" / "thing")
    assert caching.build_once(final, build) == final
    assert caching.build_once(final, build) == final  # there: not built again
    assert len(calls) == 1 and calls[0] != final
    assert open(os.path.join(final, "x.txt")).read() == "one"
    assert os.listdir(tmp_path / "cache") == ["thing"]  # no temporary folder left

    def broken(out):
        with open(os.path.join(out, "half.txt"), "w") as f:
            f.write("half")
        raise RuntimeError("killed mid-build")

    other = str(tmp_path / "cache" / "other")
    with pytest.raises(RuntimeError, match="mid-build"):
        caching.build_once(other, broken)
    assert os.listdir(tmp_path / "cache") == ["thing"]  # a reader never sees half a folder


def test_a_concurrent_builder_that_loses_the_rename_keeps_the_winner(tmp_path):
    final = str(tmp_path / "thing")

    def slow_loser(out):  # another process finishes first while this one builds
        os.makedirs(final)
        with open(os.path.join(final, "x.txt"), "w") as f:
            f.write("winner")

    assert caching.build_once(final, slow_loser) == final
    assert open(os.path.join(final, "x.txt")).read() == "winner"
    assert os.listdir(tmp_path) == ["thing"]


def test_builders_that_would_race_wait_for_one_build(tmp_path):
    """`build_alone`: a second builder waits on the lock and reads the first one's folder
    instead of building its own (an SFT run is not repeated by a sweep's concurrent runs)."""
    import threading

    final, calls, started = str(tmp_path / "cache" / "thing"), [], threading.Event()

    def build(out):
        calls.append(out)
        started.set()
        threading.Event().wait(0.3)  # the other builder arrives while this one builds
        with open(os.path.join(out, "x.txt"), "w") as f:
            f.write(str(len(calls)))

    first = threading.Thread(target=caching.build_alone, args=(final, build))
    first.start()
    started.wait()
    assert caching.build_alone(final, build) == final
    first.join()
    assert len(calls) == 1 and open(os.path.join(final, "x.txt")).read() == "1"


def test_cache_dir_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("EXPLORE_RL_CACHE_DIR", str(tmp_path / "c"))
    assert caching.cache_dir("gguf", "x") == str(tmp_path / "c" / "gguf" / "x")
    monkeypatch.delenv("EXPLORE_RL_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert caching.cache_dir("xla") == str(tmp_path / "xdg" / "explore_rl" / "xla")


def test_embedded_gguf_is_converted_once_and_read_from_the_cache(embedded_gguf, monkeypatch):
    folder = weights.gguf_as_hf_folder(embedded_gguf)
    assert folder.startswith(caching.cache_dir("gguf"))
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= set(
        os.listdir(folder)
    )
    # the dequantized tensors are the GGUF's, with llama.cpp's Q/K row order undone (exact:
    # the same dequantization, stored and read back)
    reader = gguf.GGUFReader(embedded_gguf)
    tensors = {t.name: t for t in reader.tensors}
    index = safetensors_io.index(os.path.join(folder, "model.safetensors"))
    cfg = presets.from_hf_config(folder)
    for gguf_name, hf_name, heads in [
        ("token_embd.weight", "model.embed_tokens.weight", None),
        ("blk.3.ffn_down.weight", "model.layers.3.mlp.down_proj.weight", None),
        ("blk.0.attn_k.weight", "model.layers.0.self_attn.k_proj.weight", cfg.n_kv_heads),
    ]:
        t = tensors[gguf_name]
        expected = gguf.quants.dequantize(t.data, t.tensor_type)
        if heads:
            expected = weights._unpermute_qk(expected, heads)
        np.testing.assert_array_equal(safetensors_io.read(index[hf_name]), expected)

    def no_conversion(*_):
        raise AssertionError("a cached GGUF was read again")

    monkeypatch.setattr(gguf_io, "reader", no_conversion)
    assert weights.gguf_as_hf_folder(embedded_gguf) == folder
    params, cfg2, tok = weights.load(embedded_gguf)
    assert cfg2 == cfg and tok.vocab_size == 49152
    assert params["layers"][0]["q"].shape == (cfg.d_model, cfg.n_heads, cfg.head_dim)


def test_config_json_round_trip(tmp_path):
    for name, cfg in presets.PRESETS.items():
        (tmp_path / "config.json").write_text(json.dumps(presets.to_hf_config(cfg)))
        assert presets.from_hf_config(str(tmp_path)) == cfg, name


# a program that compiles in about a tenth of a second, which the cache keeps all the same;
# `{enable}` turns the cache on, the last line printed is `{result}`
_PROGRAM = """
import jax, jax.numpy as jnp
from jax._src import monitoring
from explore_rl import caching
events = []
monitoring.register_event_listener(lambda name, **_: events.append(name))
{enable}
@jax.jit
def f(x):
    for _ in range(40):
        x = jnp.tanh(x @ x.T) + 0.123
    return x
f(jnp.ones((16, 16))).block_until_ready()
print({result})
"""
WRITING = _PROGRAM.format(enable="folder = caching.enable_compilation_cache()", result="folder")
READING = _PROGRAM.format(
    enable="caching.enable_compilation_cache(write=False)",
    result='"/jax/compilation_cache/cache_hits" in events',
)


def _run(script: str, cache: str) -> str:
    """`script` in a fresh process with the cache folder `cache`: the last line it printed."""
    env = dict(os.environ, EXPLORE_RL_CACHE_DIR=cache, JAX_PLATFORMS="cpu")
    env.pop("JAX_COMPILATION_CACHE_DIR", None)
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.split()[-1]


@pytest.mark.slow
def test_compilation_cache_is_shared_by_processes(tmp_path):
    assert _run(WRITING, str(tmp_path)) == str(tmp_path / "xla")
    entries = sorted(os.listdir(tmp_path / "xla"))
    assert any(e.startswith("jit_f-") for e in entries)
    mtimes = {e: os.path.getmtime(tmp_path / "xla" / e) for e in entries}
    _run(WRITING, str(tmp_path))
    # the second process found every program in the cache: nothing new was written
    assert sorted(os.listdir(tmp_path / "xla")) == entries
    assert {e: os.path.getmtime(tmp_path / "xla" / e) for e in entries} == mtimes


@pytest.mark.slow
def test_a_reading_process_uses_the_cache_and_writes_nothing(tmp_path):
    """The test suite's processes (`write=False`): they serialize no program, and they load
    the programs another process wrote."""
    assert _run(READING, str(tmp_path)) == "False"  # compiled: nothing there to read
    assert os.listdir(tmp_path / "xla") == []  # and nothing written
    _run(WRITING, str(tmp_path))  # a writing process (a CLI run) writes it
    assert _run(READING, str(tmp_path)) == "True"


def test_file_digest_is_remembered_and_follows_changes(tmp_path, monkeypatch):
    import hashlib

    monkeypatch.setenv("EXPLORE_RL_CACHE_DIR", str(tmp_path / "cache"))
    f = tmp_path / "train.jsonl"
    f.write_bytes(b"one")
    assert caching.file_digest(str(f)) == hashlib.sha256(b"one").hexdigest()
    (memo,) = os.listdir(tmp_path / "cache" / "digests")
    # a second call reads the memo, not the file (it no longer matches the memo's text)
    (tmp_path / "cache" / "digests" / memo).write_text("remembered")
    assert caching.file_digest(str(f)) == "remembered"
    f.write_bytes(b"two, longer")  # new size and mtime: hashed again
    assert caching.file_digest(str(f)) == hashlib.sha256(b"two, longer").hexdigest()
