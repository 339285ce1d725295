"""launch/sweep.py: every config's sweep expands into named points, one work directory
each, whose flags name real config fields; a sweep runs through the CLI."""

import os
import subprocess
import sys

import pytest
from helpers import subprocess_env

import configs
from explore_rl import config as config_lib
from launch import sweep

CONFIGS = sorted(n for n in os.listdir(os.path.dirname(configs.__file__)) if n.endswith(".py"))
CONFIGS.remove("__init__.py")


def test_hyper_product_sweep_and_zip():
    h = sweep.hyper
    grid = h.product([h.sweep("config.seed", [0, 1]), h.sweep("config.optim.lr", [1e-6, 2e-6])])
    assert grid[1] == {"config.seed": 0, "config.optim.lr": 2e-6} and len(grid) == 4
    pairs = h.zip([h.sweep("config.seed", [0, 1]), h.sweep("config.optim.lr", [1, 2])])
    assert pairs == [
        {"config.seed": 0, "config.optim.lr": 1},
        {"config.seed": 1, "config.optim.lr": 2},
    ]
    with pytest.raises(ValueError, match="lengths"):
        h.zip([h.sweep("config.seed", [0, 1]), h.sweep("config.optim.lr", [1])])
    with pytest.raises(ValueError, match="'config.<path>'"):
        h.sweep("seed", [0])
    short = sweep._short_names(["config.optim.lr", "config.rl.lr", "config.seed"])
    assert short == {"config.optim.lr": "optim.lr", "config.rl.lr": "rl.lr", "config.seed": "seed"}


@pytest.mark.parametrize("name", CONFIGS)
def test_every_sweep_names_distinct_runs_of_real_fields(name):
    spec = f"configs/{name}" + (":gspo" if name == "controls.py" else "")  # needs a control
    runs = sweep.commands(spec, "root", ["--config.train.steps=2"])
    dirs = [argv[argv.index("--workdir") + 1] for _, argv in runs]
    assert len(set(dirs)) == len(dirs) >= 1
    base = config_lib.load(spec)
    for point in sweep.points(spec):
        for key, value in point.items():  # a field of the config, of the value's type
            section = base
            *path, field = key.split(".")[1:]
            for part in path:
                section = section[part]
            assert field in section, key
            section[field] = value


def test_dry_run_prints_one_command_per_point(capsys):
    sweep.main(["configs/ead.py:demo", "--workdir", "w", "--dry-run"])
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == len(sweep.points("configs/ead.py")) == 4
    assert "--workdir w/seed=0,convention=paper --config.seed=0" in lines[0]
    assert lines[0].endswith("--config.exploration.ead.convention=paper")


@pytest.mark.slow
@pytest.mark.parametrize("name", CONFIGS)
def test_the_slurm_script_has_one_multi_node_run_per_point(name, tmp_path, capsys):
    spec = f"configs/{name}" + (":gspo" if name == "controls.py" else "")
    script = tmp_path / "runs.sbatch"
    root = tmp_path / "w"
    sweep.main([spec, "--workdir", str(root), "--slurm", str(script), "--nodes", "2",
                "--gpus-per-node", "4", "--time", "04:00:00", "--partition", "gpu",
                "--account", "lab", "--cpus-per-task", "16"])  # fmt: skip
    text = script.read_text()
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    for line in ("--time=04:00:00", "--partition=gpu", "--account=lab", "--cpus-per-task=16"):
        assert f"#SBATCH {line}" in text
    # a fake sbatch that, as SLURM would, finds the log folder or loses the job's output
    fake = tmp_path / "bin" / "sbatch"
    fake.parent.mkdir()
    fake.write_text('#!/bin/bash\nout=$(sed -n "s/^#SBATCH --output=//p" "$1")\n'
                    'test -d "$(dirname "$out")"\n')  # fmt: skip
    fake.chmod(0o755)
    env = dict(os.environ, PATH=f"{fake.parent}{os.pathsep}{os.environ['PATH']}")
    assert subprocess.run(["sbatch", str(script)], env=env).returncode == 0
    n = len(sweep.points(spec))
    assert f"#SBATCH --array=0-{n - 1}" in text and "#SBATCH --nodes=2" in text
    assert "--gpus-per-node=4" in text and 'srun bash -c "${runs[$SLURM_ARRAY_TASK_ID]}"' in text
    # the array holds one quoted command a point, each with its own work directory
    listed = subprocess.run(
        ["bash", "-c", text.rsplit("srun", 1)[0] + 'printf "%s\\n" "${runs[@]}"'],
        capture_output=True, text=True, check=True,
    ).stdout.splitlines()  # fmt: skip
    assert len(listed) == n and len({c.split("--workdir ")[1].split()[0] for c in listed}) == n
    # the interpreter of the environment that wrote the script, not whichever `python`
    assert all(c.startswith(f"{sys.executable} -m explore_rl.main --config {spec}") for c in listed)
    sweep.main([spec, "--workdir", "w", "--tpu", "v4-32", "--zone", "us-central2-b"])
    tpu = capsys.readouterr().out.splitlines()[1:]  # after the --slurm line
    assert len(tpu) == n and all("--worker=all" in c and "--distributed" in c for c in tpu)


