"""Every notebook under ``notebooks/`` runs top to bottom on a CPU without an error.

Each notebook is executed from an in-memory copy with nbclient, in the ``notebooks/`` folder (so
``nbhelpers`` imports and the repo root is found as it is for a reader), and nothing is written back: the
committed notebooks keep their outputs. It runs as a reader would, without ``NANOSERVE_SAVE_FIGURES``, and
checks that the checkout is exactly as clean (or as dirty) afterwards as before: running a notebook must
not rewrite a committed file (``nbhelpers.save_figure`` writes ``docs/images/`` only when a maintainer sets
``NANOSERVE_SAVE_FIGURES=1``). New notebooks are picked up by the glob.

The kernel is the interpreter running pytest (``ipykernel`` from the dev extras): the test writes a
``python3`` kernel spec naming ``sys.executable`` into a temp dir and puts it first on ``JUPYTER_PATH``, so
neither a user-level kernel spec nor ``ipykernel install`` matters.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")
pytest.importorskip("matplotlib")

NOTEBOOKS_DIR = Path(__file__).resolve().parents[1] / "notebooks"
NOTEBOOKS = sorted(NOTEBOOKS_DIR.glob("*.ipynb"))
IMAGES_DIR = NOTEBOOKS_DIR.parent / "docs" / "images"
CELL_TIMEOUT_S = 300


def git_status() -> str | None:
    """``git status --porcelain`` of the checkout (untracked files included), or None outside a git checkout."""
    if shutil.which("git") is None:
        return None
    result = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"], cwd=NOTEBOOKS_DIR.parent,
                            capture_output=True, text=True)
    return result.stdout if result.returncode == 0 else None


def images() -> dict[Path, int]:
    return {p: p.stat().st_mtime_ns for p in IMAGES_DIR.glob("*.png")}


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
    monkeypatch.delenv("NANOSERVE_SAVE_FIGURES", raising=False)   # run as a reader does
    # One intra-op thread: a little slower than two on an idle 2-core machine, but steady. On a busy one,
    # OpenMP threads spinning against another process can slow every step by an order of magnitude.
    monkeypatch.setenv("OMP_NUM_THREADS", "1")

    before = path.read_bytes()
    images_before, status_before = images(), git_status()
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
    assert images() == images_before, "running a notebook must not write docs/images/"
    assert git_status() == status_before, "running a notebook must not change, add or delete files in the checkout"


# --------------------------------------------------------------------------- nbhelpers.save_figure


@pytest.fixture
def nbhelpers(monkeypatch, tmp_path):
    """``nbhelpers`` imported as a notebook does, inside a fake checkout in ``tmp_path``."""
    (tmp_path / "benchmarks" / "results").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(NOTEBOOKS_DIR))
    import nbhelpers

    return nbhelpers


def small_figure():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    ax.plot([1, 2], [3, 4])
    return fig


@pytest.mark.parametrize("value", [None, "", "0", "yes"])
def test_save_figure_writes_nothing_unless_asked(nbhelpers, monkeypatch, tmp_path, value):
    if value is None:
        monkeypatch.delenv("NANOSERVE_SAVE_FIGURES", raising=False)
    else:
        monkeypatch.setenv("NANOSERVE_SAVE_FIGURES", value)
    assert nbhelpers.save_figure(small_figure(), "x.png") is None
    assert not (tmp_path / "docs").exists()


def test_save_figure_writes_docs_images_when_a_maintainer_asks(nbhelpers, monkeypatch, tmp_path):
    monkeypatch.setenv("NANOSERVE_SAVE_FIGURES", "1")
    path = nbhelpers.save_figure(small_figure(), "x.png")
    assert path == tmp_path / "docs" / "images" / "x.png" and path.stat().st_size > 0


# --------------------------------------------------------------------------- nbhelpers: repeats and ratios


def test_median_range_over_repeats_and_a_single_run(nbhelpers):
    run = {"repeats": [{"metrics": {"tps": v}, "groups": {"decoder": {"itl": v / 10}}} for v in [30.0, 10.0, 20.0]]}
    assert nbhelpers.repeat_values(run, "metrics.tps") == [30.0, 10.0, 20.0]
    assert nbhelpers.median_range(run, "metrics.tps") == (20.0, 10.0, 30.0)
    assert nbhelpers.median_range(run, "groups.decoder.itl", scale=1e3) == (2000.0, 1000.0, 3000.0)
    single = {"metrics": {"tps": 7.0}}
    assert nbhelpers.median_range(single, "metrics.tps") == (7.0, 7.0, 7.0)
    assert nbhelpers.yerr([(20.0, 10.0, 30.0), (7.0, 7.0, 7.0)]) == [[10.0, 0.0], [10.0, 0.0]]


def test_ratio_range_pairs_runs_of_the_same_round(nbhelpers):
    # Round by round the ratios are 2, 3 and 4; dividing the two medians instead would give 20 / 10 = 2.
    a = {"repeats": [{"metrics": {"tps": v}} for v in [20.0, 60.0, 12.0]]}
    b = {"repeats": [{"metrics": {"tps": v}} for v in [10.0, 20.0, 3.0]]}
    assert nbhelpers.ratio_range(a, b, "metrics.tps") == (3.0, 2.0, 4.0)
    with pytest.raises(ValueError):
        nbhelpers.ratio_range(a, {"repeats": b["repeats"][:2]}, "metrics.tps")


def test_call_ratio_reads_a_call_record(nbhelpers, tmp_path):
    calls = tmp_path / "benchmarks" / "results" / "h200" / "calls"
    calls.mkdir(parents=True)
    ratio = {"numerator": "m05", "denominator": "m04", "metric": "metrics.output_tokens_per_s",
             "median": 0.92, "min": 0.9, "max": 1.01, "n": 3}
    other = {**ratio, "metric": "metrics.running_mean", "median": 2.0, "min": 2.0, "max": 2.0}
    (calls / "c1.json").write_text(json.dumps({"comparisons": [
        {"id": "offline:m04/m05", "ratios": [{**ratio, "median": 0.5}]},
        {"id": "nanovllm:m04/m05", "ratios": [other, ratio]}]}))
    assert nbhelpers.call_ratio("c1", "nanovllm:m04/m05", "m05", "m04") == (0.92, 0.9, 1.01)
    assert nbhelpers.call_ratio("c1", "nanovllm:m04/m05", "m05", "m04", "metrics.running_mean") == (2.0, 2.0, 2.0)
    with pytest.raises(KeyError, match="m04 / m05"):
        nbhelpers.call_ratio("c1", "nanovllm:m04/m05", "m04", "m05")
