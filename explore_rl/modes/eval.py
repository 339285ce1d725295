"""`--mode eval`: a model, or a run's checkpoint, on the held-out benchmarks.

    python -m explore_rl.main --mode eval --config configs/grpo.py:demo \\
        --config.eval.checkpoint=runs/demo [--config.eval.step=6] --workdir runs/demo-eval
"""

from __future__ import annotations

import json
import os

import jax

from explore_rl import checkpoint as checkpoint_lib
from explore_rl import config as config_lib
from explore_rl import parallel
from explore_rl.exploration import base as exploration
from explore_rl.hoststate import HostState
from explore_rl.models import family
from explore_rl.train.build import Run, size_evaluation
from explore_rl.train.steps import run_evaluation


def run_eval(c, workdir: str | None) -> dict:
    """--mode eval: the model, or a run's checkpoint (`eval.checkpoint`, `eval.step`), on the
    held-out benchmarks; writes eval.json and eval_responses.jsonl (every response with its
    extracted answer) to `workdir`. Only the params (and the eval config's explorers' state,
    for methods that act at test time) are restored: no optimizer state is allocated, and
    the training run's methods need not be in the eval config."""
    spec = config_lib.spec(c)
    explorers = exploration.build(spec)
    # one writer per work directory, checked now, not after the whole evaluation
    with checkpoint_lib.only_writer(workdir, take=bool(workdir) and parallel.is_main_process()):
        return _evaluate(spec, explorers, workdir)


def _evaluate(spec, explorers: list, workdir: str | None) -> dict:
    mesh = config_lib.mesh(spec.mesh)
    params, cfg, tok = config_lib.load_policy(
        spec.model, spec.seed, parallel.placer(mesh, family.axes)
    )
    run = Run.create(spec, explorers, cfg, tok, verifier=None, mesh=mesh)
    size_evaluation(run, dict(mesh.shape))  # conservative: counts optimizer moments too
    states = {ex.name: ex.template(run.context(params, 0)) for ex in run.explorers}
    step, folder = 0, None
    if spec.eval.checkpoint:
        folder, step = checkpoint_lib.locate(spec.eval.checkpoint, spec.eval.step)
        arrays = {n: _arrays(s) for n, s in states.items() if jax.tree.leaves(_arrays(s))}
        like = {"state": {"params": params}, **({"explorers": arrays} if arrays else {})}
        saved = checkpoint_lib.restore_subset(folder, step, like)
        params = saved["state"]["params"]
        for n in arrays:  # the saved arrays, beside the host data the template holds
            restored = saved["explorers"][n]
            states[n] = {**states[n], **restored} if isinstance(states[n], dict) else restored
    records = []
    with config_lib.verifier(spec.reward) as run.verifier, parallel.use(mesh):
        results = run_evaluation(run, params, states, step, records)
    if workdir and parallel.is_main_process():
        # the responses first, then eval.json all or nothing: its presence means the whole
        # evaluation was written (a study reads it as "this run is evaluated")
        with open(os.path.join(workdir, "eval_responses.jsonl"), "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in records)
        checkpoint_lib.write_json(
            os.path.join(workdir, "eval.json"), {**_evaluated(run, folder, step), **results}, 2
        )
    return results


def _evaluated(run: Run, folder: str | None, step: int) -> dict:
    """What an evaluation evaluated, beside its results: the checkpoint (or the model), the
    benchmarks and how many of each one's questions, and how it sampled."""
    s, e = run.spec, run.spec.eval
    return {
        "step": step,
        "checkpoint": os.path.join(folder, str(step)) if folder else None,
        "model": s.model.random_init or s.model.path,
        "task": {"name": s.task.name, "preset": s.task.preset, "test_paths": s.task.test_paths},
        "benchmarks": {
            name: {"questions": min(e.num_prompts or len(p), len(p)), "of": len(p)}
            for name, p in run.test_sets.items()
        },
        "sampling": {"samples": e.samples, "temperature": e.temperature, "top_p": e.top_p,
                     "max_new_tokens": e.max_new_tokens},
        "methods": [n for n, _ in s.methods],
    }  # fmt: skip


def _arrays(state):
    """An explorer state without its host data (`HostState`): what evaluation restores."""
    if isinstance(state, dict):
        return {k: _arrays(v) for k, v in state.items() if not isinstance(v, HostState)}
    return state
