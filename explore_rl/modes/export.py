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

A run's checkpoint exported names its run and step (`origin.json`), which the start-up
line `model:` of a run that reads the folder says.

A run directory given as `model.path` (as TRL's trainers pass their output folder on) is
such an export made once per machine in the user's cache, of its newest checkpoint or the
one named (`runs/sft/checkpoints/40`, `.../checkpoints/best`), its model as the run's
config.json records it: `main` resolves it for every mode; in a notebook

    c = export.resolve(c)   # model.path: the run's checkpoint as a model folder

A LoRA run (`model.lora.*`, docs/lora.md) exports its adapters merged into the base,
W + (alpha / r) B A, as the same kind of folder, or with `export.format=peft` the adapters
alone as a PEFT adapter folder (`adapter_config.json` + `adapter_model.safetensors`,
float32) that `peft.PeftModel.from_pretrained` loads on the base model.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os

import jax

from explore_rl import caching, parallel
from explore_rl import checkpoint as checkpoint_lib
from explore_rl import config as config_lib
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
    print(f"exported {write(spec, workdir)} to {workdir}")
    return workdir


def write(spec: RunSpec, folder: str) -> str:
    """The export of `spec` written into the empty `folder`; what it holds, in words. A
    run's checkpoint as an HF folder names its run and step (`config.ORIGIN_FILE`)."""
    source = weights.model_folder(spec.model.path)
    params, cfg, step = trained_params(spec, spec.mesh.make())
    named = spec.eval.checkpoint or spec.model.path
    if spec.export.format == "peft":  # the base it adapts: its folder, or how it was drawn
        m, here = spec.model, os.path.abspath(source)
        base = f"random {m.random_init} (seed {spec.seed})" if m.random_init else here
        lora.save_peft(folder, params, cfg, base)
        return f"step {step} of {named}'s LoRA adapters (PEFT)"
    dtype = spec.export.dtype or source_dtype(source)
    params = lora.merged(params, cfg)
    weights.save_hf(folder, params, cfg, dtype, int(spec.export.max_shard_gb * 2**30))
    weights.copy_tokenizer(spec.model.path, folder)
    if spec.eval.checkpoint:
        run = checkpoint_lib.run_of(spec.eval.checkpoint) or os.path.abspath(named)
        with open(os.path.join(folder, config_lib.ORIGIN_FILE), "w") as f:
            json.dump({"run": run, "step": step}, f)
    return f"step {step} of {named} ({dtype})"


def resolve(c):
    """`c` with `model.path` a model folder where it names a run directory (its
    checkpoint's weights: `exported`); else `c`. The command line does this for every mode;
    in a notebook: `c = export.resolve(c)`."""
    run = checkpoint_lib.run_of(c.model.path)
    if not run:
        return c
    if c.model.base:  # the base would replace model.path unseen
        raise ValueError(
            f"model.path={c.model.path} is a run directory and model.base={c.model.base} "
            "names a base model to start from: give one (--config.model.base= starts "
            "from the run)"
        )
    out = copy.deepcopy(c)
    out.model.path, out.model.random_init = exported(c, run), ""
    return out


_FORMAT = "v1"  # bump when what `exported` writes changes


def exported(c, run: str) -> str:
    """The HF folder of the checkpoint `c.model.path` names in `run` (its newest step, or
    the one named: `.../checkpoints/40`, `.../checkpoints/best`), written once per machine
    into the user's cache (`caching.cache_dir("runs", <digest>)`, the digest of the step's
    files and the run's model section) under a lock, so concurrent runs wait for one
    export. A newest step whose files no longer match its digest is passed over for the
    newest intact one, with one line (as evaluation's `checkpoint.locate`); a damaged step
    named is refused. The run's config.json says its model (`_run_model`); its weights are
    written in its `model.param_dtype`, as trained (a LoRA run's adapters merged into its
    base)."""
    given = c.model.path
    holder = checkpoint_lib.writer(run)
    if holder:
        raise ValueError(
            f"model.path={given}: the run {run} is being written by {holder}: start from "
            "it once it has ended"
        )
    try:
        folder, step = checkpoint_lib.named(given)
    except ValueError as e:  # no checkpoint (yet), no such step or best
        raise ValueError(f"model.path={e}") from None
    step = step or checkpoint_lib.steps(folder)[-1]
    model, seed = _run_model(given, run)
    final = _cached(model, seed, folder, step)
    if not os.path.isdir(final):  # exporting reads every file anyway: check them first
        try:  # a damaged newest step is passed over (one line), a damaged named one refused
            folder, step = checkpoint_lib.locate(given)
        except ValueError as e:
            raise ValueError(f"model.path={e}") from None
        final = _cached(model, seed, folder, step)

    def export(tmp: str) -> None:
        x = copy.deepcopy(c)  # this machine's mesh; the run's model, seed and step
        x.model.update({k: v for k, v in model.items() if k in x.model})
        x.model.base, x.seed = "", seed
        x.eval.checkpoint, x.export.step = os.path.join(folder, str(step)), 0
        x.export.format, x.export.dtype = "hf", x.model.param_dtype
        write(config_lib.resolve(x), tmp)
        print(f"model.path={given}: step {step} of {run} exported once, to {final}")

    return caching.build_alone(final, export)


def _cached(model: dict, seed: int, folder: str, step: int) -> str:
    """The cache folder of step `step`'s export: named by the files its digest lists."""
    files = checkpoint_lib.fingerprint(folder, step)
    text = json.dumps([_FORMAT, model, seed, step, files], sort_keys=True)
    return caching.cache_dir("runs", hashlib.sha256(text.encode()).hexdigest()[:20])


def _run_model(given: str, run: str) -> tuple[dict, int]:
    """(the `model` section, the seed) the run's config.json records: what it trained."""
    path = os.path.join(run, "config.json")
    try:
        with open(path) as f:
            recorded = json.load(f)
        model, seed = dict(recorded["model"]), int(recorded["seed"])
    except FileNotFoundError:
        raise ValueError(
            f"model.path={given}: {path} is missing, so the run's model is unknown (restore "
            "it, or --mode export with the run's config makes a model folder)"
        ) from None
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ValueError(
            f"model.path={given}: {path} is unreadable ({type(e).__name__}: {e})"
        ) from None
    base = model.get("path", "")
    if base != weights.EMBEDDED and not os.path.exists(base):
        raise ValueError(
            f"model.path={given}: the run's model.path={base} (its config.json) is not here"
        )
    return model, seed
