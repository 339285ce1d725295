"""What users get must not point at the developers' `../shared` folder: they do not have
it. The benchmark files the presets name travel with the project in `data/`."""

import os
import re

import pytest

from explore_rl.data import jsonl

ROOT = os.path.join(os.path.dirname(__file__), "..")
USER_FACING = (
    "README.md",
    "CHANGELOG.md",
    "explore_rl",
    "configs",
    "data",
    "docs",
    "launch",
    "notebooks",
    "Makefile",
)
# the shared folder, or its documents by name (they are not in the project)
SHARED = re.compile(r"\.\./shared|(?<![\w-])shared/(data|peers|seeds)|\b(METHODS|DESIGN)\.md\b")


def _files():
    for entry in USER_FACING:
        path = os.path.join(ROOT, entry)
        if os.path.isfile(path):
            yield path
        for folder, _, names in os.walk(path):
            for name in names:
                if name.endswith((".py", ".md", ".txt", ".ipynb", ".sh", ".json")):
                    yield os.path.join(folder, name)


def test_no_user_facing_file_names_the_shared_folder():
    offenders = []
    for path in _files():
        with open(path, errors="replace") as f:
            for i, line in enumerate(f, 1):
                if SHARED.search(line):
                    offenders.append(f"{os.path.relpath(path, ROOT)}:{i}: {line.strip()}")
    assert not offenders, "\n".join(offenders)


@pytest.mark.parametrize("name", sorted(jsonl.JSONL_PRESETS))
def test_the_benchmarks_the_presets_name_are_in_the_project(name):
    assert os.path.isfile(os.path.join(ROOT, "data", name, "test.jsonl"))


# install_requires name -> the module the code imports
IMPORT_NAME = {
    "orbax-checkpoint": "orbax",
    "ml-dtypes": "ml_dtypes",
    "scikit-learn": "sklearn",
    "ml-collections": "ml_collections",
    "absl-py": "absl",
    "math-verify": "math_verify",
}
DEV_ONLY = {"torch", "transformers"}  # bench's peer comparison (bench/sample.py) (the dev extra)
OPTIONAL = {"wandb"}  # imported only when asked for; an extra of its own


def test_the_runtime_dependencies_are_exactly_what_the_runtime_imports():
    import ast
    import re
    import sys

    setup = open(os.path.join(ROOT, "setup.py")).read()
    block = setup[
        setup.index("install_requires=[") : setup.index("],", setup.index("install_requires"))
    ]
    declared = {
        IMPORT_NAME.get(n, n) for n in re.findall(r'"([A-Za-z0-9_.-]+?)(?:[<>=].*?)?"', block)
    }
    imported = set()
    for entry in ("explore_rl", "configs", "launch"):
        for folder, _, names in os.walk(os.path.join(ROOT, entry)):
            for name in names:
                if name.endswith(".py"):
                    tree = ast.parse(open(os.path.join(folder, name)).read())
                    for node in ast.walk(tree):
                        if isinstance(node, ast.Import):
                            imported |= {a.name.split(".")[0] for a in node.names}
                        elif isinstance(node, ast.ImportFrom) and node.level == 0:
                            imported.add(node.module.split(".")[0])
    first_party = {"explore_rl", "configs", "launch", "__future__"}
    third_party = imported - set(sys.stdlib_module_names) - first_party - DEV_ONLY - OPTIONAL
    assert third_party == declared
    assert all(f'"{name}": ["{name}"]' in setup for name in OPTIONAL)
