"""Expand a config's `get_sweep(hyper)` into named runs, and run them here.

    python launch/sweep.py configs/ase.py:demo --dry-run        # the exact commands
    python launch/sweep.py configs/ase.py:demo --parallel 2     # run them, 2 at a time
    python launch/sweep.py configs/eden.py:paper --workdir runs/eden-sweep -- \\
        --config.model.path=/models/Qwen2.5-Math-1.5B          # flags for every point
    python launch/sweep.py configs/eden.py:paper --slurm eden.sbatch --nodes 2 \\
        --gpus-per-node 4 --time 24:00:00 --partition gpu -- \\
        --config.model.path=/models/Qwen2.5-Math-1.5B --config.task.train_path=train.jsonl
    python launch/sweep.py configs/eden.py:demo --run seed=0,rho=0.12 --slurm one.sbatch
    python launch/sweep.py configs/ead.py:paper --tpu my-v4-32 --zone us-central2-b

A config's sweep is built with the `hyper` helper it receives (the big_vision and
ml_collections habit): `hyper.sweep("config.seed", [0, 1])` is a list of points,
`hyper.product([...])` their cartesian product, `hyper.zip([...])` their pairwise merge.
Each point becomes `python -m explore_rl.main --config CONFIG --workdir ROOT/NAME
--config.<key>=<value> ...`, its NAME made of the swept fields' last components and values
("seed=0,alpha=0.25"; a longer suffix of the key where two last components clash), so
every point has its own work directory, and rerunning a sweep resumes each run.

`--run NAME` (repeatable) keeps the named points only, `--single` the config as given (one
run, "default").

On a cluster every point is one multi-host run: `--slurm FILE` writes a job-array script
(`sbatch FILE`): each array task takes `--nodes` nodes, one process a node (`srun`), whose
processes join through JAX's SLURM detection; it runs this environment's Python, passes
`--time`, `--partition`, `--account` and `--cpus-per-task` through, runs in the folder the
script was written from (`--chdir`, so the configs' relative paths name what was checked)
with absolute work directories, and its log folder (ROOT) is created as the script is
written (SLURM does not create it). Every point's config is checked first (`check`: its
values, and that the files it names exist): a point that would stop at its start is
refused here, named, rather than queued. `--tpu NAME`
prints one command a point that runs it on every worker of a TPU VM (`--distributed`: JAX
reads the pod's topology).
"""

from __future__ import annotations

import argparse
import ast
import itertools
import os
import shlex
import subprocess
import sys

from explore_rl import config as config_lib
from explore_rl.models import weights


class Hyper:
    """The helper `get_sweep` receives; a point is a dict {"config.key": value}."""

    @staticmethod
    def sweep(key: str, values) -> list[dict]:
        if not key.startswith("config."):
            raise ValueError(f"sweep key {key!r}: name a config field as 'config.<path>'")
        return [{key: v} for v in values]

    @staticmethod
    def product(parts: list[list[dict]]) -> list[dict]:
        return [{k: v for p in combo for k, v in p.items()} for combo in itertools.product(*parts)]

    @staticmethod
    def zip(parts: list[list[dict]]) -> list[dict]:
        if len({len(p) for p in parts}) > 1:
            raise ValueError(f"hyper.zip of lists of lengths {[len(p) for p in parts]}")
        return [{k: v for p in combo for k, v in p.items()} for combo in zip(*parts)]


hyper = Hyper()


def points(spec: str) -> list[dict]:
    """The sweep of config `file.py[:arg]`: one dict per run ([] when it has none)."""
    module = config_lib.load_module(spec.partition(":")[0])
    if not hasattr(module, "get_sweep"):
        raise ValueError(f"{spec}: the config defines no get_sweep(hyper)")
    return module.get_sweep(hyper)


