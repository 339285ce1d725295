"""Command line entry point.

    python -m explore_rl.main --config configs/grpo.py:demo --workdir runs/demo   # train
    python -m explore_rl.main --mode eval --config configs/grpo.py:demo \\
        --config.eval.checkpoint=runs/demo --workdir runs/demo                    # eval.json
    python -m explore_rl.main --config configs/base.py --mode sample --workdir runs/s
    python -m explore_rl.main --config configs/base.py --mode sample --workdir runs/s4 \\
        --config.sample.temperature=1.0 --config.sample.samples_per_prompt=4 \\
        --config.sample.prompt_file=prompts.txt

Modes: `train` (GRPO; rerunning the same command resumes), `eval` (held-out Mean@n,
Pass@k, Maj@n to WORKDIR/eval.json), `sample` (prints continuations of prompts, a file or
the task's test questions, and writes them to WORKDIR/samples/), `export` (a run's
weights as a Hugging Face folder in WORKDIR: `explore_rl/export.py`).
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time

import jax
import jax.numpy as jnp
from absl import app, flags, logging
from ml_collections import config_flags

import configs
from explore_rl import caching, parallel
from explore_rl import config as config_lib
from explore_rl.sampling import engine, sampler

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "Config file (configs/*.py[:arg]).", lock_config=True
)
_WORKDIR = flags.DEFINE_string("workdir", None, "Run directory (config, samples, ...).")
_MODE = flags.DEFINE_enum("mode", "train", ["train", "eval", "sample", "export"], "What to run.")
_TRACEBACK = flags.DEFINE_bool(
    "traceback", False, "On bad input (a config value, a file), the full traceback too."
)
# Several processes (hosts) in one run: explicitly, or --distributed where the cluster's
# variables say (a TPU pod's workers); srun / mpirun with several tasks need neither.
_COORDINATOR = flags.DEFINE_string("coordinator", "", "Process 0's HOST:PORT (multi-process).")
_NUM_PROCESSES = flags.DEFINE_integer("num_processes", 1, "Processes in the run.")
_PROCESS_ID = flags.DEFINE_integer("process_id", 0, "This process's index in the run.")
_DISTRIBUTED = flags.DEFINE_bool(
    "distributed", False, "Join the processes the cluster started (jax.distributed)."
)


def load_prompts(config) -> list[tuple[str, str | None]]:
    """(prompt, reference answer or None) pairs from the prompt file or the task."""
    s = config.sample
    if not s.prompt_file:
        _, benchmarks = config_lib.load_problems(config)
        if not benchmarks:
            raise ValueError("--mode sample: give sample.prompt_file or task.test_paths")
        problems = next(iter(benchmarks.values()))[: s.num_prompts]
        return [(p.question, p.answer) for p in problems]
    with open(s.prompt_file) as f:
        lines = [line.rstrip("\n") for line in f if line.strip()]
    if not s.prompt_file.endswith(".jsonl"):
        return [(line, None) for line in lines[: s.num_prompts]]
    out = []
    for i, line in enumerate(lines[: s.num_prompts]):
        row = json.loads(line)
        if s.prompt_field not in row:
            raise ValueError(
                f"{s.prompt_file}:{i + 1}: no field {s.prompt_field!r} (fields: {sorted(row)})"
            )
        out.append((str(row[s.prompt_field]), None))
    return out


def run_sample(config, workdir: str | None) -> list[dict]:
    config_lib.validate_sample(config)
    start = time.perf_counter()
    mesh = config_lib.mesh(config)  # rows decoded over every device (and process)
    params, cfg, tok = config_lib.load_policy(config, parallel.placer(mesh))
    say = print if parallel.is_main_process() else lambda *_: None  # one process speaks
    say(
        f"loaded {config.model.path} ({cfg.family}, {cfg.num_params() / 1e6:.0f}M params) "
        f"in {time.perf_counter() - start:.1f}s"
    )
    s = config.sample
    prompts = load_prompts(config)
    fmt = config_lib.prompt_format(config)
    if s.prompt_file:  # the file's prompts as written: the task's instruction is the task's
        fmt = dataclasses.replace(fmt, instruction="")
    rows = [tok.encode(fmt.text(tok, p)) for p, _ in prompts]
    tokens, mask = sampler.left_pad(rows, tok.pad_id)
    g, n = s.samples_per_prompt, len(rows)
    sc = config_lib.sampling_config(config, tok.stop_ids, "sample")
    start = time.perf_counter()
    with parallel.use(mesh):
        out, stats = engine.generate(
            params,
            cfg,
            tokens,
            mask,
            jax.random.key(config.seed),
            jnp.full((n * g, s.max_new_tokens), s.temperature),
            sc,
            config_lib.engine_config(config),
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
            f.write(config_lib.resolved(config).to_json(indent=2))
        with open(os.path.join(workdir, "samples", "sample.jsonl"), "w") as f:
            f.writelines(json.dumps(x) + "\n" for x in samples)
    return samples


def main(argv):
    del argv
    logging.set_verbosity(logging.WARNING)  # orbax and jax are chatty at INFO
    caching.enable_compilation_cache()
    try:
        parallel.initialize(
            _COORDINATOR.value, _NUM_PROCESSES.value, _PROCESS_ID.value, _DISTRIBUTED.value
        )
        _run(_MODE.value, _CONFIG.value, _WORKDIR.value)
    except (ValueError, OSError) as e:  # bad input, a full disk: one line that names it
        if _TRACEBACK.value or not _raised_here(e):
            raise
        from explore_rl.checkpoint import SaveFailed

        line = f"error: {e}  (--traceback for the trace)"
        if isinstance(e, SaveFailed):  # Orbax's threads may report the write again
            _say_last(line)
        else:
            print(line, file=sys.stderr)
        sys.exit(2)


def _say_last(line: str) -> None:
    """`line` as the last words on stderr, on a line of its own: what a library's threads
    (a failed checkpoint write's) still write while the process ends is discarded, and a
    line of theirs left half-written does not run into it."""
    sys.stdout.flush()
    sys.stderr.flush()
    err = os.dup(2)
    os.dup2(os.open(os.devnull, os.O_WRONLY), 2)
    sys.stderr = open(os.devnull, "w")  # noqa: SIM115 - open until the process ends
    os.write(err, f"\n{line}\n".encode())


def _raised_here(e: BaseException) -> bool:
    """Whether our own checks raised `e` (bad input), not a library (a bug, kept whole)."""
    tb = e.__traceback__
    while tb.tb_next is not None:
        tb = tb.tb_next
    ours = (os.path.dirname(os.path.abspath(__file__)), os.path.dirname(configs.__file__))
    return os.path.abspath(tb.tb_frame.f_code.co_filename).startswith(
        tuple(d + os.sep for d in ours)
    )


def _run(mode: str, config, workdir: str | None):
    if mode == "sample":
        run_sample(config, workdir)
        return
    if mode == "export":
        from explore_rl import export

        export.run_export(config, workdir)
        return
    from explore_rl.rl import trainer

    if mode == "eval":
        results = trainer.run_eval(config, workdir)
        print(json.dumps(results, indent=2))
        return
    if not workdir:
        raise app.UsageError("--mode train needs --workdir (checkpoints, metrics, resume)")
    trainer.train(config, workdir)


if __name__ == "__main__":
    flags.mark_flag_as_required("config")
    argv = config_lib.config_argv(sys.argv)
    try:
        config_lib.check_overrides(argv)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    app.run(main, argv=argv)
