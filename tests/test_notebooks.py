"""Every notebook in notebooks/ runs top to bottom at its default (smoke) settings; a
failing cell fails the suite. Stored with outputs cleared."""

import os
import re

import nbformat
import pytest
from helpers import subprocess_env
from nbclient import NotebookClient

FOLDER = os.path.join(os.path.dirname(__file__), "..", "notebooks")
NOTEBOOKS = sorted(n for n in os.listdir(FOLDER) if n.endswith(".ipynb"))


def test_there_are_notebooks_and_their_outputs_are_cleared():
    assert len(NOTEBOOKS) == 6
    for name in NOTEBOOKS:
        nb = nbformat.read(os.path.join(FOLDER, name), as_version=4)
        assert all(not c.get("outputs") for c in nb.cells if c.cell_type == "code"), name


def _runs_the_135m(name: str) -> bool:
    """The notebook loads a `demo` config's model, the embedded SmolLM2-135M."""
    nb = nbformat.read(os.path.join(FOLDER, name), as_version=4)
    return any(re.search(r'configs/\w+\.py:demo"', c.source) for c in nb.cells)


@pytest.mark.slow
@pytest.mark.parametrize(
    "name",
    [pytest.param(n, marks=pytest.mark.optimized) if _runs_the_135m(n) else n for n in NOTEBOOKS],
)
def test_the_notebook_executes(name, request, monkeypatch, tmp_path):
    optimized = request.node.get_closest_marker("optimized") is not None
    for var, value in subprocess_env(optimized=optimized).items():  # the kernel's
        monkeypatch.setenv(var, value)
    monkeypatch.setenv("TMPDIR", str(tmp_path))  # the notebook's runs: here, not in /tmp
    nb = nbformat.read(os.path.join(FOLDER, name), as_version=4)
    client = NotebookClient(
        nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": FOLDER}}
    )
    client.execute()  # raises CellExecutionError naming the cell that failed
    shown = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
             if "image/png" in o.get("data", {})]  # fmt: skip
    if name == "01_quick_start.ipynb":  # its curves, inline (analysis draws without pyplot)
        assert len(shown) == 2, [
            list(o.get("data", {})) for c in nb.cells for o in c.get("outputs", [])
        ]
