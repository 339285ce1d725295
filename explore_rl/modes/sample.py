"""`--mode sample`: continuations of prompts (a file's, or the task's test questions),
printed and written to WORKDIR/samples/sample.jsonl.

    python -m explore_rl.main --config configs/base.py --mode sample --workdir runs/s4 \\
        --config.sample.temperature=1.0 --config.sample.samples_per_prompt=4 \\
        --config.sample.prompt_file=prompts.txt
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import time

import jax
import jax.numpy as jnp
import optax

from explore_rl import checkpoint, parallel
from explore_rl.data import jsonl
from explore_rl.models import family
from explore_rl.sampling import engine, shapes
from explore_rl.sampling.engine import AUTO
from explore_rl.spec import RunSpec
from explore_rl.train import sizing


def load_prompts(spec: RunSpec) -> list[tuple[str, str | None]]:
    """(prompt, reference answer or None) pairs from the prompt file or the task."""
    s = spec.sample
    if not s.prompt_file:
        _, benchmarks = spec.problems()
        if not benchmarks:
            raise ValueError("--mode sample: give sample.prompt_file or task.test_paths")
        problems = next(iter(benchmarks.values()))[: s.num_prompts]
        return [(p.question, p.answer) for p in problems]
    if not s.prompt_file.endswith(".jsonl"):
        try:
            with open(s.prompt_file, encoding="utf-8") as f:
                lines = [line.rstrip("\n") for line in f if line.strip()]
        except UnicodeDecodeError as e:
            raise ValueError(f"{s.prompt_file}: not UTF-8 text (byte {e.start})") from None
        return [(line, None) for line in lines[: s.num_prompts]]
    out = []
    for _, where, row in itertools.islice(jsonl.read_rows(s.prompt_file), s.num_prompts):
        if not isinstance(row, dict):
            raise ValueError(f"{s.prompt_file}: {where}: not a JSON object")
        if s.prompt_field not in row:
            raise ValueError(
                f"{s.prompt_file}: {where}: no field {s.prompt_field!r} (fields: {sorted(row)})"
            )
        out.append((str(row[s.prompt_field]), None))
    return out


def engine_for(spec: RunSpec, cfg, rows: list[list[int]], axis_sizes: dict, capacity=None):
    """The decode schedule: with `rollout.slots = "auto"`, the most slots that fit a device
    for these prompts (`sizing.sample_variant`: no optimizer state is resident), else the
    config's."""
    if spec.rollout.engine.slots != AUTO:
        return spec.rollout.engine
    s = spec.sample
    variant = sizing.sample_variant(
        spec, len(rows), s.samples_per_prompt, s.sampling.max_new_tokens
    )
    longest = max(map(len, rows))
    n = sizing.fit_slots(variant, cfg, axis_sizes, optax.identity(), longest, [], capacity)
    return dataclasses.replace(spec.rollout.engine, slots=n)


def run_sample(spec: RunSpec, workdir: str | None) -> list[dict]:
    prompts = load_prompts(spec)  # a bad prompt file is said before the model is read
    run = workdir and checkpoint.enclosing_run(workdir)
    if run:  # its config.json would be replaced by this one
        raise ValueError(f"--workdir {workdir}: inside the run directory {run}; sample elsewhere")
    with checkpoint.only_writer(workdir, take=bool(workdir) and parallel.is_main_process()):
        return _sample(spec, prompts, workdir)


def _sample(spec: RunSpec, prompts: list, workdir: str | None) -> list[dict]:
    start = time.perf_counter()
    mesh = spec.mesh.make()  # rows over every device
    params, cfg, tok = spec.model.load(spec.seed, parallel.placer(mesh, family.axes))
    spec = spec.with_stop_ids(tok.stop_ids)
    say = print if parallel.is_main_process() else lambda *_: None  # one process speaks
    say(
        f"loaded {spec.model.path} ({cfg.family}, {cfg.num_params() / 1e6:.0f}M params) "
        f"in {time.perf_counter() - start:.1f}s"
    )
    s = spec.sample
    fmt = spec.prompt
    if s.prompt_file:  # the file's prompts as written: the task's instruction is the task's
        fmt = dataclasses.replace(fmt, instruction="")
    rows = [tok.encode(fmt.text(tok, p)) for p, _ in prompts]
    tokens, mask = shapes.left_pad(rows, tok.pad_id)
    g, n = s.samples_per_prompt, len(rows)
    start = time.perf_counter()
    with parallel.use(mesh):
        out, stats = engine.generate(
            params,
            cfg,
            tokens,
            mask,
            jax.random.key(spec.seed),
            jnp.full((n * g, s.sampling.max_new_tokens), s.temperature),
            s.sampling,
            engine_for(spec, cfg, rows, dict(mesh.shape)),
        )
    seconds = time.perf_counter() - start
    samples = []
    for i, (toks, m) in enumerate(zip(out.tokens.tolist(), out.mask.tolist())):
        prompt, answer = prompts[i // g]
        text = tok.decode([x for x, keep in zip(toks, m) if keep])
        samples.append({"prompt": prompt, "answer": answer, "response": text})
        say(f"\n> {prompt}" + (f"   [answer {answer}]" if answer is not None else "") + f"\n{text}")
    say(
        f"\n{len(samples)} samples, {stats.useful_tokens} tokens in {seconds:.1f}s "
        f"(compile included; prefill {stats.prefill_s:.1f}s, decode {stats.decode_s:.1f}s, "
        f"{stats.slots} slots {stats.occupancy:.0%} busy, {stats.refills} refills)"
    )
    if workdir and parallel.is_main_process():
        os.makedirs(os.path.join(workdir, "samples"), exist_ok=True)
        with open(os.path.join(workdir, "config.json"), "w") as f:
            json.dump(spec.record, f, indent=2)
        with open(os.path.join(workdir, "samples", "sample.jsonl"), "w") as f:
            f.writelines(json.dumps(x) + "\n" for x in samples)
    return samples
