"""The wheel: built from the clone, installed into a fresh environment, it runs outside the
source tree (its configs, data files and console script included) and knows its version."""

import glob
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import venv

import pytest

import explore_rl

pytestmark = pytest.mark.slow

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _fresh_env(folder: str, wheel: str) -> str:
    """A new virtual environment holding the wheel; its dependencies are this
    environment's (a path file naming its site-packages: nothing is downloaded), and only
    plain paths are read from there (the clone's editable install is not)."""
    venv.create(folder, with_pip=False)
    python = os.path.join(folder, "bin", "python")
    site = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    ours = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    with open(os.path.join(site, "dependencies.pth"), "w") as f:
        f.write("\n".join(sorted(ours)) + "\n")
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", python, "install", "-q", "--no-deps",
         "--no-index", wheel],
        check=True,
    )  # fmt: skip
    return python


def test_the_wheel_runs_the_smoke_config_outside_the_clone(tmp_path):
    # built from a copy: setuptools leaves build/ behind, and a stale one would go into the
    # next wheel
    source, wheels = str(tmp_path / "source"), str(tmp_path / "wheels")
    skip = (".*", "runs", "build", "dist", "*.egg-info", "__pycache__", "notebooks")
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(*skip))
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
         "-w", wheels, source],
        check=True,
    )  # fmt: skip
    (wheel,) = glob.glob(os.path.join(wheels, "explore_rl-*.whl"))
    assert os.path.basename(wheel).startswith(f"explore_rl-{explore_rl.__version__}-")
    python = _fresh_env(str(tmp_path / "env"), wheel)
    elsewhere = tmp_path / "elsewhere"  # no configs/ or data/ here
    elsewhere.mkdir()
    where = subprocess.run(
        [python, "-c", "import explore_rl, configs; from explore_rl.data import jsonl, lab; "
         "print(explore_rl.__version__, explore_rl.__file__, configs.__file__, "
         "*jsonl.preset_paths('gsm8k'), lab.FOLDER, sep='\\n')"],
        cwd=elsewhere, capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    installed = str(tmp_path / "env")
    assert where[0] == explore_rl.__version__
    assert all(p.startswith(installed) for p in where[1:]), where  # none from the clone
    assert os.path.getsize(where[3]) > 1_000_000 and os.path.isfile(where[4])  # GSM8K
    assert os.path.isfile(os.path.join(where[5], "tokenizer.json"))  # the lab's tokenizer
    run = subprocess.run(
        [os.path.join(installed, "bin", "explore-rl"), "--config", "configs/grpo.py:smoke",
         "--workdir", "run", "--config.train.steps=1", "--config.train.eval_every=0"],
        cwd=elsewhere, capture_output=True, text=True,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    assert (elsewhere / "run" / "metrics.jsonl").read_text().count("\n") == 1
    assert "run: run (new)" in run.stderr


def test_the_install_commands_name_extras_the_package_has():
    """getting_started.md's `pip install -e '.[x]'` lines (not run: they download) name
    extras setup.py defines."""
    from helpers import page_blocks

    setup = open(os.path.join(ROOT, "setup.py")).read()
    block = setup[setup.index("extras_require={") :]
    extras = set(re.findall(r'^        "(\w+)": \[', block, re.M))
    named = re.findall(r"\.\[(\w+)\]", "".join(page_blocks("text", ["docs/getting_started.md"])))
    assert {"cuda12", "tpu", "dev"} <= set(named) <= extras
