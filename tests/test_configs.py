"""Every config in configs/ with every argument loads from any directory, through the
library and through the command line, and config.json records the resolved config."""

import json
import os
import subprocess
import sys

import pytest

import configs
from configs import base, controls, eden
from explore_rl.exploration import base as exploration

SPECS = {
    "base.py": ["base.py"],
    "grpo.py": [f"grpo.py:{s}" for s in base.SCALES] + ["grpo.py"],
    "ead.py": [f"ead.py:{s}" for s in base.SCALES],
    "eden.py": [f"eden.py:{s}" for s in base.SCALES]
    + [f"eden.py:{a}" for a in eden.ABLATIONS]
    + [f"eden.py:{a},{s}" for a in eden.ABLATIONS for s in base.SCALES],
    "controls.py": [f"controls.py:{k}" for k in controls.CONTROLS]
    + [f"controls.py:{k},{s}" for k in controls.CONTROLS for s in base.SCALES],
}

LOAD_ALL = """
import json, sys
from explore_rl import config
for spec in json.loads(sys.argv[1]):
    c = json.loads(config.resolved(config.load(spec)).to_json())
    print(json.dumps({"spec": spec, "config": c}))
"""


def test_the_table_covers_every_config_file():
    folder = os.path.dirname(configs.__file__)
    names = {n for n in os.listdir(folder) if n.endswith(".py") and n != "__init__.py"}
    assert names == set(SPECS)


def _python_in(folder, *args):
    """`python ARGS` run in `folder` with the installed package alone (no PYTHONPATH), as
    a notebook or a launcher elsewhere would have it."""
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    env.pop("PYTHONPATH", None)
    return subprocess.run(
        [sys.executable, *args], cwd=folder, env=env, capture_output=True, text=True, timeout=300
    )


def test_every_config_and_argument_loads_from_another_directory(tmp_path):
    specs = [f"configs/{s}" for group in SPECS.values() for s in group]
    out = _python_in(tmp_path, "-c", LOAD_ALL, json.dumps(specs))
    assert out.returncode == 0, out.stderr[-3000:]
    rows = {r["spec"]: r["config"] for r in map(json.loads, out.stdout.splitlines())}
    assert list(rows) == specs
    # an ablation alone means the demo scale, and either order of the arguments is one config
    assert rows["configs/eden.py:no_anchor"] == rows["configs/eden.py:no_anchor,demo"]
    assert rows["configs/eden.py:no_anchor"]["exploration"]["eden"]["anchor"] == "none"
    assert rows["configs/controls.py:gspo"] == rows["configs/controls.py:gspo,demo"]
    # the resolved config holds each method's defaults: every field of its section
    for spec, c in rows.items():
        for name in c["exploration"]["methods"]:
            assert set(c["exploration"][name]) == set(exploration.get(name).defaults()), spec


@pytest.mark.slow
def test_the_command_line_finds_configs_from_another_directory(tmp_path):
    out = _python_in(
        tmp_path,
        "-m",
        "explore_rl.main",
        "--mode=sample",
        "--config",
        "configs/ead.py:smoke",
        "--workdir",
        str(tmp_path / "run"),
        "--config.sample.num_prompts=1",
        "--config.sample.max_new_tokens=4",
    )
    assert out.returncode == 0, out.stderr[-3000:]
    written = json.load(open(tmp_path / "run" / "config.json"))
    assert written["exploration"]["ead"]["convention"] == "paper"  # a default, recorded
    assert written["sample"]["max_new_tokens"] == 4