def _short_names(keys: list[str]) -> dict[str, str]:
    """Each key's shortest dotted suffix that no other key of the sweep shares."""
    out = {}
    for key in keys:
        parts = key.split(".")[1:]
        for n in range(1, len(parts) + 1):
            name = ".".join(parts[-n:])
            if all(not o.endswith("." + name) for o in keys if o != key):
                break
        out[key] = name
    return out


def _value(v) -> str:
    return repr(v) if isinstance(v, (tuple, list)) else str(v)


def name(point: dict, short: dict[str, str]) -> str:
    """A point's run name ("default" for the one point of an empty sweep)."""
    parts = [f"{short[k]}={_value(v)}".replace("/", "_") for k, v in point.items()]
    return ",".join(parts) or "default"


def commands(
    spec: str, workdir: str, extra: list[str], only: list[str] = (), single: bool = False
) -> list[tuple[str, list[str]]]:
    """(run name, argv) per point of the sweep of `spec`: the points named `only` where
    given (each must be one), or the config as given alone (`single`)."""
    sweep = [{}] if single else points(spec)
    short = _short_names(sorted({k for p in sweep for k in p}))
    if only:
        named = {name(p, short): p for p in sweep}
        unknown = [r for r in only if r not in named]
        if unknown:
            raise ValueError(f"{spec}: no run named {unknown[0]!r} (runs: {sorted(named)})")
        sweep = [named[r] for r in only]
    out = []
    for point in sweep:
        run = name(point, short)
        argv = [sys.executable, "-m", "explore_rl.main", "--config", spec]
        argv += ["--workdir", os.path.join(workdir, run)]
        argv += [f"--{k}={_value(v)}" for k, v in point.items()] + list(extra)
        out.append((run, argv))
    if len({r for r, _ in out}) != len(out):
        raise ValueError(f"{spec}: two points of the sweep have the same name")
    return out


def check(spec: str, argv: list[str]) -> None:
    """The run `argv` (of `commands`) would start: its config, with the point's and the
    command line's overrides, passes the run's checks (`config.spec`: values, and the files
    it names, relative to here). A base model that its first run builds (`model.base`) is
    not checked. A ValueError naming what would stop it."""
    c = config_lib.load(spec)
    for a in argv:
        if a.startswith("--config."):
            key, _, text = a[len("--config.") :].partition("=")
            *sections, field = key.split(".")
            parent = c
            for part in sections:
                parent = parent[part]
            old = parent[field]
            if isinstance(old, bool):
                parent[field] = text.lower() in ("true", "t", "1")
            elif isinstance(old, str):
                parent[field] = text
            else:
                try:
                    parent[field] = ast.literal_eval(text)
                except (ValueError, SyntaxError):  # a word for a field of several types
                    parent[field] = text
    if c.model.base:
        c.model.base, c.model.path = "", weights.EMBEDDED
    config_lib.spec(c)


SBATCH_OPTIONS = ("time", "partition", "account", "cpus-per-task")  # passed through


def slurm_script(
    runs: list[tuple[str, list[str]]], root: str, nodes: int, gpus: int, options: dict
) -> str:
    """A SLURM job array with one task per point, each `nodes` nodes x one process, run by
    this Python (the environment that wrote the script; a cluster shares its filesystem),
    with the `options` given ({"time": "04:00:00", ...})."""
    lines = [
        "#!/bin/bash",
        f"#SBATCH --job-name={os.path.basename(root)}",
        f"#SBATCH --array=0-{len(runs) - 1}",
        f"#SBATCH --nodes={nodes}",
        "#SBATCH --ntasks-per-node=1",
        *([f"#SBATCH --gpus-per-node={gpus}"] if gpus else []),
        *(f"#SBATCH --{k}={v}" for k, v in options.items() if v),
        f"#SBATCH --chdir={os.getcwd()}",  # where the configs' relative paths were checked
        # SLURM does not create the log's folder: `main` does, as it writes the script
        f"#SBATCH --output={os.path.join(os.path.abspath(root), 'slurm-%A_%a.out')}",
        "set -euo pipefail",
        "# one point per array task; srun starts a process on each node, and",
        "# explore_rl.main joins them (jax.distributed reads SLURM's variables)",
        "runs=(",
        *[f"  {shlex.quote(shlex.join(argv))}  # {name}" for name, argv in runs],
        ")",
        'srun bash -c "${runs[$SLURM_ARRAY_TASK_ID]}"',
    ]
    return "\n".join(lines) + "\n"


