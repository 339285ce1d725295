"""The start-up memory estimate: its terms by hand, its refusal, and against the measured
peak of the CPU demo."""

import json
import os
import platform
import re
import subprocess
import sys

import optax
import pytest

from configs import ase, extra, grpo
from explore_rl import config as config_lib
from explore_rl import memory
from explore_rl.bench import fit, long
from explore_rl.bench.common import rss_bytes
from explore_rl.exploration import base as exploration
from explore_rl.models import presets
from explore_rl.rl import footprint
from explore_rl.rl.train_step import make_optimizer
from explore_rl.spec import replace
from explore_rl.train import loop, sizing

ONE = {"data": 1, "fsdp": 1, "tensor": 1}  # one device


def _estimate(c, longest_prompt=40):
    s = config_lib.spec(c)
    cfg, _ = s.model.config()
    optimizer = make_optimizer(s.optim)
    shape = sizing.step_sizes(s, longest_prompt, ONE)
    return cfg, shape, footprint.estimate(cfg, ONE, optimizer, shape, bool(s.loss.kl_coef))


def test_terms_by_hand_on_one_device():
    c = grpo.get_config("smoke")  # tiny-llama, float32: 2 prompts x 4 rows x 8 tokens
    cfg, shape, est = _estimate(c)
    assert (shape.prompts, shape.decode_rows, shape.prompt_len, shape.new_tokens) == (2, 8, 48, 8)
    assert (shape.update_prompts, shape.update_rows) == (1, 4)  # rl.minibatches = 2
    t = est.terms
    assert t["params"] == cfg.num_params() * 4
    assert t["optimizer moments"] - 2 * t["params"] < 64  # Adam's mu, nu (and two counters)
    # one micro-batch an optimizer step: its gradients only, no accumulator beside them
    assert t["gradients"] == t["params"] and t["reference params"] == 0
    # layers x (k, v) x kv heads x head dim x 4 bytes x (2 prompts x 48 + 8 rows x 8 slots)
    assert t["KV cache"] == 2 * 2 * 2 * 8 * 4 * (2 * 48 + 8 * 8)
    c.rl.minibatches = 1  # a micro-batch of 2 prompts, then of 1: half the activations
    whole = _estimate(c)[2].terms["activations"]
    c.optim.micro_batches = 2
    halves = _estimate(c)[2].terms
    assert halves["activations"] * 2 == whole and halves["gradients"] == 2 * t["params"]
    c.rl.kl_coef = 0.1
    assert _estimate(c)[2].terms["reference params"] == t["params"]
    c.rollout.slots = 3  # each slot holds a copy of its prompt's keys
    kv = _estimate(c)[2].terms["KV cache"]
    assert kv == 2 * 2 * 2 * 8 * 4 * (2 * 48 + 3 * (48 + 8))


def test_the_fused_layout_counts_each_rows_prompt_and_no_score_tiles():
    """The fused kernel runs each update row as prompt + response (`rl/scoring.py`): its
    activations are those of unshared prompts (one a row), and no score tile is live."""
    cfg = presets.get_preset("tiny-llama", attention="blockwise", attention_block=8)
    opt = make_optimizer(config_lib.spec(grpo.get_config("smoke")).optim)

    def est(cfg, update_prompts):
        sizes = footprint.StepSizes(
            prompts=2, decode_rows=8, prompt_len=48, new_tokens=8,
            update_prompts=update_prompts, update_rows=8,
        )  # fmt: skip
        return footprint.estimate(cfg, ONE, opt, sizes, False).terms

    fused = est(cfg.replace(attention="fused"), 2)
    assert fused["activations"] == est(cfg, 8)["activations"] > est(cfg, 2)["activations"]
    assert fused["backward workspace"] == 0 < est(cfg, 2)["backward workspace"]


