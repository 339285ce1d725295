"""docs/adding_a_method.md as written: its module, config and test files, placed where the
page says in a copy of the project (the module in `explore_rl/exploration/`, the config in
`configs/`, the test in `tests/`), and the page's commands run there as typed. Nothing
else in the package changes: the page's promise that a method is one module, one config
and one test file."""

import os
import re
import shlex
import shutil
import subprocess

import pytest
from helpers import subprocess_env

from explore_rl.logs import read_metrics

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAGE = os.path.join(ROOT, "docs", "adding_a_method.md")

pytestmark = pytest.mark.slow  # one tiny training run


def _blocks() -> list[str]:
    with open(PAGE) as f:
        return re.findall(r"```python\n(.*?)```", f.read(), re.S)


def test_the_page_has_a_module_a_config_and_a_test():
    module, config, test = _blocks()
    assert '@register("group_temperature")' in module
    assert "def get_config(" in config
    assert [n for n in re.findall(r"^def (test_\w+)", test, re.M)] == [
        "test_each_group_is_drawn_at_a_temperature_of_its_own",
        "test_it_trains_and_logs_its_metrics",
    ]


def test_the_pages_commands_run_as_typed(tmp_path):
    """The page's commands, typed in a copy of the project with the page's three files
    where it puts them (the module inside the package): its test file under pytest, its
    config trained (the demo at smoke scale, as the documentation's commands run), and compared
    with a GRPO run. The package itself is not touched."""
    from helpers import page_blocks, smoke

    module, config, test = _blocks()
    skip = shutil.ignore_patterns("__pycache__")
    for name in ("explore_rl", "configs"):
        shutil.copytree(os.path.join(ROOT, name), tmp_path / name, ignore=skip)
    os.symlink(os.path.join(ROOT, "data"), tmp_path / "data")
    (tmp_path / "explore_rl" / "exploration" / "group_temperature.py").write_text(module)
    (tmp_path / "configs" / "group_temperature.py").write_text(config)
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_group_temperature.py").write_text(test)
    (block,) = page_blocks("", ["docs/adding_a_method.md"])
    grpo = "python -m explore_rl.main --config configs/grpo.py:demo --workdir runs/demo"
    env = subprocess_env(tests_importable=False)  # the copy, not the clone
    for line in [grpo, *block.splitlines()]:
        command = smoke(shlex.split(line, comments=True), hf_folder="")
        done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True)
        assert done.returncode == 0, f"{line}\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
    rows = read_metrics(str(tmp_path / "runs" / "gt"))
    assert rows and all(0.8 <= r["group_temperature/mean"] <= 1.4 for r in rows)