@pytest.mark.slow
def test_a_sweep_runs_each_point_through_the_cli(tmp_path):
    out = subprocess.run(
        [sys.executable, "launch/sweep.py", "configs/grpo.py:smoke", "--workdir", str(tmp_path)]
        + ["--parallel", "2", "--", "--config.train.steps=1", "--config.train.eval_every=0"],
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert sorted(os.listdir(tmp_path)) == ["seed=0", "seed=1"]
    assert all(os.path.exists(tmp_path / d / "metrics.jsonl") for d in ("seed=0", "seed=1"))


def test_slurm_checks_every_point_and_submits_one_run_with_absolute_paths(tmp_path, monkeypatch):
    """`--slurm` refuses, naming the point and writing nothing, a sweep whose runs would
    stop at start (a paper config's model folder missing here); `--run NAME` submits one
    point, `--single` the config as given; the script's work directories are absolute and
    it runs where the paths were checked."""
    script, root = tmp_path / "one.sbatch", "rel/w"
    monkeypatch.chdir(tmp_path)
    (tmp_path / "configs").symlink_to(os.path.dirname(configs.__file__))
    with pytest.raises(SystemExit, match=r"^seed=0,rho=0.12: config: model.path=models/Qwen2.5"
                       r"-Math-1.5B: no such file or folder \(nothing written"):  # fmt: skip
        sweep.main(["configs/eden.py:paper", "--workdir", root, "--slurm", str(script)])
    assert not script.exists() and not (tmp_path / "rel").exists()
    sweep.main(["configs/eden.py:demo", "--workdir", root, "--slurm", str(script),
                "--run", "seed=1,rho=0.18"])  # fmt: skip
    text = script.read_text()
    assert "#SBATCH --array=0-0" in text and f"#SBATCH --chdir={tmp_path}" in text
    (command,) = [line for line in text.splitlines() if "-m explore_rl.main" in line]
    assert f"--workdir {tmp_path}/rel/w/seed=1,rho=0.18 " in command
    with pytest.raises(ValueError, match="no run named 'seed=9'"):
        sweep.main(["configs/eden.py:demo", "--slurm", str(script), "--run", "seed=9"])
    sweep.main(["configs/eden.py:demo", "--workdir", root, "--slurm", str(script), "--single"])
    (command,) = [line for line in script.read_text().splitlines() if "-m explore_rl.main" in line]
    assert (
        f"--workdir {tmp_path}/rel/w/default'  # default" in command
        and "--config.seed" not in command
    )
    with pytest.raises(
        SystemExit, match=r"^default: config: rl.minibatches=4 must divide rollout.prompts=3"
    ):
        sweep.main(["configs/eden.py:demo", "--slurm", str(script), "--single", "--",
                    "--config.rollout.prompts=3"])  # fmt: skip