def tpu_commands(runs: list[tuple[str, list[str]]], tpu: str, zone: str) -> list[str]:
    """One command a point: the run on every worker of TPU VM `tpu` (in this checkout's
    folder there), the workers joined by `--distributed`."""
    where = ["--zone", zone] if zone else []
    return [
        shlex.join(
            [
                "gcloud",
                "compute",
                "tpus",
                "tpu-vm",
                "ssh",
                tpu,
                *where,
                "--worker=all",
                "--command",
                f"cd {shlex.quote(os.getcwd())} && "
                + shlex.join(["python", *argv[1:], "--distributed"]),
            ]
        )  # fmt: skip
        for _, argv in runs
    ]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("config", help="configs/<file>.py[:arg]")
    parser.add_argument("--workdir", help="root of the runs' folders (runs/sweeps/<file>)")
    parser.add_argument("--dry-run", action="store_true", help="print the commands only")
    parser.add_argument("--parallel", type=int, default=1, help="runs at a time")
    parser.add_argument("--slurm", help="write a SLURM job-array script here (no run)")
    parser.add_argument("--nodes", type=int, default=1, help="--slurm: nodes per run")
    parser.add_argument("--gpus-per-node", type=int, default=0, help="--slurm: GPUs a node")
    for option in SBATCH_OPTIONS:
        parser.add_argument(f"--{option}", default="", help=f"--slurm: sbatch's --{option}")
    parser.add_argument("--run", action="append", default=[], help="only this point (by name)")
    parser.add_argument("--single", action="store_true", help="the config as given: one run")
    parser.add_argument("--tpu", help="print the commands for this TPU VM's workers (no run)")
    parser.add_argument("--zone", default="", help="--tpu: its zone")
    argv = sys.argv[1:] if argv is None else list(argv)
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []  # flags for every run
    args = parser.parse_args(argv[: argv.index("--")] if "--" in argv else argv)
    stem = os.path.splitext(os.path.basename(args.config.partition(":")[0]))[0]
    root = args.workdir or os.path.join("runs", "sweeps", stem)
    if args.slurm:  # a job's work directory wherever SLURM starts it
        root = os.path.abspath(root)
    runs = commands(args.config, root, extra, args.run, args.single)
    if args.slurm:
        for run, argv in runs:
            try:
                check(args.config, argv)
            except (ValueError, TypeError, KeyError, AttributeError) as e:  # a bad override too
                raise SystemExit(f"{run}: {e} (nothing written; fix it, then submit)") from None
        options = {o: getattr(args, o.replace("-", "_")) for o in SBATCH_OPTIONS}
        os.makedirs(root, exist_ok=True)  # the jobs' log folder
        with open(args.slurm, "w") as f:
            f.write(slurm_script(runs, root, args.nodes, args.gpus_per_node, options))
        print(
            f"{args.slurm}: {len(runs)} runs of {args.nodes} node(s), logs in {root}/; "
            f"submit with sbatch {args.slurm}"
        )
        return
    if args.tpu:
        print("\n".join(tpu_commands(runs, args.tpu, args.zone)))
        return
    if args.dry_run:
        for _, argv in runs:
            print(shlex.join(argv))
        return
    failed = []
    for start in range(0, len(runs), args.parallel):
        batch = [(r, subprocess.Popen(a)) for r, a in runs[start : start + args.parallel]]
        failed += [r for r, p in batch if p.wait() != 0]
    if failed:
        raise SystemExit(f"runs that failed: {failed}")


if __name__ == "__main__":
    main()
