"""docs/adding_a_method.md as written: its module, config and test files, placed where the
page says (the module as `explore_rl.exploration.group_temperature`, the config as
`configs/group_temperature.py` of the working directory), and its tests run. Nothing in
the package changes: the page's promise that a method is one module, one config and one
test file."""

import importlib.util
import inspect
import os
import re
import sys

import pytest

from explore_rl.exploration import base

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAGE = os.path.join(ROOT, "docs", "adding_a_method.md")

pytestmark = pytest.mark.slow  # one tiny training run


def _blocks() -> list[str]:
    with open(PAGE) as f:
        return re.findall(r"```python\n(.*?)```", f.read(), re.S)


def _module(name: str, path: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def test_the_page_has_a_module_a_config_and_a_test():
    module, config, test = _blocks()
    assert '@register("group_temperature")' in module
    assert "def get_config(" in config
    assert [n for n in re.findall(r"^def (test_\w+)", test, re.M)] == [
        "test_each_group_is_drawn_at_a_temperature_of_its_own",
        "test_it_trains_and_logs_its_metrics",
    ]


def test_the_pages_method_runs_its_own_tests(tmp_path, monkeypatch):
    module, config, test = _blocks()
    monkeypatch.chdir(tmp_path)
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "group_temperature.py").write_text(config)
    (tmp_path / "group_temperature.py").write_text(module)
    (tmp_path / "test_group_temperature.py").write_text(test)
    name = "explore_rl.exploration.group_temperature"
    monkeypatch.delitem(sys.modules, name, raising=False)  # restored afterwards
    monkeypatch.delitem(base.REGISTRY, "group_temperature", raising=False)
    try:
        _module(name, str(tmp_path / "group_temperature.py"))
        assert "group_temperature" in base.REGISTRY
        tests = _module("test_group_temperature", str(tmp_path / "test_group_temperature.py"))
        for fn_name, fn in inspect.getmembers(tests, inspect.isfunction):
            if fn_name.startswith("test_"):
                kwargs = {"tmp_path": tmp_path / fn_name} if "tmp_path" in inspect.signature(
                    fn
                ).parameters else {}  # fmt: skip
                fn(**kwargs)
    finally:
        base.REGISTRY.pop("group_temperature", None)  # the package's four methods only
        sys.modules.pop("test_group_temperature", None)
