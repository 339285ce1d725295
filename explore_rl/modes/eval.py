"""`--mode eval`: a model, or a run's checkpoint, on the held-out benchmarks.

    python -m explore_rl.main --mode eval --config configs/grpo.py:demo \\
        --config.eval.checkpoint=runs/demo [--config.eval.step=6] --workdir runs/demo-eval
"""

from __future__ import annotations

import json
import os

import jax
import optax

from explore_rl import checkpoint as checkpoint_lib
from explore_rl import parallel
from explore_rl.evaluation.evaluate import evaluate_policy, fit_held_out, run_keys
from explore_rl.exploration import base as exploration
from explore_rl.hoststate import HostState
from explore_rl.models import family, lora
from explore_rl.sampling.engine import AUTO
from explore_rl.spec import RunSpec, replace
from explore_rl.train import sizing
from explore_rl.train.build import new_adapters


def run_eval(spec: RunSpec, workdir: str | None, name: str = "eval") -> dict:
    """--mode eval: the model, or a run's checkpoint (`eval.checkpoint`, `eval.step`), on the
    held-out benchmarks; writes `<name>.json` and `<name>_responses.jsonl` (every response
    with its extracted answer) to `workdir` (a study evaluates one checkpoint several ways
    in its run's folder, each under its own name). Only the params (and the eval config's
    explorers' state, for methods that act at test time) are restored: no optimizer state
    is allocated, and the training run's methods need not be in the eval config."""
    explorers = exploration.build(spec)
    # one writer per work directory, checked now, not after the whole evaluation
    with checkpoint_lib.only_writer(workdir, take=bool(workdir) and parallel.is_main_process()):
        return _evaluate(spec, explorers, workdir, name)


def _evaluate(spec: RunSpec, explorers: list, workdir: str | None, name: str) -> dict:
    mesh = spec.mesh.make()
    params, cfg, tok = spec.model.load(spec.seed, parallel.placer(mesh, family.axes))
    spec = spec.with_stop_ids(tok.stop_ids)
    test_sets, longest = fit_held_out(spec, tok, spec.problems()[1])
    if spec.rollout.engine.slots == AUTO:  # the most that fit beside the params alone
        variant = sizing.eval_variant(spec)
        n = sizing.fit_slots(variant, cfg, dict(mesh.shape), optax.identity(), longest, explorers)
        spec = replace(spec, **{"eval.engine.slots": n})
    ctx = exploration.StepContext(params, cfg, tok, spec, 0)
    states = {ex.name: ex.template(ctx) for ex in explorers}
    step, folder = 0, None
    if spec.eval.checkpoint:
        folder, step = checkpoint_lib.locate(spec.eval.checkpoint, spec.eval.step)
        arrays = {n: _arrays(s) for n, s in states.items() if jax.tree.leaves(_arrays(s))}
        if cfg.lora:  # a LoRA run's checkpoint holds its adapters, beside this base
            params = lora.attach(params, new_adapters(spec, cfg, mesh))
        trainable, frozen = lora.split(params)
        like = {"state": {"params": trainable}, **({"explorers": arrays} if arrays else {})}
        saved = checkpoint_lib.restore_subset(folder, step, like)
        params = lora.join(saved["state"]["params"], frozen)
        for n in arrays:  # the saved arrays, beside the host data the template holds
            restored = saved["explorers"][n]
            states[n] = {**states[n], **restored} if isinstance(states[n], dict) else restored
    records = []
    with spec.reward.verifier() as verifier, parallel.use(mesh):
        key = jax.random.fold_in(run_keys(spec.seed)[1], step)
        results = evaluate_policy(
            params, cfg, tok, spec, test_sets, verifier, key, explorers, states, step, records
        )
    if workdir and parallel.is_main_process():
        # the responses first, then <name>.json all or nothing: its presence means the whole
        # evaluation was written (a study reads it as "this run is evaluated")
        with open(os.path.join(workdir, f"{name}_responses.jsonl"), "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in records)
        evaluated = _evaluated(spec, test_sets, folder, step)
        out = os.path.join(workdir, f"{name}.json")
        checkpoint_lib.write_json(out, {**evaluated, **results}, 2)
    return results


def _evaluated(spec: RunSpec, test_sets: dict, folder: str | None, step: int) -> dict:
    """What an evaluation evaluated, beside its results: the checkpoint (or the model), the
    benchmarks and how many of each one's questions, and how it sampled (with
    `eval.temperatures`, each label's temperature)."""
    e = spec.eval
    return {
        "step": step,
        "checkpoint": os.path.join(folder, str(step)) if folder else None,
        "model": spec.model.random_init or spec.model.path,
        "task": {"name": spec.task.name, "preset": spec.task.preset,
                 "test_paths": spec.task.test_paths},
        "benchmarks": {
            name: {"questions": min(e.num_prompts or len(p), len(p)), "of": len(p)}
            for name, p in test_sets.items()
        },
        "sampling": {"samples": e.samples, "temperature": e.temperature,
                     "top_p": e.sampling.top_p, "max_new_tokens": e.sampling.max_new_tokens,
                     **({"temperatures": {t.label: t.value for t in e.temperatures}}
                        if e.temperatures else {})},
        "methods": [n for n, _ in spec.methods],
    }  # fmt: skip


def _arrays(state):
    """An explorer state without its host data (`HostState`): what evaluation restores."""
    if isinstance(state, dict):
        return {k: _arrays(v) for k, v in state.items() if not isinstance(v, HostState)}
    return state
