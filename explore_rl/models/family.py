"""A model family: what differs between decoder families, declared once.

A family is one module under `models/families/` that registers a `Family`: its Hugging
Face architecture and config mapping, and its weights, each with its shape, the logical
name of each of its dimensions (the sharding rules in `parallel` read them) and its tensor
names in HF and GGUF checkpoints. The initialiser, the loaders, the exporter, the sharding
rules and the parameter count all read this table, and the forward's switches (a bias on
q/k/v, a norm over each head's q and k) are which weights the family has; so a family the
package does not know is a module of its own (`tests/test_adding_a_family.py` registers
Mistral in its test file and loads, shards and exports it).

    MISTRAL = family.register(Family("mistral", hf_architecture="MistralForCausalLM",
                                     layer=family.LAYER, top=family.TOP))
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping

from explore_rl.registry import Registry

FAMILIES = Registry("model.family", package="explore_rl.models.families")


@dataclasses.dataclass(frozen=True)
class Weight:
    """One tensor of the decoder.

    `shape` names `ModelConfig` fields ("d_model", "n_heads", "head_dim"), `axes` the
    logical dimension of each (`parallel.RULES`; None: never sharded). HF stores a linear
    layer as [out, in]; ours keeps its `linear_in` leading (input) dimensions first, so
    the loader transposes it; `hf_flat` weights are stored flattened (q/k/v biases).
    """

    shape: tuple[str, ...]
    axes: tuple[str | None, ...]
    hf: str  # tensor name; a layer's after "model.layers.{i}."
    gguf: str | None = None  # llama.cpp's name; a layer's after "blk.{i}."; None: none
    linear_in: int = 0
    hf_flat: bool = False
    init: str = "normal"  # random init: normal (scale N(0, 1)), norm (1 + that), ones

    def dims(self, cfg) -> tuple[int, ...]:
        return tuple(getattr(cfg, d) for d in self.shape)


_LINEAR = dict(linear_in=1)
_NORM = dict(axes=(None,), init="norm")

# Pre-norm attention with GQA and a SwiGLU MLP (Llama). In the order the random init
# draws them: a change of order changes every random-init run.
LAYER = {
    "attn_norm": Weight(("d_model",), hf="input_layernorm.weight", gguf="attn_norm.weight",
                        **_NORM),
    "q": Weight(("d_model", "n_heads", "head_dim"), ("embed", "heads", "head_dim"),
                "self_attn.q_proj.weight", "attn_q.weight", **_LINEAR),
    "k": Weight(("d_model", "n_kv_heads", "head_dim"), ("embed", "kv_heads", "head_dim"),
                "self_attn.k_proj.weight", "attn_k.weight", **_LINEAR),
    "v": Weight(("d_model", "n_kv_heads", "head_dim"), ("embed", "kv_heads", "head_dim"),
                "self_attn.v_proj.weight", "attn_v.weight", **_LINEAR),
    "o": Weight(("n_heads", "head_dim", "d_model"), ("heads", "head_dim", "embed"),
                "self_attn.o_proj.weight", "attn_output.weight", linear_in=2),
    "mlp_norm": Weight(("d_model",), hf="post_attention_layernorm.weight",
                       gguf="ffn_norm.weight", **_NORM),
    "gate": Weight(("d_model", "d_ff"), ("embed", "mlp"), "mlp.gate_proj.weight",
                   "ffn_gate.weight", **_LINEAR),
    "up": Weight(("d_model", "d_ff"), ("embed", "mlp"), "mlp.up_proj.weight",
                 "ffn_up.weight", **_LINEAR),
    "down": Weight(("d_ff", "d_model"), ("mlp", "embed"), "mlp.down_proj.weight",
                   "ffn_down.weight", **_LINEAR),
}  # fmt: skip

# Qwen2's bias on the q, k and v projections.
QKV_BIAS = {
    f"{x}_bias": Weight((heads, "head_dim"), (axis, "head_dim"), f"self_attn.{x}_proj.bias",
                        f"attn_{x}.bias", hf_flat=True)
    for x, heads, axis in (("q", "n_heads", "heads"), ("k", "n_kv_heads", "kv_heads"),
                           ("v", "n_kv_heads", "kv_heads"))
}  # fmt: skip

# Qwen3's RMSNorm over each head's q and k, before RoPE.
QK_NORM = {
    f"{x}_norm": Weight(("head_dim",), hf=f"self_attn.{x}_norm.weight",
                        gguf=f"attn_{x}_norm.weight", **_NORM)
    for x in ("q", "k")
}  # fmt: skip

TOP = {
    "embed": Weight(("vocab_size", "d_model"), ("vocab", "embed"), "model.embed_tokens.weight",
                    "token_embd.weight"),
    "final_norm": Weight(("d_model",), (None,), "model.norm.weight", "output_norm.weight",
                         init="ones"),
    # read only when the embeddings are not tied
    "lm_head": Weight(("d_model", "vocab_size"), ("embed", "vocab"), "lm_head.weight",
                      "output.weight", **_LINEAR),
}  # fmt: skip

# What the forward (`models/transformer.py`) reads of every family.
_NEEDED = (set(LAYER), {"embed", "final_norm", "lm_head"})


@dataclasses.dataclass(frozen=True)
class Family:
    """A decoder family: its weights (which also say what the forward computes) and how
    Hugging Face names it.

    - `hf_architecture` / `hf_model_type`: config.json's `architectures[0]` / `model_type`;
    - `hf_unsupported`: config.json fields this code does not implement; a checkpoint that
      sets one (non-null, non-false) is refused, naming it;
    - `hf_fields`: fields written into an exported config.json (transformers' defaults
      for them differ from what the weights are);
    - `gguf_architecture`: `general.architecture` of its GGUF files (None: no GGUF), and
      `gguf_permuted_qk` when llama.cpp's converter interleaved q/k's RoPE halves.
    """

    name: str
    hf_architecture: str
    layer: Mapping[str, Weight]
    top: Mapping[str, Weight]
    hf_model_type: str = ""  # default: the name
    hf_unsupported: tuple[str, ...] = ()
    hf_fields: Mapping[str, object] = dataclasses.field(default_factory=dict)
    gguf_architecture: str | None = None
    gguf_permuted_qk: bool = False

    @property
    def qkv_bias(self) -> bool:
        return "q_bias" in self.layer

    @property
    def qk_norm(self) -> bool:
        return "q_norm" in self.layer

    @property
    def adaptable(self) -> tuple[str, ...]:
        """The layer weights a LoRA adapter can sit beside (`models/lora.py`): its linear
        layers, so a new family's projections take adapters with no code of their own."""
        return tuple(n for n, w in self.layer.items() if w.linear_in)

    def weights(self, cfg) -> list[tuple[tuple, Weight]]:
        """(path in the params pytree, Weight) of every tensor `cfg` has, in init order."""
        top = [n for n in self.top if n != "lm_head" or not cfg.tie_embeddings]
        out = [((n,), self.top[n]) for n in top if n == "embed"]
        for i in range(cfg.n_layers):
            out += [(("layers", i, n), w) for n, w in self.layer.items()]
        return out + [((n,), self.top[n]) for n in top if n != "embed"]

    def num_params(self, cfg) -> int:
        return sum(math.prod(w.dims(cfg)) for _, w in self.weights(cfg))


