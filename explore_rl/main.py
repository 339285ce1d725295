"""Command line entry point.

    python -m explore_rl.main --config configs/grpo.py:demo --workdir runs/demo   # train
    python -m explore_rl.main --mode eval --config configs/grpo.py:demo \\
        --config.eval.checkpoint=runs/demo --workdir runs/demo                    # eval.json
    python -m explore_rl.main --config configs/base.py --mode sample --workdir runs/s
    python -m explore_rl.main --config configs/base.py --mode sample --workdir runs/s4 \\
        --config.sample.temperature=1.0 --config.sample.samples_per_prompt=4 \\
        --config.sample.prompt_file=prompts.txt

Modes, one module each (this file only parses the flags and dispatches): `train` (GRPO;
rerunning the same command resumes: `explore_rl/train/loop.py`), `eval` (held-out Mean@n,
Pass@k, Maj@n to WORKDIR/eval.json: `modes/eval.py`), `sample` (prints continuations of
prompts, a file or the task's test questions, and writes them to WORKDIR/samples/:
`modes/sample.py`), `export` (a run's weights as a Hugging Face folder in WORKDIR:
`modes/export.py`), `sft` (supervised fine-tuning on the task's solutions, with the
training loop's logs, checkpoints, evaluation and resume: `explore_rl/train/sft.py`).
"""

from __future__ import annotations

import json
import os
import sys

from absl import app, flags, logging
from ml_collections import config_flags

import configs
from explore_rl import caching, checkpoint, parallel
from explore_rl import config as config_lib

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "Config file (configs/*.py[:arg]).", lock_config=True
)
_WORKDIR = flags.DEFINE_string("workdir", None, "Run directory (config, samples, ...).")
_MODE = flags.DEFINE_enum(
    "mode", "train", ["train", "sft", "eval", "sample", "export"], "What to run."
)
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


def main(argv):
    del argv
    logging.set_verbosity(logging.WARNING)  # orbax and jax are chatty at INFO
    if not _TRACEBACK.value:
        checkpoint.quiet_orbax_errors()
    caching.enable_compilation_cache()
    try:
        parallel.initialize(
            _COORDINATOR.value, _NUM_PROCESSES.value, _PROCESS_ID.value, _DISTRIBUTED.value
        )
        _run(_MODE.value, _CONFIG.value, _WORKDIR.value)
    except (ValueError, OSError) as e:  # bad input, a full disk: one line that names it
        if _TRACEBACK.value or not _raised_here(e):
            raise
        line = f"error: {e}  (--traceback for the trace)"
        if isinstance(e, checkpoint.SaveFailed):  # Orbax's threads may report the write again
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
    """One module per mode, imported when chosen (export and eval need no trainer)."""
    if mode in ("train", "sft") and not workdir:
        raise app.UsageError(f"--mode {mode} needs --workdir (checkpoints, metrics, resume)")
    if mode != "sft":  # every other mode reads the model a `model.base` recipe makes
        from explore_rl.train import base_model

        config = base_model.resolve(config)
    if mode == "sample":
        from explore_rl.modes.sample import run_sample

        run_sample(config, workdir)
    elif mode == "export":
        from explore_rl.modes.export import run_export

        run_export(config, workdir)
    elif mode == "eval":
        from explore_rl.modes.eval import run_eval

        print(json.dumps(run_eval(config, workdir), indent=2))
    elif mode == "sft":
        from explore_rl.train.sft import train_sft

        train_sft(config, workdir)
    else:
        from explore_rl.train.loop import train

        train(config, workdir)


def cli() -> None:
    """`python -m explore_rl.main ...`, and the `explore-rl` command (setup.py)."""
    flags.mark_flag_as_required("config")
    argv = config_lib.config_argv(sys.argv)
    try:
        config_lib.check_overrides(argv)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    app.run(main, argv=argv)


if __name__ == "__main__":
    cli()
