"""LoRA adapters beside the weights they adapt, in PEFT's format on disk.

Hu et al. 2021, "LoRA: Low-Rank Adaptation of Large Language Models", eq. 3: a frozen
linear layer W gains a trainable low-rank update, h = x W + s (x A) B with A [in, r],
B [r, out] and s = alpha / r (rsLoRA, Kalajdzievski 2023: s = alpha / sqrt(r), so the
update's scale does not shrink as the rank grows). B starts at zero, so a new adapter
leaves the model exactly as it was; A starts as PEFT's `kaiming_uniform_(a=sqrt(5))`,
uniform in +-1/sqrt(in).

The adapters of weight `name` (one of `Family.adaptable`: a family's linear layers) live
in that layer's params dict as `name + family.LORA_A` [in..., r] and `name +
family.LORA_B` [r, out...], the weight's own input and output dimensions kept, so they
shard along the weight's axes (`family.axes`) and the forward (`models/transformer.py`)
adds s (x A) B wherever it finds them: params without them are the base model, the
reference policy of a LoRA run, with no second copy.

    lora = LoraConfig(rank=8, alpha=16, targets=("q", "v"))
    cfg = cfg.replace(lora=lora); check(lora, cfg)
    params = attach(base, init(cfg, key))          # trains: split(params)[0]
    save_peft(folder, params, cfg, base_path)      # peft.PeftModel.from_pretrained reads it

PEFT's tensors are torch's [out, in] layout (`lora_A.weight` [r, in], `lora_B.weight`
[out, r]) under `base_model.model.` + the weight's HF module name.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os

import jax
import jax.numpy as jnp
import numpy as np

from explore_rl.models import family, safetensors_io

ALL_TARGETS = ("q", "k", "v", "o", "gate", "up", "down")
PEFT_CONFIG, PEFT_WEIGHTS = "adapter_config.json", "adapter_model.safetensors"


@dataclasses.dataclass(frozen=True)
class LoraConfig:
    """Which weights take adapters, their rank and scale (a `ModelConfig` field)."""

    rank: int
    alpha: float
    targets: tuple[str, ...] = ALL_TARGETS
    rslora: bool = False  # scale alpha / sqrt(rank) instead of alpha / rank

    def __post_init__(self):
        if self.rank < 1:
            raise ValueError(f"model.lora.rank={self.rank}: must be >= 1")
        if not self.targets or len(set(self.targets)) != len(self.targets):
            raise ValueError(f"model.lora.targets={self.targets}: need distinct weight names")

    @property
    def scale(self) -> float:
        return self.alpha / (math.sqrt(self.rank) if self.rslora else self.rank)


def _dims(cfg, name: str) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(input dims, output dims) of layer weight `name`."""
    w = family.get(cfg.family).layer[name]
    dims = w.dims(cfg)
    return dims[: w.linear_in], dims[w.linear_in :]


def check(lora: LoraConfig, cfg) -> None:
    """One line for a target `cfg`'s family cannot adapt or a rank past a weight's size."""
    allowed = family.get(cfg.family).adaptable
    for name in lora.targets:
        if name not in allowed:
            raise ValueError(
                f"model.lora.targets: {name!r} is not a linear layer of family {cfg.family!r}: "
                f"allowed {list(allowed)}"
            )
        n_in, n_out = (math.prod(d) for d in _dims(cfg, name))
        if lora.rank > min(n_in, n_out):
            raise ValueError(
                f"model.lora.rank={lora.rank}: larger than weight {name!r} ({n_in} x {n_out})"
            )


def init(cfg, key: jax.Array) -> dict:
    """New float32 adapters for `cfg.lora`: {"layers": [{name + LORA_A: A, name + LORA_B:
    B}, ...]}, A uniform in +-1/sqrt(in) (PEFT's kaiming-uniform), B zero."""
    lora = cfg.lora
    layers = []
    for lk in jax.random.split(key, cfg.n_layers):
        layer = {}
        for name, k in zip(lora.targets, jax.random.split(lk, len(lora.targets))):
            d_in, d_out = _dims(cfg, name)
            bound = 1.0 / math.sqrt(math.prod(d_in))
            layer[name + family.LORA_A] = jax.random.uniform(
                k, (*d_in, lora.rank), jnp.float32, -bound, bound
            )
            layer[name + family.LORA_B] = jnp.zeros((lora.rank, *d_out), jnp.float32)
        layers.append(layer)
    return {"layers": layers}


