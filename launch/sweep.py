"""Expand a config's `get_sweep(hyper)` into named runs, and run them here.

    python launch/sweep.py configs/ase.py:demo --dry-run        # the exact commands
    python launch/sweep.py configs/ase.py:demo --parallel 2     # run them, 2 at a time
    python launch/sweep.py configs/eden.py:paper --workdir runs/eden-sweep -- \\
        --config.model.path=/models/Qwen2.5-Math-1.5B          # flags for every point
    python launch/sweep.py configs/eden.py:paper --slurm eden.sbatch --nodes 2 \\
        --gpus-per-node 4 --time 24:00:00 --partition gpu   # a SLURM job array
    python launch/sweep.py configs/ead.py:paper --tpu my-v4-32 --zone us-central2-b

A config's sweep is built with the `hyper` helper it receives (the big_vision and
ml_collections habit): `hyper.sweep("config.seed", [0, 1])` is a list of points,
`hyper.product([...])` their cartesian product, `hyper.zip([...])` their pairwise merge.
Each point becomes `python -m explore_rl.main --config CONFIG --workdir ROOT/NAME
--config.<key>=<value> ...`, its NAME made of the swept fields' last components and values
("seed=0,alpha=0.25"; a longer suffix of the key where two last components clash), so
every point has its own work directory, and rerunning a sweep resumes each run.

On a cluster every point is one multi-host run: `--slurm FILE` writes a job-array script
(`sbatch FILE`): each array task takes `--nodes` nodes, one process a node (`srun`), whose
processes join through JAX's SLURM detection; it runs this environment's Python, passes
`--time`, `--partition`, `--account` and `--cpus-per-task` through, and its log folder
(ROOT) is created as the script is written (SLURM does not create it). `--tpu NAME`
prints one command a point that runs it on every worker of a TPU VM (`--distributed`: JAX
reads the pod's topology).
"""

from __future__ import annotations

import argparse
import itertools
import os
import shlex
import subprocess
import sys

from explore_rl import config as config_lib


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


def commands(spec: str, workdir: str, extra: list[str]) -> list[tuple[str, list[str]]]:
    """(run name, argv) per point of the sweep of `spec`."""
    sweep = points(spec)
    short = _short_names(sorted({k for p in sweep for k in p}))
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
    parser.add_argument("--tpu", help="print the commands for this TPU VM's workers (no run)")
    parser.add_argument("--zone", default="", help="--tpu: its zone")
    argv = sys.argv[1:] if argv is None else list(argv)
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []  # flags for every run
    args = parser.parse_args(argv[: argv.index("--")] if "--" in argv else argv)
    stem = os.path.splitext(os.path.basename(args.config.partition(":")[0]))[0]
    root = args.workdir or os.path.join("runs", "sweeps", stem)
    runs = commands(args.config, root, extra)
    if args.slurm:
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
