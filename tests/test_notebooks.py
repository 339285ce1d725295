"""Every notebook in notebooks/ runs top to bottom at its default (smoke) settings; a
failing cell fails the suite. Stored with outputs cleared."""

import os

import nbformat
import pytest
from nbclient import NotebookClient

FOLDER = os.path.join(os.path.dirname(__file__), "..", "notebooks")
NOTEBOOKS = sorted(n for n in os.listdir(FOLDER) if n.endswith(".ipynb"))


def test_there_are_notebooks_and_their_outputs_are_cleared():
    assert len(NOTEBOOKS) == 6
    for name in NOTEBOOKS:
        nb = nbformat.read(os.path.join(FOLDER, name), as_version=4)
        assert all(not c.get("outputs") for c in nb.cells if c.cell_type == "code"), name


@pytest.mark.slow
@pytest.mark.parametrize("name", NOTEBOOKS)
def test_the_notebook_executes(name, monkeypatch, tmp_path):
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")
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