# A LoRA adapter's two matrices sit in a layer's dict beside the weight `name` they adapt,
# as `name + LORA_A` [in..., r] and `name + LORA_B` [r, out...] (`models/lora.py`).
LORA_A, LORA_B = "_lora_a", "_lora_b"

_AXES: dict[str, tuple] = {}  # weight name -> its axes, over every registered family
_BUILT_IN: list[Family] = []  # set once the package's own family modules are imported


def register(family: Family) -> Family:
    """Add `family` to the registry, after checking its table is complete and agrees
    with the other families (the sharding rules look a weight's axes up by its name)."""
    for names, table, part in zip(_NEEDED, (family.layer, family.top), ("layer", "top")):
        if missing := sorted(names - set(table)):
            raise ValueError(f"family {family.name!r}: no {part} weight named {missing}")
    if {"q_bias", "k_bias", "v_bias"} & set(family.layer) and not family.qkv_bias:
        raise ValueError(f"family {family.name!r}: k_bias / v_bias without q_bias")
    for name, w in {**family.layer, **family.top}.items():
        if len(w.axes) != len(w.shape) or not w.hf:
            raise ValueError(
                f"family {family.name!r}: weight {name!r} needs an HF name and one axis name "
                f"per dimension (shape {w.shape}, axes {w.axes})"
            )
        if _AXES.get(name, w.axes) != w.axes:
            raise ValueError(
                f"family {family.name!r}: weight {name!r} has axes {w.axes}, another family "
                f"gives it {_AXES[name]} (a name has one sharding)"
            )
    FAMILIES.register(family.name)(family)
    for name, w in {**family.layer, **family.top}.items():
        _AXES[name] = w.axes
    for name in family.adaptable:  # an adapter follows its weight's input / output axes
        w = family.layer[name]
        _AXES[name + LORA_A] = (*w.axes[: w.linear_in], None)
        _AXES[name + LORA_B] = (None, *w.axes[w.linear_in :])
    return family


def get(name: str) -> Family:
    return FAMILIES.get(name)


def every() -> list[Family]:
    """Every registered family, the package's own modules imported first."""
    if not _BUILT_IN:
        _BUILT_IN.extend(FAMILIES[n] for n in FAMILIES.known())
    return list(FAMILIES.values())


def axes(name: str) -> tuple | None:
    """The logical axes of the weight called `name` (None: no family has one)."""
    every()
    return _AXES.get(name)


def by_hf_architecture(arch: str, path: str) -> Family:
    found = {f.hf_architecture: f for f in every()}
    if arch not in found:
        raise ValueError(f"{path}: unknown architecture {arch!r}: allowed {sorted(found)}")
    return found[arch]


def by_gguf_architecture(arch: str, path: str) -> Family:
    found = {f.gguf_architecture: f for f in every() if f.gguf_architecture}
    if arch not in found:
        raise ValueError(f"{path}: unknown architecture {arch!r}: allowed {sorted(found)}")
    return found[arch]
