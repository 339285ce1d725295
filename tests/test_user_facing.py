"""What users get must not point at the developers' `../shared` folder: they do not have
it. The benchmark files the presets name travel with the project in `data/`."""

import os
import re

import pytest

from explore_rl.data import tasks

ROOT = os.path.join(os.path.dirname(__file__), "..")
USER_FACING = (
    "README.md",
    "explore_rl",
    "configs",
    "data",
    "docs",
    "launch",
    "notebooks",
    "Makefile",
)
SHARED = re.compile(r"\.\./shared|(?<![\w-])shared/(data|peers|seeds|METHODS|DESIGN)")


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


@pytest.mark.parametrize("name", sorted(tasks.JSONL_PRESETS))
def test_the_benchmarks_the_presets_name_are_in_the_project(name):
    assert os.path.isfile(os.path.join(ROOT, "data", name, "test.jsonl"))
