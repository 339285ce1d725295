"""Model configurations: one frozen dataclass for every decoder family.

`ModelConfig` is hashable, so it is a legal static argument to `jax.jit`. `family` names a
registered `models.family.Family` (one module each under `models/families/`: llama,
qwen2, qwen3), which holds everything that differs between families.

Presets name the checkpoints the methods are run on; `tiny-*` presets are the same families
at test size. `from_hf_config` reads a checkpoint's `config.json`, so an unlisted size of a
supported family loads too.
"""

from __future__ import annotations

import dataclasses
import json
import os

import jax.numpy as jnp

from explore_rl.models import family as family_lib
from explore_rl.models import lora as lora_lib

_DTYPES = ("float32", "bfloat16")
ATTENTION = ("auto", "dense", "blockwise", "fused")  # models/attention.py
REMAT = ("none", "block", "dots")  # transformer.REMAT_POLICIES


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Architecture plus the numeric types to run it in.

    `param_dtype` is what the weights are stored in, `dtype` what activations and matmuls
    use; logits and log-softmax are always float32.
    """

    family: str
    vocab_size: int
    d_model: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    d_ff: int
    rope_theta: float
    norm_eps: float
    tie_embeddings: bool
    max_seq_len: int = 4096
    # Llama-3.1+ frequency scaling as (factor, low_freq_factor, high_freq_factor,
    # original_max_position_embeddings); None for plain RoPE.
    rope_llama3_scaling: tuple[float, float, float, int] | None = None
    param_dtype: str = "float32"
    dtype: str = "float32"
    # How to run it, for memory at long lengths (results equal up to float rounding):
    attention: str = "auto"  # dense | blockwise | fused | auto (models/attention.py)
    attention_block: int = 512  # query and key tokens per blockwise attention tile
    remat: str = "none"  # recompute in the backward: none | block | dots (keep matmul outputs)
    # passes that fill their cache (prefills, the update) compile one layer and scan it:
    # a 28-layer update compiles in a third of the time, for a stacked copy of the weights
    scan_layers: bool = False
    # tokens (a device's rows x positions) whose [*, V] logits a log-prob pass holds at once
    logits_chunk: int = 2048
    # low-rank adapters on the linear layers (`models/lora.py`); None: the weights alone
    lora: lora_lib.LoraConfig | None = None

    def __post_init__(self):
        family_lib.get(self.family)
        if self.lora is not None:
            lora_lib.check(self.lora, self)
        if self.n_heads % self.n_kv_heads:
            raise ValueError(
                f"n_heads={self.n_heads} is not a multiple of n_kv_heads={self.n_kv_heads}"
            )
        for name, allowed in (
            ("param_dtype", _DTYPES),
            ("dtype", _DTYPES),
            ("attention", ATTENTION),
            ("remat", REMAT),
        ):
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name}={getattr(self, name)!r}: allowed {allowed}")
        for name in ("attention_block", "logits_chunk"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)}: must be >= 1")

    @property
    def qkv_bias(self) -> bool:
        return family_lib.get(self.family).qkv_bias

    @property
    def qk_norm(self) -> bool:
        return family_lib.get(self.family).qk_norm

    @property
    def jnp_dtype(self):
        return jnp.dtype(self.dtype)

    @property
    def jnp_param_dtype(self):
        return jnp.dtype(self.param_dtype)

    def replace(self, **kw) -> ModelConfig:
        return dataclasses.replace(self, **kw)

    def num_params(self) -> int:
        """Parameter count, embeddings included (tied ones once)."""
        return family_lib.get(self.family).num_params(self)


_LLAMA3_ROPE = (32.0, 1.0, 4.0, 8192)

PRESETS: dict[str, ModelConfig] = {
    "smollm2-135m": ModelConfig(
        family="llama",
        vocab_size=49152,
        d_model=576,
        n_layers=30,
        n_heads=9,
        n_kv_heads=3,
        head_dim=64,
        d_ff=1536,
        rope_theta=1e5,
        norm_eps=1e-5,
        tie_embeddings=True,
        max_seq_len=8192,
    ),
    "qwen2.5-0.5b": ModelConfig(
        family="qwen2",
        vocab_size=151936,
        d_model=896,
        n_layers=24,
        n_heads=14,
        n_kv_heads=2,
        head_dim=64,
        d_ff=4864,
        rope_theta=1e6,
        norm_eps=1e-6,
        tie_embeddings=True,
        max_seq_len=32768,
    ),
    "qwen2.5-math-1.5b": ModelConfig(
        family="qwen2",
        vocab_size=151936,
        d_model=1536,
        n_layers=28,
        n_heads=12,
        n_kv_heads=2,
        head_dim=128,
        d_ff=8960,
        rope_theta=1e4,
        norm_eps=1e-6,
        tie_embeddings=True,
        max_seq_len=4096,
    ),
    "qwen2.5-math-7b": ModelConfig(
        family="qwen2",
        vocab_size=152064,
        d_model=3584,
        n_layers=28,
        n_heads=28,
        n_kv_heads=4,
        head_dim=128,
        d_ff=18944,
        rope_theta=1e4,
        norm_eps=1e-6,
        tie_embeddings=False,
        max_seq_len=4096,
    ),
    "qwen3-1.7b": ModelConfig(
        family="qwen3",
        vocab_size=151936,
        d_model=2048,
        n_layers=28,
        n_heads=16,
        n_kv_heads=8,
        head_dim=128,
        d_ff=6144,
        rope_theta=1e6,
        norm_eps=1e-6,
        tie_embeddings=True,
        max_seq_len=40960,
    ),
    "qwen3-8b": ModelConfig(
        family="qwen3",
        vocab_size=151936,
        d_model=4096,
        n_layers=36,
        n_heads=32,
        n_kv_heads=8,
        head_dim=128,
        d_ff=12288,
        rope_theta=1e6,
        norm_eps=1e-6,
        tie_embeddings=False,
        max_seq_len=40960,
    ),
    "llama-3.2-1b": ModelConfig(
        family="llama",
        vocab_size=128256,
        d_model=2048,
        n_layers=16,
        n_heads=32,
        n_kv_heads=8,
        head_dim=64,
        d_ff=8192,
        rope_theta=5e5,
        norm_eps=1e-5,
        tie_embeddings=True,
        max_seq_len=131072,
        rope_llama3_scaling=_LLAMA3_ROPE,
    ),
    # The lab's model, trained from scratch on synthetic tasks (data/lab.py's tokenizer
    # gives its vocabulary): about 0.8M parameters, a CPU's size.
    "lab-1m": ModelConfig(
        family="llama",
        vocab_size=32,
        d_model=128,
        n_layers=4,
        n_heads=4,
        n_kv_heads=4,
        head_dim=32,
        d_ff=512,
        rope_theta=1e4,
        norm_eps=1e-5,
        tie_embeddings=True,
        max_seq_len=256,
    ),
    # Test sizes: 2 layers, d=32, vocab 64, GQA 4:2.
    "tiny-llama": ModelConfig(
        family="llama",
        vocab_size=64,
        d_model=32,
        n_layers=2,
        n_heads=4,
        n_kv_heads=2,
        head_dim=8,
        d_ff=64,
        rope_theta=1e4,
        norm_eps=1e-5,
        tie_embeddings=True,
        max_seq_len=256,
    ),
    "tiny-qwen2": ModelConfig(
        family="qwen2",
        vocab_size=64,
        d_model=32,
        n_layers=2,
        n_heads=4,
        n_kv_heads=2,
        head_dim=8,
        d_ff=64,
        rope_theta=1e4,
        norm_eps=1e-6,
        tie_embeddings=False,
        max_seq_len=256,
    ),
    "tiny-qwen3": ModelConfig(
        family="qwen3",
        vocab_size=64,
        d_model=32,
        n_layers=2,
        n_heads=4,
        n_kv_heads=2,
        head_dim=8,
        d_ff=64,
        rope_theta=1e4,
        norm_eps=1e-6,
        tie_embeddings=True,
        max_seq_len=256,
    ),
}
# Base (pre-trained) checkpoints have their instruct models' shapes.
PRESETS["qwen3-1.7b-base"] = PRESETS["qwen3-1.7b"]


def get_preset(name: str, **overrides) -> ModelConfig:
    if name not in PRESETS:
        raise ValueError(f"unknown model preset {name!r}: allowed {sorted(PRESETS)}")
    return PRESETS[name].replace(**overrides)


def _rope_scaling(hf: dict, path: str):
    scaling = hf.get("rope_scaling") or hf.get("rope_parameters") or {}
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind == "default":
        return None
    if kind != "llama3":
        raise ValueError(f"{path}: rope scaling type {kind!r} is not supported (allowed: llama3)")
    return (
        float(scaling["factor"]),
        float(scaling["low_freq_factor"]),
        float(scaling["high_freq_factor"]),
        int(scaling["original_max_position_embeddings"]),
    )


def from_hf_config(path: str, **overrides) -> ModelConfig:
    """ModelConfig from a HF `config.json` (a file or the folder holding it)."""
    if os.path.isdir(path):
        path = os.path.join(path, "config.json")
    try:
        with open(path) as f:
            hf = json.load(f)
    except FileNotFoundError:
        raise ValueError(f"{path}: no config.json (a HF model folder needs one)") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: config.json is not valid JSON ({e})") from None
    archs = hf.get("architectures") or [hf.get("model_type", "?")]
    family = family_lib.by_hf_architecture(archs[0], path)
    for field in family.hf_unsupported:
        if hf.get(field):
            raise ValueError(f"{path}: {field}={hf[field]!r} is not supported for {family.name}")
    n_heads = hf["num_attention_heads"]
    rope = hf.get("rope_parameters") or {}
    cfg = ModelConfig(
        family=family.name,
        vocab_size=hf["vocab_size"],
        d_model=hf["hidden_size"],
        n_layers=hf["num_hidden_layers"],
        n_heads=n_heads,
        n_kv_heads=hf.get("num_key_value_heads") or n_heads,
        head_dim=hf.get("head_dim") or hf["hidden_size"] // n_heads,
        d_ff=hf["intermediate_size"],
        rope_theta=float(hf.get("rope_theta", rope.get("rope_theta", 10000.0))),
        norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
        tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
        max_seq_len=int(hf.get("max_position_embeddings", 4096)),
        rope_llama3_scaling=_rope_scaling(hf, path),
    )
    return cfg.replace(**overrides)


def to_hf_config(cfg: ModelConfig) -> dict:
    """The HF `config.json` of `cfg`: `from_hf_config` reads it back to `cfg` (dtypes
    aside), and transformers builds the same architecture from it."""
    family = family_lib.get(cfg.family)
    hf = {
        "architectures": [family.hf_architecture],
        "model_type": family.hf_model_type or family.name,
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.d_model,
        "num_hidden_layers": cfg.n_layers,
        "num_attention_heads": cfg.n_heads,
        "num_key_value_heads": cfg.n_kv_heads,
        "head_dim": cfg.head_dim,
        "intermediate_size": cfg.d_ff,
        "hidden_act": "silu",
        "rope_theta": cfg.rope_theta,
        "rms_norm_eps": cfg.norm_eps,
        "tie_word_embeddings": cfg.tie_embeddings,
        "max_position_embeddings": cfg.max_seq_len,
        "torch_dtype": cfg.param_dtype,
    }
    hf.update(family.hf_fields)
    if cfg.rope_llama3_scaling is not None:
        factor, low, high, original = cfg.rope_llama3_scaling
        hf["rope_scaling"] = {
            "rope_type": "llama3",
            "factor": factor,
            "low_freq_factor": low,
            "high_freq_factor": high,
            "original_max_position_embeddings": original,
        }
    return hf
