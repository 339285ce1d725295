"""Per-device memory of a training run, estimated from shapes before any weight is read.

A step's peak is what stays resident plus the larger of its two phases:

- resident: the params, the frozen reference policy (when the KL term is on) and the
  optimizer's moments, each at its shard size on the mesh (`parallel.RULES`); with LoRA
  the params are the base and its adapters, the reference is the base itself (no copy),
  and the moments and gradients are the adapters' only;
- rollout: the KV cache of the rollout batch in the activation dtype (every prompt row's
  keys once, each decode row's response keys; with decode slots, each slot's copy of its
  prompt's keys too), the prefill's widest layer (its attention scores: a prompt against
  itself when dense, one tile per row when blockwise; the MLP's hidden state) and the
  sampler's logits;
- update: one micro-batch's gradients (and, where an optimizer step sums several, the
  accumulator beside them), the activations one micro-batch keeps for its backward pass,
  and the backward's workspace. Per layer and token, without remat, what XLA's buffer
  assignment of the update keeps (the demo's, SmolLM2-135M, counted value by value): the
  block's input, its mid-block residual and two normed inputs; q before and after RoPE,
  its rotated half, its grouped copy for the attention einsum, the attention output and
  its flattened copy; k after RoPE, its rotated half and v; the MLP's gate and up, the
  SiLU's sigmoid and output, two more values of its linearisation, and the product; and
  attention's own (dense: float32 scores and probabilities against every key the token
  sees; blockwise or fused: its float32 output and log-sum-exp). The backward's workspace:
  dense attention's gradients of one layer's scores; blockwise, a tile per row; the fused
  kernel's, none (its tiles stay on chip), but it runs each row as one prompt + response
  sequence, so the update's prompt tokens count once a row (`rl/scoring.py`). With
  `remat=block` a layer keeps its input only and the backward rebuilds one layer, and its
  cotangents, at a time (twice a layer's activations by the shorter count of `_Sizes.full`,
  not yet checked against XLA's buffer assignment with remat); `dots` also keeps its weight
  matmuls' outputs. The log-probs hold one chunk's (`model.logits_chunk` tokens)
  float32 logits, their log-softmax and its gradient (`model.logits_chunk`), and the
  final hidden states the chunks are cut from.

With `scan_layers` the prefill and the update each hold a stacked copy of the layers'
weights for their scan (XLA's buffer assignment for the 1.5B update at 28 layers: 2.51 GiB
more temporaries than unrolled, against 2.44 GiB of layer weights; the stacked gradient
takes no more).

Pi_old and the reference policy are scored a micro-batch at a time, a forward only: less
than the update's micro-batch. Rows are divided over the batch axes (data x fsdp) and
heads, vocabulary and MLP width over tensor wherever the rules shard them. The estimate is
of arrays, not of the runtime (the Python process, XLA's code, the allocator's slack).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os

import jax
import numpy as np

from explore_rl import parallel
from explore_rl.models import attention, family, lora, transformer
from explore_rl.models.presets import ModelConfig

GIB = 2**30
# the terms of each phase (`estimate` makes them all)
RESIDENT = ("params", "reference params", "optimizer moments")
ROLLOUT = ("KV cache", "prefill workspace", "sampling logits", "stacked layers")
UPDATE = ("gradients", "activations", "backward workspace", "logits", "stacked layers")


@dataclasses.dataclass(frozen=True)
class StepSizes:
    """The sizes of one training step that memory depends on."""

    prompts: int  # prompt rows prefilled per rollout batch
    decode_rows: int  # rows decoded at once: the rows, or the engine's slots
    prompt_len: int  # padded prompt length (the bucket of the longest prompt)
    new_tokens: int  # response length
    update_prompts: int  # prompts in one micro-batch of the update
    update_rows: int  # rows in one micro-batch of the update
    slotted: bool = False  # decode slots hold a copy of their prompt's keys
    update_length: int = 0  # response tokens a micro-batch keeps of a row; 0 = new_tokens
    micro_batches: int = 1  # micro-batches an optimizer step sums (past one: an accumulator)


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

    @property
    def fits(self) -> bool:
        return self.peak <= self.capacity

    @property
    def capacity_of(self) -> tuple[int, str]:
        """The device it was made against (for estimates of other settings)."""
        return self.capacity, self.device

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

    def check(self, fixes: list[str] = ()) -> None:
        """A one-line refusal, naming the biggest term and the `fixes` (settings with
        which the estimate fits), when the peak exceeds the device."""
        if self.fits:
            return
        phase = UPDATE if self.update >= self.rollout else ROLLOUT  # the one that sets the peak
        counted = {k: self.terms[k] for k in RESIDENT + phase}
        biggest = max(counted, key=counted.get)
        advice = (
            "it would fit with " + "; or ".join(fixes)
            if fixes
            else "shard over more devices (mesh.*), use bfloat16 (model.param_dtype, "
            "model.dtype), or lower rollout.prompts or rollout.max_new_tokens"
        )
        raise ValueError(
            f"the run needs ~{self.peak / GIB:.1f} GiB per device, {self.device} has "
            f"{self.capacity / GIB:.1f} GiB; the biggest part is {biggest} "
            f"({counted[biggest] / GIB:.1f} GiB): {advice}"
        )


# JAX's GPU allocator takes this share of a GPU's memory, not all of it: jaxlib reads the
# first variable, or its deprecated older name (xla_client.py), and defaults to 0.75
# (docs.jax.dev, "GPU memory allocation"); XLA_PYTHON_CLIENT_ALLOCATOR=platform: no pool.
MEM_FRACTION_VARS = ("XLA_CLIENT_MEM_FRACTION", "XLA_PYTHON_CLIENT_MEM_FRACTION")
DEFAULT_MEM_FRACTION = 0.75


def usable_fraction() -> float:
    """The share of a GPU's memory a JAX process may use, by this process's environment."""
    if os.environ.get("XLA_PYTHON_CLIENT_ALLOCATOR", "").lower() == "platform":
        return 1.0
    for var in MEM_FRACTION_VARS:
        if os.environ.get(var):
            return float(os.environ[var])
    return DEFAULT_MEM_FRACTION


def device_capacity() -> tuple[int, str]:
    """(bytes, description) of one local device: what an accelerator's allocator may use
    (its `bytes_limit`: on a GPU already JAX's share, `usable_fraction`), or the host's
    memory shared by its CPU devices."""
    device = jax.local_devices()[0]
    stats = device.memory_stats() or {}
    if "bytes_limit" in stats:
        return int(stats["bytes_limit"]), f"{device.device_kind} {device.id}, JAX's usable share"
    host = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    n = jax.local_device_count()
    return host // n, "host memory" + (f" / {n} CPU devices" if n > 1 else "")


def per_device_bytes(tree, axis_sizes: dict) -> int:
    """Per-device bytes of an abstract params (or optimizer-state) pytree on a mesh of
    `axis_sizes`, each leaf divided as `parallel.param_shardings` places it."""

    def leaf(path, x):
        spec = parallel.spec(parallel.leaf_name(path), tuple(x.shape), axis_sizes, family.axes)
        return math.prod(x.shape) // _divisor(spec, axis_sizes) * np.dtype(x.dtype).itemsize

    return sum(jax.tree.leaves(jax.tree_util.tree_map_with_path(leaf, tree)))


def _divisor(spec, axis_sizes) -> int:
    axes = [a for dim in spec if dim for a in ((dim,) if isinstance(dim, str) else dim)]
    return math.prod(axis_sizes[a] for a in axes)


def _local(name: str, n: int, axis_sizes) -> int:
    """A dimension of logical `name` and size n on one device, as `parallel.RULES` shard it."""
    return n // _divisor(parallel.logical_spec((name,), (n,), axis_sizes), axis_sizes)


class _Sizes:
    """One device's share of the model's dimensions, in bytes where it says so."""

    def __init__(self, cfg: ModelConfig, axis_sizes: dict):
        local = lambda name, x: _local(name, x, axis_sizes)  # noqa: E731
        self.a = np.dtype(cfg.jnp_dtype).itemsize
        self.d, self.h, self.layers = cfg.d_model, cfg.head_dim, cfg.n_layers
        self.n, self.k = local("heads", cfg.n_heads), local("kv_heads", cfg.n_kv_heads)
        self.f, self.v = local("mlp", cfg.d_ff), local("vocab", cfg.vocab_size)
        self.cfg = cfg
        self.fused = attention.uses_fused(cfg.attention, cfg.jnp_dtype, cfg.head_dim)

    def blockwise(self, queries: int) -> bool:
        c = self.cfg
        long = c.attention == "auto" and queries > c.attention_block
        return (c.attention == "blockwise" or long) and not self.fused

    def attention_kept(self, queries: int, keys: int) -> int:
        """What attention keeps of one query for the backward."""
        if self.fused or self.blockwise(queries):
            return (self.n * self.h + self.n) * 4  # float32 output and log-sum-exp
        return 2 * self.n * keys * 4  # float32 scores and probabilities

    def attention_tile(self, rows: int, queries: int, keys: int) -> int:
        """Blockwise attention's live tiles (scores, probabilities, their gradient)."""
        if not self.blockwise(queries):
            return 0
        b = self.cfg.attention_block
        return rows * self.n * b * min(b, keys) * 4 * 3

    def score_gradient(self, rows: int, queries: int, keys: int) -> int:
        """Dense attention's backward: one layer's float32 gradients of its scores and
        probabilities at once."""
        if self.fused or self.blockwise(queries):
            return 0
        return rows * self.n * queries * keys * 4 * 2

    def full(self, queries: int, keys: int) -> int:
        """One layer's activations of one token, as a rematerialised backward rebuilds them:
        the block's stream, q/k/v before and after RoPE, the attention output, the MLP's
        gate, up, activation and product, and attention's own."""
        d, n, k, h, f = self.d, self.n, self.k, self.h, self.f
        return (6 * d + 3 * n * h + 3 * k * h + 4 * f) * self.a + self.attention_kept(queries, keys)

    def kept(self, queries: int, keys: int) -> int:
        """What one layer keeps of one token until the backward, by the remat policy
        (without remat: the module docstring's list, the linearisation's intermediates
        included)."""
        d, n, k, h, f = self.d, self.n, self.k, self.h, self.f
        if self.cfg.remat == "block":
            return d * self.a
        if self.cfg.remat == "dots":  # input, q/k/v, attention out, gate, up, down
            return (3 * d + n * h + 2 * k * h + 2 * f) * self.a
        return (4 * d + 6 * n * h + 3 * k * h + 7 * f) * self.a + self.attention_kept(queries, keys)


@functools.lru_cache(maxsize=64)
def _state_bytes(cfg: ModelConfig, axes: tuple, optimizer) -> tuple[int, int, int, int]:
    """Per-device bytes of the params (a LoRA model's adapters too), of what trains (the
    adapters, or every weight), of its optimizer moments and of the scanned layers' stack
    (0 unstacked) on a mesh of `axes` ((name, size) pairs), from `jax.eval_shape`. Kept
    per (model, mesh, optimizer): a search for the settings that make a run fit
    (`train.sizing.fixes`) asks for dozens of estimates of one model, and tracing a
    36-layer model's init takes a tenth of a second each time."""
    axis_sizes = dict(axes)

    def init():
        params = transformer.init_params(cfg, jax.random.key(0))
        return lora.attach(params, lora.init(cfg, jax.random.key(1))) if cfg.lora else params

    params = jax.eval_shape(init)
    trainable = lora.split(params)[0]
    moments = jax.eval_shape(optimizer.init, trainable)
    stacked = per_device_bytes(params["layers"], axis_sizes) if cfg.scan_layers else 0
    return (
        per_device_bytes(params, axis_sizes),
        per_device_bytes(trainable, axis_sizes),
        per_device_bytes(moments, axis_sizes),
        stacked,
    )


def estimate(
    cfg: ModelConfig, axis_sizes: dict, optimizer, sizes: StepSizes, reference: bool,
    capacity: tuple[int, str] | None = None,
) -> Footprint:  # fmt: skip
    """The terms of one step on a mesh of `axis_sizes` (`dict(mesh.shape)`), from
    `jax.eval_shape` of the params and the optimizer's state and the step's sizes (see the
    module's docstring); against `capacity` (bytes, device), by default a local device's."""
    state = _state_bytes(cfg, tuple(sorted(axis_sizes.items())), optimizer)
    p_bytes, t_bytes, m_bytes, stacked = state
    z = _Sizes(cfg, axis_sizes)
    s, a = sizes, z.a
    local = lambda name, x: _local(name, x, axis_sizes)  # noqa: E731
    prompts, decode = local("batch", s.prompts), local("batch", s.decode_rows)
    kv_tokens = prompts * s.prompt_len + decode * (
        s.new_tokens + (s.prompt_len if s.slotted else 0)
    )
    kv = z.layers * 2 * z.k * z.h * a * kv_tokens
    prompt_tokens = prompts * s.prompt_len
    # a layer's stream (input, normed, attention and projection outputs, residual) and its
    # MLP (gate, up, activation, product), with attention's scores: one tile, or all
    prefill = prompt_tokens * (5 * z.d + 4 * z.f) * a
    if not z.fused:
        prefill += (
            z.attention_tile(prompts, s.prompt_len, s.prompt_len) // 3
            if z.blockwise(s.prompt_len)
            else prompt_tokens * z.n * s.prompt_len * 4 * 2
        )
    sampling = decode * z.v * 4 * 3
    u_prompts, u_rows = local("batch", s.update_prompts), local("batch", s.update_rows)
    length = s.update_length or s.new_tokens
    keys = s.prompt_len + length  # what a response token sees
    p_tok, r_tok = (u_rows if z.fused else u_prompts) * s.prompt_len, u_rows * length
    acts = z.layers * (p_tok * z.kept(s.prompt_len, s.prompt_len) + r_tok * z.kept(length, keys))
    workspace = max(
        z.attention_tile(u_prompts, s.prompt_len, s.prompt_len),
        z.attention_tile(u_rows, length, keys),
        z.score_gradient(u_rows, length, keys),
    )
    if cfg.remat != "none":  # the backward rebuilds one layer, and its cotangents, at a time
        workspace += 2 * (p_tok * z.full(s.prompt_len, s.prompt_len) + r_tok * z.full(length, keys))
    chunk = max(min(cfg.logits_chunk // max(u_rows, 1), length), 1)  # `token_logprobs`'
    logits = u_rows * chunk * z.v * 4 * 3 + r_tok * z.d * a  # + the hidden states it cuts
    capacity, device = capacity or device_capacity()
    terms = {
        "params": p_bytes,
        "reference params": p_bytes if reference and not cfg.lora else 0,  # LoRA's: the base
        "optimizer moments": m_bytes,
        "gradients": t_bytes * (2 if s.micro_batches > 1 else 1),
        "activations": acts,
        "backward workspace": workspace,
        "logits": logits,
        "KV cache": kv,
        "prefill workspace": prefill,
        "sampling logits": sampling,
        "stacked layers": stacked,
    }
    return Footprint(terms, capacity, device)
