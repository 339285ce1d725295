"""`--mode export`: a run's trained weights as a Hugging Face folder.

    python -m explore_rl.main --mode export --config configs/grpo.py:demo \\
        --config.eval.checkpoint=runs/demo [--config.export.step=6] --workdir runs/demo/hf

The folder has `config.json` (the original architecture's name: LlamaForCausalLM,
Qwen2ForCausalLM, Qwen3ForCausalLM), `model.safetensors` (or shards and their index past
`export.max_shard_gb`), the tokenizer files and `generation_config.json` of the model the
run started from (a GGUF-loaded model's are its converted HF files): transformers'
`from_pretrained` loads it (tests/test_export.py), as does `weights.load`; it is the
layout vLLM reads (not tested here). The params are restored alone (no optimizer state)
into their shards on the config's mesh, and written one tensor at a time, so the host
never holds the whole model. `export.dtype`: "" keeps the original checkpoint's dtype (its
config.json's), or "float32" / "bfloat16" / "float16". Without `eval.checkpoint` the model
itself is written (a GGUF file as an HF folder).

A LoRA run (`model.lora.*`, docs/lora.md) exports its adapters merged into the base,
W + (alpha / r) B A, as the same kind of folder, or with `export.format=peft` the adapters
alone as a PEFT adapter folder (`adapter_config.json` + `adapter_model.safetensors`,
float32) that `peft.PeftModel.from_pretrained` loads on the base model.
"""

from __future__ import annotations

import json
import os

import jax

from explore_rl import checkpoint as checkpoint_lib
from explore_rl import parallel
from explore_rl.models import family, lora, presets, weights
from explore_rl.models.transformer import init_params
from explore_rl.spec import RunSpec


def source_dtype(folder: str) -> str:
    """The dtype the original checkpoint was saved in (config.json), float32 if unknown (a
    random-init model of a tokenizer folder: the lab's)."""
    path = os.path.join(folder, "config.json")
    if not os.path.isfile(path):
        return "float32"
    with open(path) as f:
        hf = json.load(f)
    dtype = hf.get("torch_dtype") or hf.get("dtype") or "float32"
    return dtype if dtype in ("float32", "bfloat16", "float16") else "float32"


def trained_params(spec: RunSpec, mesh):
    """(params, cfg, step): `eval.checkpoint`'s params at `export.step` (0 = newest), read
    into their shards without loading the original weights, or the model itself."""
    m = spec.model
    if not spec.eval.checkpoint:
        params, cfg, _ = m.load(spec.seed, parallel.placer(mesh, family.axes))
        return params, cfg, 0
    dtypes = dict(param_dtype=m.param_dtype, dtype=m.dtype)
    if m.random_init:
        vocab = weights.load_tokenizer(m.path).vocab_size
        cfg = presets.get_preset(m.random_init, vocab_size=vocab, **dtypes)
    else:
        cfg = presets.from_hf_config(weights.model_folder(m.path), **dtypes)
    folder, step = checkpoint_lib.locate(spec.eval.checkpoint, spec.export.step, "export.step")
    if m.lora:  # a LoRA run's checkpoint holds its adapters: on the base model.path names
        cfg = cfg.replace(lora=m.lora)
        adapters = jax.eval_shape(lambda: lora.init(cfg, jax.random.key(0)))
        saved = checkpoint_lib.restore_subset(folder, step, _placed_like(adapters, mesh))
        base = weights.load_params(
            m.path, m.random_init, cfg, spec.seed, parallel.placer(mesh, family.axes)
        )
        return lora.attach(base, saved["state"]["params"]), cfg, step
    abstract = jax.eval_shape(lambda: init_params(cfg, jax.random.key(0)))
    saved = checkpoint_lib.restore_subset(folder, step, _placed_like(abstract, mesh))
    return saved["state"]["params"], cfg, step


def _placed_like(abstract, mesh) -> dict:
    """A train state's params of shapes `abstract`, for `restore_subset` onto `mesh`."""
    like = jax.tree.map(
        lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
        abstract,
        parallel.param_shardings(abstract, mesh, family.axes),
    )
    return {"state": {"params": like}}


def run_export(spec: RunSpec, workdir: str | None) -> str:
    """Write the HF folder to `workdir`; returns its path."""
    if not workdir:
        raise ValueError("--mode export needs --workdir (the folder to write)")
    if os.path.exists(workdir) and not os.path.isdir(workdir):  # before any weight is read
        raise ValueError(f"--workdir {workdir}: a file, not a folder")
    if os.path.isdir(workdir) and os.listdir(workdir):
        raise ValueError(f"--workdir {workdir}: not empty (export writes a fresh folder)")
    run = checkpoint_lib.enclosing_run(workdir)
    if run:  # a folder among its checkpoints would break its resume and evaluation
        raise ValueError(f"--workdir {workdir}: inside the run directory {run}; export elsewhere")
    source = weights.model_folder(spec.model.path)
    dtype = spec.export.dtype or source_dtype(source)
    mesh = spec.mesh.make()
    params, cfg, step = trained_params(spec, mesh)
    named = spec.eval.checkpoint or spec.model.path
    if spec.export.format == "peft":  # the base it adapts: its folder, or how it was drawn
        m, here = spec.model, os.path.abspath(source)
        base = f"random {m.random_init} (seed {spec.seed})" if m.random_init else here
        lora.save_peft(workdir, params, cfg, base)
        print(f"exported step {step} of {named}'s LoRA adapters (PEFT) to {workdir}")
        return workdir
    params = lora.merged(params, cfg)
    weights.save_hf(workdir, params, cfg, dtype, int(spec.export.max_shard_gb * 2**30))
    weights.copy_tokenizer(spec.model.path, workdir)
    print(f"exported step {step} of {named} ({dtype}) to {workdir}")
    return workdir