def test_methods_that_prefill_more_or_longer_prompts_are_counted():
    c = grpo.get_config("smoke")  # 2 prompts x 4 rows x 8 tokens, prompts in the 48 bucket
    s = config_lib.spec(c)
    kv = lambda shape: footprint.estimate(  # noqa: E731
        s.model.config()[0], ONE, make_optimizer(s.optim), shape, False,
    ).terms["KV cache"]  # fmt: skip
    base = sizing.step_sizes(s, 40, ONE)
    shaped = lambda c: exploration.step_sizes(  # noqa: E731
        exploration.build(config_lib.spec(c)), base
    )
    a = ase.get_config("smoke")  # K = 3 routes and the clean one: 4 prefills a problem
    assert (shaped(a).prompts, shaped(a).prompt_len) == (2 * 4, 48)
    assert kv(shaped(a)) == 2 * 2 * 2 * 8 * 4 * (8 * 48 + 8 * 8)
    a.exploration.ase.k = a.exploration.ase.min_pairs = 7  # 8 routes; a group has 4 rows
    assert shaped(a).prompts == 2 * 4
    x = extra.get_config("smoke")  # a guided prompt: the prompt and a response prefix
    assert (shaped(x).prompts, shaped(x).prompt_len) == (2, 64)  # the bucket of 48 + 8
    assert kv(shaped(x)) == 2 * 2 * 2 * 8 * 4 * (2 * 64 + 8 * 8)
    x.exploration.extra.regen = False  # novelty alone: the prompts as they are
    assert shaped(x) == base == shaped(c)


def test_a_run_that_cannot_fit_is_refused_before_any_weight_is_read(tmp_path, monkeypatch):
    c = grpo.get_config("smoke")
    c.model.random_init = "qwen3-8b"  # float32: 30 GiB of params, twice that in moments
    monkeypatch.setattr(footprint, "device_capacity", lambda: (16 * 2**30, "host memory"))

    def never(*args, **kwargs):
        raise AssertionError("weights were loaded")

    monkeypatch.setattr("explore_rl.models.weights.load_params", never)
    with pytest.raises(ValueError) as refused:
        loop.train(config_lib.spec(c), str(tmp_path))
    message = str(refused.value)
    assert "\n" not in message
    assert "per device, host memory has 16.0 GiB; the biggest part is optimizer moments" in message
    # params and moments are sharded over fsdp: enough devices of 16 GiB would hold them
    assert "it would fit with" in message and "x the devices on mesh.fsdp (~" in message
    c.train.check_memory = False  # told to go on: it goes as far as the weights
    with pytest.raises(AssertionError, match="weights were loaded"):
        loop.train(config_lib.spec(c), str(tmp_path))


@pytest.mark.parametrize("name", fit.PAPER_CONFIGS)
def test_every_paper_config_fits_one_node_of_eight_80_gb_devices(name, monkeypatch):
    """Shapes only (the preset each config's model.path names, prompts as long as
    rollout.max_prompt_len), against the 75% of each device JAX takes by default: with its
    memory settings a paper config fits, each of its decode devices holding its own rows,
    but ExTra's (its 6,144-token prompt rows), which is told the settings that would fit
    it; without them (dense attention, every activation and logit kept, every row decoded
    at once) it is hundreds of GiB a device."""
    for var in (*footprint.MEM_FRACTION_VARS, "XLA_PYTHON_CLIENT_ALLOCATOR"):
        monkeypatch.delenv(var, raising=False)
    c, est, fixes = fit.paper_fit(f"configs/{name}.py:paper")
    assert est.capacity == int(0.75 * 80e9)
    assert est.fits == (name != "extra") and bool(fixes) == (not est.fits), est.summary()
    assert all(re.search(r"\(~\d+ GiB\)$", f) for f in fixes)
    assert c.rollout.engine.slots % 8 == 0  # 0: every row at once
    whole = config_lib.load(f"configs/{name}.py:paper")
    whole.model.update(long.LONG_MODES["dense"])
    whole.optim.micro_batch_tokens, whole.optim.micro_batches = 0, 8
    w = config_lib.resolve(whole)
    settings = w.model.run_settings()
    cfg = presets.get_preset(os.path.basename(c.model.path).lower(), **settings)
    before = sizing.estimate(
        w, cfg, {"data": 1, "fsdp": 8, "tensor": 1}, make_optimizer(w.optim),
        w.rollout.max_prompt_len, exploration.build(w), (80 * 10**9, "80 GB"),
    )  # fmt: skip
    assert before.peak > 2 * est.capacity, before.summary()


