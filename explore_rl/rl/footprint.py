"""Per-device memory of a training run, estimated from shapes before any weight is read.

A step's peak is what stays resident plus the larger of its two phases:

- resident: the params, the frozen reference policy (when the KL term is on) and the
  optimizer's moments, each at its shard size on the mesh (`parallel.param_shardings`);
- rollout: the KV cache of the rollout batch (every prompt row's keys once, each decode
  row's response keys; with decode slots, each slot's copy of its prompt's keys too), the
  prefill's widest layer (attention scores of a prompt against itself, the MLP's hidden
  state) and the sampler's logits;
- update: the gradient (the accumulator and one micro-batch's) and the activations one
  micro-batch keeps for its backward pass: per layer and token the block's inputs and
  normed inputs, the q/k/v projections before and after RoPE, the attention output and
  scores (float32, against every key the token sees), the MLP's gate, up, activation and
  product; plus the float32 logits, their log-softmax and its gradient.

Rows are divided over the batch axes (data x fsdp) and heads, vocabulary and MLP width
over tensor wherever the rules shard them. The estimate is of arrays, not of the
runtime (the Python process, XLA's code, the allocator's slack).
"""

from __future__ import annotations

import dataclasses
import math
import os

import jax
import numpy as np

from explore_rl import parallel
from explore_rl.models import transformer
from explore_rl.models.presets import ModelConfig

GIB = 2**30
# the terms of each phase (`estimate` makes them all)
RESIDENT = ("params", "reference params", "optimizer moments")
ROLLOUT = ("KV cache", "prefill workspace", "sampling logits")
UPDATE = ("gradients", "activations")


@dataclasses.dataclass(frozen=True)
class StepShape:
    """The sizes of one training step that memory depends on."""

    prompts: int  # prompt rows prefilled per rollout batch
    decode_rows: int  # rows decoded at once: the rows, or the engine's slots
    prompt_len: int  # padded prompt length (the bucket of the longest prompt)
    new_tokens: int  # response length
    update_prompts: int  # prompts in one micro-batch of the update
    update_rows: int  # rows in one micro-batch of the update
    slotted: bool = False  # decode slots hold a copy of their prompt's keys


@dataclasses.dataclass(frozen=True)
class Footprint:
    terms: dict[str, int]  # bytes per device, by what holds them
    capacity: int  # bytes one device has
    device: str  # what the capacity is of

    def _sum(self, names) -> int:
        return sum(self.terms[k] for k in names)

    @property
    def resident(self) -> int:
        return self._sum(RESIDENT)

    @property
    def rollout(self) -> int:
        return self._sum(ROLLOUT)

    @property
    def update(self) -> int:
        return self._sum(UPDATE)

    @property
    def peak(self) -> int:
        return self.resident + max(self.rollout, self.update)

    def summary(self) -> str:
        terms = ", ".join(f"{k} {v / GIB:.2f}" for k, v in self.terms.items() if v)
        return (
            f"memory per device (estimate, GiB): {terms}; peak {self.peak / GIB:.2f} of "
            f"{self.capacity / GIB:.1f} ({self.device})"
        )

    def record(self) -> dict:
        """What config.json keeps of it."""
        return {
            "terms_gib": {k: round(v / GIB, 4) for k, v in self.terms.items()},
            "peak_gib": round(self.peak / GIB, 4),
            "device_gib": round(self.capacity / GIB, 2),
            "device": self.device,
        }

    def check(self) -> None:
        """A one-line refusal, naming the biggest term, when the peak exceeds the device."""
        if self.peak <= self.capacity:
            return
        phase = UPDATE if self.update >= self.rollout else ROLLOUT  # the one that sets the peak
        counted = {k: self.terms[k] for k in RESIDENT + phase}
        biggest = max(counted, key=counted.get)
        raise ValueError(
            f"the run needs ~{self.peak / GIB:.1f} GiB per device, {self.device} has "
            f"{self.capacity / GIB:.1f} GiB; the biggest part is {biggest} "
            f"({counted[biggest] / GIB:.1f} GiB): shard over more devices (mesh.*), use "
            "bfloat16 (model.param_dtype, model.dtype), or lower rollout.prompts, "
            "rollout.max_new_tokens or the update's rows (rl.minibatches, "
            "optim.micro_batches)"
        )


