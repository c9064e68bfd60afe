"""Small helpers the milestone notebooks share: find the repo, load the committed results, save figures.

Kept out of ``milestones/`` and ``benchmarks/`` on purpose: nothing here is part of the engine.

* ``repo_root()``: the nanoserve checkout, found by walking up from the working directory until
  ``benchmarks/results`` exists (so a notebook works whether Jupyter starts in ``notebooks/`` or the root).
  It also puts the root on ``sys.path``, so ``import milestones`` works without ``pip install -e .``.
* ``load_runs(gpu="h200")``: every ``benchmarks/results/<gpu>/*.json`` as ``{file stem: result dict}``.
* ``load_result(name, gpu="h200")``: one result file of any kind (``kernel_bench``, ``m10_step_times``,
  ``online/online_m09_offline``: files without a run's ``status``, which ``load_runs`` leaves out).
* ``repeat_values(run, key)`` / ``median_range(run, key)``: a figure over a comparison's interleaved repeats
  (``metrics.output_tokens_per_s``, ``groups.decoder.itl_max_s``): every run's value, or (median, min, max);
  a single run gives its one value. ``yerr(points)`` turns (median, min, max) triples into matplotlib's
  error bars. ``ratio_range(a, b, key)``: the ratio a / b round by round (repeat k of each ran side by side),
  as (median, min, max): how the suite reports a comparison.
* ``call_ratio(call, comparison, numerator, denominator)``: the same (median, min, max) as a GPU call's record
  (``benchmarks/results/<gpu>/calls/<call>.json``) holds it: the only copy once a later call has rewritten the
  members' result files.
* ``save_figure(fig, name)``: writes ``docs/images/<name>`` for the docs to embed, but only when a maintainer
  asks for it with ``NANOSERVE_SAVE_FIGURES=1``: a reader running a notebook never rewrites a committed file.
  Only figures drawn from committed results (or from counts that are the same on every machine) are saved;
  a plot of timings measured live on the reader's machine is shown, never saved.
* ``style()``: one matplotlib look for every notebook.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
from pathlib import Path

SAVE_ENV = "NANOSERVE_SAVE_FIGURES"  # "1": save_figure writes docs/images/ (maintainers regenerating figures)


def repo_root(start: Path | str | None = None) -> Path:
    """The first directory at or above ``start`` (default: the cwd) that holds ``benchmarks/results``."""
    here = Path(start or Path.cwd()).resolve()
    for candidate in (here, *here.parents):
        if (candidate / "benchmarks" / "results").is_dir():
            if str(candidate) not in sys.path:
                sys.path.insert(0, str(candidate))
            return candidate
    raise FileNotFoundError(f"no benchmarks/results above {here}: run the notebook inside the nanoserve repo")


def load_runs(gpu: str = "h200") -> dict[str, dict]:
    """``{"m02_single": {...}, ...}`` for every result file of ``gpu``; only runs with ``status == "ok"``."""
    folder = repo_root() / "benchmarks" / "results" / gpu
    runs = {p.stem: json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))}
    return {name: run for name, run in runs.items() if run.get("status") == "ok"}


def load_result(name: str, gpu: str = "h200") -> dict:
    """``benchmarks/results/<gpu>/<name>.json``, whatever its kind (no ``status`` filter)."""
    return json.loads((repo_root() / "benchmarks" / "results" / gpu / f"{name}.json").read_text())


def repeat_values(run: dict, key: str) -> list[float]:
    """``key`` (dotted: ``metrics.ttft_p50_s``, ``groups.decoder.itl_max_s``) in every interleaved repeat of
    ``run``; a run without repeats gives its single value."""
    def pick(record: dict) -> float:
        for part in key.split("."):
            record = record[part]
        return record

    return [pick(r) for r in run["repeats"]] if run.get("repeats") else [pick(run)]


def median_range(run: dict, key: str, scale: float = 1.0) -> tuple[float, float, float]:
    """(median, min, max) of ``key`` over the run's repeats, times ``scale``; min = max = median for one run."""
    values = sorted(v * scale for v in repeat_values(run, key))
    return statistics.median(values), values[0], values[-1]


def ratio_range(numerator: dict, denominator: dict, key: str) -> tuple[float, float, float]:
    """(median, min, max) over rounds of ``key`` in ``numerator`` / ``denominator`` (two members of one
    interleaved comparison: their repeat k ran in the same round)."""
    ratios = sorted(a / b for a, b in zip(repeat_values(numerator, key), repeat_values(denominator, key), strict=True))
    return statistics.median(ratios), ratios[0], ratios[-1]


def call_ratio(call: str, comparison: str, numerator: str, denominator: str,
               metric: str = "metrics.output_tokens_per_s", gpu: str = "h200") -> tuple[float, float, float]:
    """(median, min, max) of ``numerator`` / ``denominator`` over the interleaved rounds of ``comparison``
    (``"nanovllm:m04/m05/m06"``) in the record of ``call`` (``"20261130T074303_pair-a-gpu0"``)."""
    record = load_result(f"calls/{call}", gpu)
    for entry in record["comparisons"]:
        if entry["id"] != comparison:
            continue
        for ratio in entry["ratios"]:
            if (ratio["numerator"], ratio["denominator"], ratio["metric"]) == (numerator, denominator, metric):
                return ratio["median"], ratio["min"], ratio["max"]
    raise KeyError(f"calls/{call}.json has no {numerator} / {denominator} ({metric}) in comparison {comparison!r}")


def yerr(points: list[tuple[float, float, float]]) -> list[list[float]]:
    """matplotlib's ``yerr`` (distances below and above) for (median, min, max) triples."""
    return [[m - lo for m, lo, _ in points], [hi - m for m, _, hi in points]]


def sweep_points(run: dict, key: str = "itl_mean_s", scale: float = 1e3) -> tuple[list[int], list[float]]:
    """(prompt lengths, ``key`` * ``scale``) of a sweep workload (``single-sweep``, ``long-sweep``)."""
    points = sorted(run["sweep"], key=lambda s: s["prompt_len"])
    return [s["prompt_len"] for s in points], [s[key] * scale for s in points]


def save_figure(fig, name: str, dpi: int = 150) -> Path | None:
    """Save ``fig`` as ``docs/images/<name>`` when ``NANOSERVE_SAVE_FIGURES=1``; otherwise do nothing (None)."""
    if os.environ.get(SAVE_ENV) != "1":
        return None
    path = repo_root() / "docs" / "images" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi, bbox_inches="tight")
    print(f"saved docs/images/{name}")
    return path


def style() -> None:
    """A plain, readable matplotlib style, small enough to keep the notebooks light."""
    import matplotlib.pyplot as plt

    plt.rcParams.update({
        "figure.dpi": 80,
        "figure.figsize": (8, 4.2),
        "axes.grid": True,
        "grid.alpha": 0.3,
        "axes.spines.top": False,
        "axes.spines.right": False,
        "legend.frameon": False,
        "font.size": 10,
    })


# One colour per engine, the same in every notebook.
COLORS = {
    "m01": "#d62728",
    "m02": "#1f77b4",
    "m03": "#ff7f0e",
    "m04": "#2ca02c",
    "m05": "#8c564b",
    "m06": "#bcbd22",
    "m07": "#6b6ecf",
    "m08": "#ad494a",
    "m09": "#17becf",
    "m10": "#e377c2",
    "m11": "#1b9e77",
    "m12": "#d95f02",
    "hf-static": "#7f7f7f",
    "hf-cb": "#9467bd",
    "hf-compiled": "#404040",
    "nano-vllm (published)": "#c7c7c7",
}