def _is_adapter(name: str) -> bool:
    return name.endswith((family.LORA_A, family.LORA_B))


def attach(base: dict, adapters: dict) -> dict:
    """`base` with `adapters` beside their weights (no array copied)."""
    layers = [{**lp, **ad} for lp, ad in zip(base["layers"], adapters["layers"], strict=True)]
    return {**base, "layers": layers}


def split(params: dict) -> tuple[dict, dict | None]:
    """(what trains, what stays frozen): (adapters, base) when `params` carries adapters,
    else (params, None), a full fine-tune. `join` undoes it."""
    layers = params.get("layers", [])
    if not any(_is_adapter(n) for lp in layers for n in lp):
        return params, None
    adapters = [{n: w for n, w in lp.items() if _is_adapter(n)} for lp in layers]
    base = [{n: w for n, w in lp.items() if not _is_adapter(n)} for lp in layers]
    return {"layers": adapters}, {**params, "layers": base}


def join(trainable: dict, frozen: dict | None) -> dict:
    return trainable if frozen is None else attach(frozen, trainable)


def base(params: dict) -> dict:
    """The params without their adapters (themselves for a full model)."""
    frozen = split(params)[1]
    return params if frozen is None else frozen


def delta(eq: str, x: jax.Array, a: jax.Array, b: jax.Array, scale: float) -> jax.Array:
    """s (x A) B for the linear layer `eq` ("btd,dnh->bnth": x's, the weight's and the
    output's dimensions; the weight's first A.ndim - 1 are its input), in x's dtype."""
    ins, out = eq.split("->")
    x_dims, w_dims = ins.split(",")
    w_in = w_dims[: a.ndim - 1]
    rows = "".join(c for c in x_dims if c not in w_in)
    xa = jnp.einsum(f"{x_dims},{w_in}r->{rows}r", x, a.astype(x.dtype))
    return scale * jnp.einsum(f"{rows}r,r{w_dims[len(w_in) :]}->{out}", xa, b.astype(x.dtype))


def merged(params: dict, cfg) -> dict:
    """The base params with each adapter folded in, W + s A B in W's dtype (a model
    transformers or vLLM reads); params without adapters are returned as they are."""
    adapters, frozen = split(params)
    if frozen is None:
        return params
    layers = []
    for lp, ad in zip(frozen["layers"], adapters["layers"]):
        lp = dict(lp)
        for name in cfg.lora.targets:
            a, b = ad[name + family.LORA_A], ad[name + family.LORA_B]
            ab = jnp.tensordot(a.astype(jnp.float32), b.astype(jnp.float32), axes=1)
            lp[name] = (lp[name].astype(jnp.float32) + cfg.lora.scale * ab).astype(lp[name].dtype)
        layers.append(lp)
    return {**frozen, "layers": layers}


def _peft_names(cfg, i: int, name: str) -> tuple[str, str]:
    module = family.get(cfg.family).layer[name].hf.removesuffix(".weight")
    prefix = f"base_model.model.model.layers.{i}.{module}"
    return f"{prefix}.lora_A.weight", f"{prefix}.lora_B.weight"


def _module(w: family.Weight) -> str:
    """PEFT's `target_modules` entry of layer weight `w` ("q_proj")."""
    return w.hf.removesuffix(".weight").rsplit(".", 1)[-1]


