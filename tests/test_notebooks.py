"""Every notebook under ``notebooks/`` runs top to bottom on a CPU without an error.

Each notebook is executed from an in-memory copy with nbclient, in the ``notebooks/`` folder (so
``nbhelpers`` imports and the repo root is found as it is for a reader), and nothing is written back: the
committed notebooks keep their outputs, and ``NANOSERVE_NOTEBOOK_TEST=1`` tells ``nbhelpers.save_figure``
not to overwrite the PNGs in ``docs/images/``. New notebooks are picked up by the glob.

The kernel is the interpreter running pytest (``ipykernel`` from the dev extras): the test writes a
``python3`` kernel spec naming ``sys.executable`` into a temp dir and puts it first on ``JUPYTER_PATH``, so
neither a user-level kernel spec nor ``ipykernel install`` matters.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")
pytest.importorskip("matplotlib")

NOTEBOOKS_DIR = Path(__file__).resolve().parents[1] / "notebooks"
NOTEBOOKS = sorted(NOTEBOOKS_DIR.glob("*.ipynb"))
CELL_TIMEOUT_S = 300


def test_there_are_notebooks():
    assert NOTEBOOKS, f"no notebooks found in {NOTEBOOKS_DIR}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs(path: Path, monkeypatch, tmp_path):
    spec_dir = tmp_path / "jupyter" / "kernels" / "python3"
    spec_dir.mkdir(parents=True)
    (spec_dir / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "Python 3 (nanoserve test)",
        "language": "python",
    }))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    monkeypatch.setenv("NANOSERVE_NOTEBOOK_TEST", "1")   # nbhelpers.save_figure writes nothing
    # One intra-op thread: a little slower than two on an idle 2-core machine, but steady. On a busy one,
    # OpenMP threads spinning against another process can slow every step by an order of magnitude.
    monkeypatch.setenv("OMP_NUM_THREADS", "1")

    before = path.read_bytes()
    images = {p: p.stat().st_mtime_ns for p in (NOTEBOOKS_DIR.parent / "docs" / "images").glob("*.png")}
    notebook = nbformat.reads(before.decode("utf-8"), as_version=4)
    client = nbclient.NotebookClient(
        notebook,
        timeout=CELL_TIMEOUT_S,
        kernel_name="python3",
        resources={"metadata": {"path": str(NOTEBOOKS_DIR)}},
    )
    client.execute()   # raises CellExecutionError, naming the cell, on the first error

    errors = [o for cell in notebook.cells if cell.cell_type == "code"
              for o in cell.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors
    assert path.read_bytes() == before, "the test must not modify the committed notebook"
    after = {p: p.stat().st_mtime_ns for p in (NOTEBOOKS_DIR.parent / "docs" / "images").glob("*.png")}
    assert after == images, "the test must not write docs/images/"