def test_auto_slots_take_the_most_that_fit():
    """`rollout.slots = "auto"`: every row at once where it fits; on a smaller device the
    most slots whose estimate fits in 90% of it (a linear scan as the check)."""
    c = grpo.get_config("smoke")
    c.rollout.prompts, c.rollout.group_size, c.rollout.max_new_tokens = 32, 16, 256
    c.rl.minibatches, c.model.logits_chunk = 32, 4  # a small update: the rollout sets the peak
    c.rollout.slots = "auto"
    s = config_lib.spec(c)
    cfg, _ = s.model.config()
    args = (s, cfg, ONE, make_optimizer(s.optim), 40, [])
    sized, est = sizing.size(*args)
    assert sized.rollout.engine.slots == 0 and est.fits  # every row at once fits on this host
    peak = lambda n: sizing.estimate(replace(s, **{"rollout.engine.slots": n}), *args[1:]).peak  # noqa: E731
    small = (int((peak(300) + peak(301)) / 2 / sizing.SLOTS_HEADROOM), "a small device")
    expected = max(n for n in range(1, 512) if peak(n) <= sizing.SLOTS_HEADROOM * small[0])
    assert 256 < expected < 512 and sizing.fit_slots(*args, capacity=small) == expected


@pytest.mark.slow
def test_near_the_measured_peak_on_the_cpu_demo():
    """The demo's shape (SmolLM2-135M, 4 prompts x 8 rows x 32 tokens, 4 optimizer steps
    per batch, float32), random weights so that no model file is mapped into memory."""
    out = subprocess.run(
        [sys.executable, "-m", "explore_rl.bench", "memory", "--config",
         "configs/grpo.py:demo", "--random-init", "smollm2-135m", "--steps", "2"],
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    # the estimate counts arrays; the CPU process holds ~0.7 GiB more (BENCHMARKS.md, memory)
    assert 0.7 <= result["estimate_over_measured"] <= 1.25, (result, out.stderr[-2000:])


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="malloc_trim is glibc's")
def test_settling_returns_the_freed_heap_that_glibc_keeps_resident():
    """What the update does before each optimizer step on a CPU: 256 MiB freed in 64 KiB
    blocks (below any mmap threshold glibc uses, so they come from the heap), each between
    two live blocks of the same size, stays resident after the free; `settle` waits for the
    given arrays and hands those pages back."""
    import jax.numpy as jnp
    import numpy as np

    blocks = [np.ones(64 * 1024 // 8) for _ in range(8192)]  # touched: resident
    before_free = rss_bytes()
    del blocks[::2]
    after_free = rss_bytes()
    memory.settle(jnp.ones(3))
    settled = rss_bytes()
    assert before_free - after_free < 32 * 2**20  # glibc kept the freed blocks
    assert after_free - settled > 200 * 2**20, (before_free, after_free, settled)


def test_auto_slots_size_an_evaluation_batch_too():
    """With `rollout.slots = "auto"` an evaluation batch (eval.batch_prompts x eval.samples
    rows of eval.max_new_tokens) gets the most slots that fit beside what stays resident,
    as the training rollout does (was: every row of a batch at once, whatever its size)."""
    c = grpo.get_config("smoke")
    c.rollout.slots = "auto"
    c.eval.batch_prompts, c.eval.samples, c.eval.max_new_tokens = 32, 16, 256
    s = config_lib.spec(c)
    v = sizing.eval_variant(s)
    assert (v.rollout.prompts, v.rollout.group_size, v.rollout.sampling.max_new_tokens) == (
        32,
        16,
        256,
    )
    cfg, _ = s.model.config()
    args = (v, cfg, ONE, make_optimizer(s.optim), 40, [])
    assert sizing.fit_slots(*args) == 0  # every row at once fits on this host

    def need(n):
        e = sizing.estimate(replace(v, **{"rollout.engine.slots": n}), *args[1:])
        return e.resident + e.rollout

    small = (int(need(100) / sizing.SLOTS_HEADROOM) + 1, "a small device")
    assert need(100) <= sizing.SLOTS_HEADROOM * small[0] < need(101)  # 100 fit, not 101
    assert sizing.fit_slots(*args, capacity=small) == 100


def test_auto_slots_size_a_sample_run():
    """`--mode sample` with `rollout.slots = "auto"`: its prompts x samples_per_prompt rows
    get the most slots that fit beside the params alone (no optimizer state)."""
    from explore_rl.modes import sample

    c = grpo.get_config("smoke")
    c.rollout.slots = "auto"
    c.sample.samples_per_prompt, c.sample.max_new_tokens = 16, 256
    cfg, _ = config_lib.resolve(c).model.config()
    rows = [[1] * 40] * 32
    v = sizing.sample_variant(config_lib.spec(c), len(rows), 16, 256)
    assert (v.rollout.prompts, v.rollout.group_size, v.rollout.sampling.max_new_tokens) == (
        32,
        16,
        256,
    )
    assert (
        sample.engine_for(config_lib.spec(c), cfg, rows, ONE).slots == 0
    )  # every row at once fits here
    args = (v, cfg, ONE, optax.identity(), 40, [])

    def need(n):
        e = sizing.estimate(replace(v, **{"rollout.engine.slots": n}), *args[1:])
        return e.resident + e.rollout

    small = (int(need(100) / sizing.SLOTS_HEADROOM) + 1, "a small device")
    assert sample.engine_for(config_lib.spec(c), cfg, rows, ONE, capacity=small).slots == 100
    c.rollout.slots = 8
    assert (
        sample.engine_for(config_lib.spec(c), cfg, rows, ONE, capacity=small).slots == 8
    )  # as configured


def test_the_usable_share_of_a_gpu_is_jaxs_memory_fraction(monkeypatch):
    """JAX's GPU allocator takes 75% of a device unless told otherwise, by the variable's
    new name or its old one; the platform allocator has no pool. `bench fit` sizes against
    that share, and a config that does not fit is told what would."""
    for var in (*footprint.MEM_FRACTION_VARS, "XLA_PYTHON_CLIENT_ALLOCATOR"):
        monkeypatch.delenv(var, raising=False)
    assert footprint.usable_fraction() == 0.75
    monkeypatch.setenv("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.9")
    assert footprint.usable_fraction() == 0.9
    _, est, _ = fit.paper_fit("configs/grpo.py:paper", devices=1, capacity_gb=80.0)
    assert est.capacity == int(0.9 * 80e9)
    monkeypatch.setenv("XLA_PYTHON_CLIENT_ALLOCATOR", "platform")
    assert footprint.usable_fraction() == 1.0
    _, est, fixes = fit.paper_fit("configs/ead.py:paper", devices=1, fraction=0.75)
    assert not est.fits and fixes and "mesh.fsdp" in fixes[-1]


@pytest.mark.parametrize("rank", [0, 8])
def test_the_update_terms_track_xlas_buffer_assignment_with_and_without_lora(rank):
    """The update's terms (one micro-batch's gradients, activations, workspace, logits)
    against XLA's memory analysis of the compiled micro-batch (compiled, not run): its
    output (the gradients) and temporaries. The demo's update (1 prompt of 48 tokens x 8
    rows of 32, float32, no remat) on SmolLM2-135M's layers, 4 of them and a 4,096-token
    vocabulary so that the layers, not the LM head, set most of it; full fine-tuning and
    LoRA alike: 1.12 and 1.04 (at the demo's 30 layers and 49k vocabulary LoRA's was
    0.77 before the activations were counted as XLA keeps them; a full run's second,
    accumulator-less gradient copy had made up for it)."""
    import dataclasses

    import jax
    import jax.numpy as jnp

    from explore_rl.models import lora, transformer
    from explore_rl.rl import train_step

    c = grpo.get_config("demo")
    c.model.random_init, c.model.lora.rank = "smollm2-135m", rank
    s = config_lib.spec(c)
    cfg = s.model.config()[0].replace(n_layers=4, vocab_size=4096)
    shape = sizing.step_sizes(s, 40, ONE)
    est = footprint.estimate(cfg, ONE, make_optimizer(s.optim), shape, False, (2**40, "x"))

    def init():
        params = transformer.init_params(cfg, jax.random.key(0))
        return lora.attach(params, lora.init(cfg, jax.random.key(1))) if cfg.lora else params

    a = jax.ShapeDtypeStruct
    q, b, p, t = c.rollout.prompts, c.rollout.prompts * c.rollout.group_size, 48, 32
    f32, i32 = jnp.float32, jnp.int32
    batch = train_step.Batch(
        a((q, p), i32), a((q, p), bool), a((b, t), i32), a((b, t), bool), a((b,), f32),
        a((b, t), f32), a((b, t), f32), a((b,), f32),
    )  # fmt: skip
    lc = dataclasses.replace(s.loss, **dict.fromkeys(train_step._TRACED_CLIPS, 0.0))
    groups = a((shape.update_prompts,), i32)
    compiled = train_step._accumulate.lower(
        jax.eval_shape(init), None, None, batch, groups, a(groups.shape, bool), a((), f32),
        a((4,), f32), cfg=cfg, lc=lc, length=t,
    ).compile()  # fmt: skip
    xla = compiled.memory_analysis()
    assert (shape.prompt_len, shape.update_rows, shape.micro_batches) == (p, 8, 1)
    ratio = est.update / (xla.output_size_in_bytes + xla.temp_size_in_bytes)
    assert 0.9 <= ratio <= 1.2, (ratio, est.summary())