def save_peft(folder: str, params: dict, cfg, base_model: str) -> None:
    """`params`' adapters as a PEFT adapter folder (adapter_config.json +
    adapter_model.safetensors, float32), one tensor on the host at a time."""
    adapters, frozen = split(params)
    if frozen is None:
        raise ValueError("no LoRA adapters to export: the run trained the full model")
    lora, tensors = cfg.lora, []
    for i, ad in enumerate(adapters["layers"]):
        for name in lora.targets:
            a_name, b_name = _peft_names(cfg, i, name)
            a, b = ad[name + family.LORA_A], ad[name + family.LORA_B]
            n_in, n_out = (math.prod(d) for d in _dims(cfg, name))
            tensors += [  # torch's [r, in] and [out, r]
                (a_name, (lora.rank, n_in), lambda a=a, n=n_in: np.asarray(a).reshape(n, -1).T),
                (b_name, (n_out, lora.rank), lambda b=b, n=n_out: np.asarray(b).reshape(-1, n).T),
            ]
    os.makedirs(folder, exist_ok=True)
    safetensors_io.write(os.path.join(folder, PEFT_WEIGHTS), tensors, "float32")
    config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base_model,
        "r": lora.rank,
        "lora_alpha": lora.alpha,
        "use_rslora": lora.rslora,
        "target_modules": [_module(family.get(cfg.family).layer[n]) for n in lora.targets],
        "lora_dropout": 0.0,
        "bias": "none",
        "fan_in_fan_out": False,
        "inference_mode": True,
    }
    with open(os.path.join(folder, PEFT_CONFIG), "w") as f:
        json.dump(config, f, indent=2)


def read_peft_config(folder: str) -> LoraConfig:
    """The LoraConfig of a PEFT adapter folder; one line for what this code cannot read
    (another PEFT method, biases, per-module ranks, a module no family has; `check` then
    holds it against the model's family)."""
    path = os.path.join(folder, PEFT_CONFIG)
    if not os.path.isfile(path):
        raise ValueError(f"{folder}: not a PEFT adapter folder (no {PEFT_CONFIG})")
    with open(path) as f:
        c = json.load(f)
    unread = {"peft_type": c.get("peft_type") not in (None, "LORA"),
              "bias": c.get("bias", "none") != "none",
              "rank_pattern": bool(c.get("rank_pattern")),
              "alpha_pattern": bool(c.get("alpha_pattern")),
              "use_dora": bool(c.get("use_dora"))}  # fmt: skip
    if bad := [k for k, v in unread.items() if v]:
        raise ValueError(f"{path}: {bad[0]}={c.get(bad[0])!r} is not supported (plain LoRA only)")
    by_module = {
        _module(w): n for fam in family.every() for n, w in fam.layer.items() if w.linear_in
    }
    modules = c.get("target_modules") or []
    modules = [modules] if isinstance(modules, str) else modules
    if missing := [m for m in modules if m not in by_module]:
        raise ValueError(
            f"{path}: target module {missing[0]!r} is not a linear layer this code knows: "
            f"allowed {sorted(by_module)}"
        )
    targets = tuple(n for n in ALL_TARGETS if n in {by_module[m] for m in modules})
    return LoraConfig(int(c["r"]), float(c["lora_alpha"]), targets, bool(c.get("use_rslora")))


def load_peft(folder: str, cfg) -> dict:
    """The adapters of a PEFT folder for `cfg` (whose `lora` is `read_peft_config`'s), in
    our layout; one line for a tensor missing or of another shape (another base model)."""
    path = os.path.join(folder, PEFT_WEIGHTS)
    if not os.path.isfile(path):
        raise ValueError(f"{folder}: no {PEFT_WEIGHTS} (a .bin adapter: save it as safetensors)")
    entries, lora = safetensors_io.index(path), cfg.lora
    layers = []
    for i in range(cfg.n_layers):
        layer = {}
        for name in lora.targets:
            d_in, d_out = _dims(cfg, name)
            for hf, want, ours, suffix in zip(
                _peft_names(cfg, i, name),
                ((lora.rank, math.prod(d_in)), (math.prod(d_out), lora.rank)),
                ((*d_in, lora.rank), (lora.rank, *d_out)),
                (family.LORA_A, family.LORA_B),
            ):
                entry = entries.get(hf)
                if entry is None or entry[2] != want:
                    got = "missing" if entry is None else f"shape {entry[2]}"
                    raise ValueError(
                        f"{path}: {hf} is {got}, this model needs {want} (an adapter of "
                        "another base model?)"
                    )
                w = np.asarray(safetensors_io.read(entry), np.float32).T.reshape(ours)
                layer[name + suffix] = jnp.asarray(w)
        layers.append(layer)
    return {"layers": layers}