def device_capacity() -> tuple[int, str]:
    """(bytes, description) of one local device: an accelerator's own memory, or the
    host's memory shared by its CPU devices."""
    device = jax.local_devices()[0]
    stats = device.memory_stats() or {}
    if "bytes_limit" in stats:
        return int(stats["bytes_limit"]), f"{device.device_kind} {device.id}"
    host = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    n = jax.local_device_count()
    return host // n, "host memory" + (f" / {n} CPU devices" if n > 1 else "")


def per_device_bytes(tree, mesh) -> int:
    """Per-device bytes of an abstract pytree on its `param_shardings`."""
    shardings = parallel.param_shardings(tree, mesh)
    return sum(
        math.prod(s.shard_shape(x.shape)) * np.dtype(x.dtype).itemsize
        for x, s in zip(jax.tree.leaves(tree), jax.tree.leaves(shardings), strict=True)
    )


def _local(name: str, n: int, axis_sizes) -> int:
    """A dimension of logical `name` and size n on one device, as `parallel.RULES` shard it."""
    axes = parallel.logical_spec((name,), (n,), axis_sizes)[0] or ()
    return n // math.prod(axis_sizes[a] for a in ((axes,) if isinstance(axes, str) else axes))


def estimate(cfg: ModelConfig, mesh, optimizer, shape: StepShape, reference: bool) -> Footprint:
    """The terms of one step on `mesh`, from `jax.eval_shape` of the params and the
    optimizer's state and the step's sizes (see the module's docstring)."""
    params = jax.eval_shape(lambda: transformer.init_params(cfg, jax.random.key(0)))
    moments = jax.eval_shape(optimizer.init, params)
    p_bytes = per_device_bytes(params, mesh)
    sizes = dict(mesh.shape)
    local = lambda name, x: _local(name, x, sizes)  # noqa: E731
    a = np.dtype(cfg.jnp_dtype).itemsize
    d, h = cfg.d_model, cfg.head_dim
    n, k = local("heads", cfg.n_heads), local("kv_heads", cfg.n_kv_heads)
    f, v = local("mlp", cfg.d_ff), local("vocab", cfg.vocab_size)
    layers, s = cfg.n_layers, shape
    prompts, decode = local("batch", s.prompts), local("batch", s.decode_rows)
    kv_tokens = prompts * s.prompt_len + decode * (
        s.new_tokens + (s.prompt_len if s.slotted else 0)
    )
    kv = layers * 2 * k * h * a * kv_tokens
    prefill = prompts * s.prompt_len * (n * s.prompt_len * 4 * 2 + (4 * d + 3 * f) * a)
    sampling = decode * v * 4 * 3

    def per_token(keys: int) -> int:  # what one layer keeps of one token for the backward
        return (6 * d + 3 * n * h + 3 * k * h + 4 * f) * a + 2 * n * keys * 4

    u_prompts, u_rows = local("batch", s.update_prompts), local("batch", s.update_rows)
    length = s.new_tokens
    acts = (
        layers
        * (
            u_prompts * s.prompt_len * per_token(s.prompt_len)
            + u_rows * length * per_token(s.prompt_len + length)
        )
        + u_rows * length * v * 4 * 3
    )
    capacity, device = device_capacity()
    terms = {
        "params": p_bytes,
        "reference params": p_bytes if reference else 0,
        "optimizer moments": per_device_bytes(moments, mesh),
        "gradients": 2 * p_bytes,
        "activations": acts,
        "KV cache": kv,
        "prefill workspace": prefill,
        "sampling logits": sampling,
    }
    return Footprint(terms, capacity, device)
