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

import difflib
import json
import os
import sys
import tempfile
import threading
import traceback

from absl import app, flags, logging
from ml_collections import ConfigDict, config_flags

import configs
from explore_rl import caching, checkpoint, parallel, stages
from explore_rl import config as config_lib
from explore_rl.logs import flatten

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "Config file (configs/*.py[:arg]).", lock_config=True
)
_WORKDIR = flags.DEFINE_string("workdir", None, "Run directory (config, samples, ...).")
_MODE = flags.DEFINE_enum("mode", "train", config_lib.MODES, "What to run.")
_DEBUG = flags.DEFINE_bool(
    "debug", False, "A failure's whole traceback on the terminal (else: in a file it names)."
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
    """The mode, inside the error boundary: whatever fails while a mode sets up (the
    config, data, weights, checkpoints, the reward functions) or while eval, sample or
    export run is one line, `error: <what was being done>: <problem>`, exit status 2, its
    traceback, where a library raised it, in a file the line names (`--debug`: on the
    terminal). Once training has started (`stages.training`), a failure keeps the loop's
    own handling: the run checkpointed, then the error (one line where our own checks
    raised it: a full disk, diverged updates)."""
    del argv
    logging.set_verbosity(logging.WARNING)  # orbax and jax are chatty at INFO
    if not _DEBUG.value:
        checkpoint.quiet_orbax_errors()
    caching.enable_compilation_cache()
    try:
        with stages.doing("joining the run's processes"):
            parallel.initialize(
                _COORDINATOR.value, _NUM_PROCESSES.value, _PROCESS_ID.value, _DISTRIBUTED.value
            )
        _run(_MODE.value, _CONFIG.value, _WORKDIR.value)
    except Exception as e:  # noqa: BLE001 - the boundary: every failure of a set-up
        ours = isinstance(e, (ValueError, OSError, stages.Stopped)) and _raised_here(e)
        if _DEBUG.value or (stages.during_training(e) and not ours):
            raise
        # our checks' words say it all; a library's error may be a bug: its trace is kept
        hint = "--debug for the trace" if ours else f"its trace: {_keep_traceback(e)}"
        # Orbax's threads may report a failed write again: the line is said last
        _refuse(f"{_what_failed(e, ours)}  ({hint})", last=isinstance(e, checkpoint.SaveFailed))


def _refuse(words: str, last: bool = False):
    """The boundary's end, for the command line and every mode alike: `error: <words>` on
    stderr (`last`: as the final words, `_say_last`), exit status 2."""
    if last:
        _say_last(f"error: {words}")
    else:
        print(f"error: {words}", file=sys.stderr)
    sys.exit(2)


def _what_failed(e: BaseException, ours: bool) -> str:
    """One line: our own checks' words (they name the setting or file), or what was being
    done and the library's error (its type, its first line, the file it names)."""
    if ours:
        return str(e).strip()
    words = (str(e).strip().splitlines() or [""])[0]
    if isinstance(e, OSError) and e.filename and str(e.filename) not in words:
        words = f"{e.filename}: {words}"
    return f"{stages.of(e) or 'setting up'}: {type(e).__name__}: {words}".rstrip(": ")


def _keep_traceback(e: BaseException) -> str:
    """The traceback of `e` in a file of the temporary folder (a refused run directory is
    left as it was, a refused new one is not made), its path returned."""
    fd, path = tempfile.mkstemp(prefix="explore_rl-error-", suffix=".log")
    with os.fdopen(fd, "w") as f:
        f.write(f"{' '.join(sys.argv)}\n\n")
        traceback.print_exception(e, file=f)
    return path


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
    """The config as the mode's run spec (`config.spec`: the one translation), its model a
    folder (a run directory's checkpoint exported, a base model built), then the mode's
    module, imported when chosen (export and eval need no trainer)."""
    if mode in ("train", "sft") and not workdir:
        raise ValueError(f"--mode {mode} needs --workdir (checkpoints, metrics, resume)")
    from explore_rl.modes import export

    with stages.doing(f"reading the model of model.path={config.model.path}"):
        config = export.resolve(config)  # a run directory: its checkpoint as a model folder
    if mode != "sft":  # every other mode reads the model a `model.base` recipe makes
        from explore_rl.train import base_model

        with stages.doing(f"making the base model model.base={config.model.base}"):
            config = base_model.resolve(config)
    with stages.doing("checking the config"):
        spec = config_lib.spec(config, mode)
    with stages.doing(_DOING[mode] + (f" in {workdir}" if workdir else "")):
        if mode == "sample":
            from explore_rl.modes.sample import run_sample

            run_sample(spec, workdir)
        elif mode == "export":
            from explore_rl.modes.export import run_export

            run_export(spec, workdir)
        elif mode == "eval":
            from explore_rl.modes.eval import run_eval

            print(json.dumps(run_eval(spec, workdir), indent=2))
        elif mode == "sft":
            from explore_rl.train.sft import train_sft

            train_sft(spec, workdir)
        else:
            from explore_rl.train.loop import train

            train(spec, workdir)


# what each mode is doing, for a failure's line (its work directory follows)
_DOING = {"train": "starting the run", "sft": "starting the run", "eval": "evaluating",
          "sample": "sampling", "export": "exporting"}  # fmt: skip


def parse_flags(argv: list[str]) -> list[str]:
    """absl's flags, parsed once: the config file runs once, its overrides applied. A bad
    flag or config file is one line and exit status 2 (absl's own words, or for an
    override of the config a field it does not have, the nearest one)."""
    try:
        rest = flags.FLAGS(argv)
        if not isinstance(flags.FLAGS["config"].value, ConfigDict):
            config_lib.load(_named_config(argv))  # config_flags keeps a load's error for later
        return rest
    except Exception as e:  # noqa: BLE001 - absl's errors, and ml_collections' KeyError
        _refuse(_flag_error(argv, e))


_BOOLEANS = ("true", "t", "1", "false", "f", "0")  # what absl reads as a boolean


def _flag_error(argv: list[str], e: Exception) -> str:
    """What is wrong with the command line `argv`, in one line."""
    config = _config_file(argv)
    if isinstance(config, ConfigDict):  # check the overrides against the file's fields
        fields = flatten(config.to_dict())
        for i, a in enumerate(argv):
            if not a.startswith("--config.") or a == "--config.":
                continue
            key, has_value, value = a[len("--config.") :].partition("=")
            if key not in fields and not any(f.startswith(key + ".") for f in fields):
                near = difflib.get_close_matches(key, fields, n=1, cutoff=0.6)
                hint = f" (did you mean {near[0]}?)" if near else ""
                return f"--config.{key}: no such config field{hint}"
            value = value if has_value else (argv[i + 1] if i + 1 < len(argv) else "")
            if isinstance(fields.get(key), bool) and value.lower() not in _BOOLEANS:
                return f"--config.{key}={value}: not a boolean (True or False)"
    words = (str(e).strip().splitlines() or [type(e).__name__])[0]
    if config is None and any(a == "--config" or a.startswith("--config=") for a in argv):
        named = _named_config(argv)  # the file failed: name it, and the library's error type
        if os.path.basename(named.partition(":")[0]) not in words:
            words = f"--config {named}: {type(e).__name__}: {words}"
    return words


def _named_config(argv: list[str]) -> str:
    """The value of `--config` in `argv`."""
    return next(
        a.split("=", 1)[1] if "=" in a else argv[i + 1]
        for i, a in enumerate(argv)
        if (a == "--config" and i + 1 < len(argv)) or a.startswith("--config=")
    )


def _config_file(argv: list[str]) -> ConfigDict | None:
    """The `--config` file's config, as absl loaded it, or else (absl stopped at a bad
    override before it kept the file's config) loaded again here, on this error's path
    only; None where the file itself is what fails."""
    loaded = flags.FLAGS["config"].value
    if isinstance(loaded, ConfigDict):
        return loaded
    try:
        return config_lib.load(_named_config(argv))
    except Exception:  # noqa: BLE001 - no --config, or a broken file: said by the error itself
        return None


def cli() -> None:
    """`python -m explore_rl.main ...`, and the `explore-rl` command (setup.py)."""
    flags.mark_flag_as_required("config")
    try:
        app.run(main, argv=config_lib.config_argv(sys.argv), flags_parser=parse_flags)
    except SystemExit as e:
        if e.code == 2:  # refused: a library's worker thread left running must not keep
            _exit_now(2)  # the process alive (Orbax's are not daemons)
        raise


def _exit_now(code: int) -> None:
    """End the process with `code` even while threads that are not daemons still run."""
    sys.stdout.flush()
    sys.stderr.flush()
    if any(t is not threading.main_thread() and not t.daemon for t in threading.enumerate()):
        os._exit(code)
    sys.exit(code)


if __name__ == "__main__":
    cli()
