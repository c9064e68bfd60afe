"""Each milestone's measured H200 gain over the previous one, read from ``benchmarks/results/h200/*.json``.

Which figure is "the gain" of a milestone is a choice, so it is written down once, in ``FIGURES``: for each
milestone, the result files compared (their names, i.e. file stems), the metric, the workload as a reader
should see it, and whether lower is better. The first figure of a milestone is its headline. A milestone
with no entry, or whose files are not committed yet, shows "pending H200 run": a number appears only when
a result file holds it.

A result may carry interleaved repeats of the same run (``repeats``: a list of runs, each a result-shaped dict
or just its ``metrics``; or ``spread``: ``{metric: {"min": .., "max": ..}}``). Then the figure is the median
with its min-max. When both sides have the same number of repeats they were interleaved in one call
(A, B, A, B, ...), so the ratio is taken pair by pair and its median and range are reported.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from pathlib import Path

from .catalog import REPO_ROOT

RESULTS_DIR = REPO_ROOT / "benchmarks" / "results" / "h200"
PENDING = "pending H200 run"


@dataclass(frozen=True)
class Figure:
    """One measured comparison: result ``new`` against result ``old`` on ``metric``.

    ``section`` says where the metric lives in a result: ``metrics`` (the whole run), ``groups.<name>`` (one
    group of requests, e.g. ``groups.decoder``), or ``sweep:<prompt_len>`` (one point of a sweep).
    """

    old: str  # result name (file stem under benchmarks/results/h200/), e.g. "m03_skewed"
    new: str
    metric: str  # e.g. "output_tokens_per_s", "itl_mean_s"
    label: str  # the metric as a reader says it, e.g. "output tok/s"
    workload: str  # the workload as a reader should see it, e.g. "skewed"
    lower_is_better: bool = False
    section: str = "metrics"


TOKS = "output tok/s"
FIGURES: dict[str, tuple[Figure, ...]] = {
    "m01": (),  # the baseline: nothing before it
    "m02": (Figure("m01_single", "m02_single", "itl_mean_s", "mean inter-token latency", "single (512-token prompt)",
                   lower_is_better=True),
            Figure("m01_long-sweep", "m02_long-sweep", "itl_mean_s", "mean inter-token latency",
                   "long-sweep at a 32,768-token prompt", lower_is_better=True, section="sweep:32768")),
    "m03": (Figure("m02_offline-n16", "m03_offline", "output_tokens_per_s", TOKS, "offline"),),
    "m04": (Figure("m03_skewed", "m04_skewed", "output_tokens_per_s", TOKS, "skewed"),
            Figure("m03_nanovllm", "m04_nanovllm", "output_tokens_per_s", TOKS, "nanovllm"),
            Figure("m03_offline", "m04_offline", "output_tokens_per_s", TOKS, "offline")),
    # The figures below follow docs/benchmarks.md's file names and ROADMAP.md's targets; until their files are
    # committed they read "pending H200 run". Adjust a name here if the suite names a run differently.
    "m05": (Figure("m04_memory-bound", "m05_memory-bound", "output_tokens_per_s", TOKS, "memory-bound"),),
    "m06": (Figure("m05_prefix", "m06_prefix", "ttft_p50_s", "TTFT p50", "prefix", lower_is_better=True),
            Figure("m05_prefix", "m06_prefix", "prompt_tokens_computed", "prompt tokens computed", "prefix",
                   lower_is_better=True)),
    "m07": (Figure("m06_chunked-long", "m07_chunked-long", "itl_max_s", "worst decoder inter-token latency",
                   "chunked-long", lower_is_better=True, section="groups.decoder"),),
    "m08": (Figure("m07_nanovllm", "m08_nanovllm", "output_tokens_per_s", TOKS, "nanovllm"),),
    "m10": (Figure("m09_offline", "m10_offline", "output_tokens_per_s", TOKS, "offline"),),
}


@dataclass(frozen=True)
class Measurement:
    """A metric from one result file: the median over its repeats (a single run is its own median)."""

    result: dict
    values: tuple[float, ...]  # one per repeat, in run order
    low: float
    high: float

    @property
    def median(self) -> float:
        return statistics.median(self.values)


@dataclass(frozen=True)
class Gain:
    """A figure that could be computed: ``ratio`` is how many times better ``new`` is (>1: better)."""

    figure: Figure
    old: Measurement
    new: Measurement
    ratio: float
    ratio_low: float
    ratio_high: float
    has_spread: bool


@dataclass(frozen=True)
class Pending:
    """A figure with no number yet, and why (a missing or failed result file)."""

    figure: Figure | None
    reason: str


def load_result(name: str, results_dir: Path = RESULTS_DIR) -> dict | None:
    """The result ``<results_dir>/<name>.json``, or None when it is not there (or not readable JSON)."""
    try:
        return json.loads((results_dir / f"{name}.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _pick(run: dict, figure: Figure) -> float | None:
    """``figure``'s metric in one run (a result or one of its repeats); None when it is not there."""
    if figure.section == "metrics":
        block = run.get("metrics", run)
    elif figure.section.startswith("groups."):
        block = (run.get("groups") or {}).get(figure.section.removeprefix("groups."))
    elif figure.section.startswith("sweep:"):
        prompt_len = int(figure.section.removeprefix("sweep:"))
        block = next((p for p in run.get("sweep") or [] if p.get("prompt_len") == prompt_len), None)
    else:
        raise ValueError(f"unknown section {figure.section!r} in {figure}")
    value = block.get(figure.metric) if isinstance(block, dict) else None
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def measure(result: dict, figure: Figure) -> Measurement | None:
    """``figure``'s metric in ``result``, over its repeats when it has them; None when the metric is absent."""
    repeats = [r for r in result.get("repeats") or [] if isinstance(r, dict)]
    values = [v for v in (_pick(run, figure) for run in repeats) if v is not None]
    if values:
        return Measurement(result, tuple(values), min(values), max(values))
    value = _pick(result, figure)
    if value is None:
        return None
    spread = (result.get("spread") or {}).get(figure.metric)
    if isinstance(spread, dict) and {"min", "max"} <= spread.keys():
        return Measurement(result, (value,), float(spread["min"]), float(spread["max"]))
    if isinstance(spread, (list, tuple)) and len(spread) == 2:
        return Measurement(result, (value,), float(spread[0]), float(spread[1]))
    return Measurement(result, (value,), value, value)


def _better(old: float, new: float, lower_is_better: bool) -> float:
    return old / new if lower_is_better else new / old


def compare(figure: Figure, results_dir: Path = RESULTS_DIR) -> Gain | Pending:
    """``figure`` computed from the committed results, or ``Pending`` saying what is missing."""
    measurements = []
    for name in (figure.old, figure.new):
        result = load_result(name, results_dir)
        if result is None:
            return Pending(figure, f"{PENDING} ({name}.json not committed)")
        if result.get("status", "ok") != "ok":
            return Pending(figure, f"{PENDING} ({name}.json: {result.get('status')})")
        measurement = measure(result, figure)
        if measurement is None:
            return Pending(figure, f"{PENDING} ({name}.json has no {figure.metric} in {figure.section})")
        if 0 in (measurement.low, measurement.high):
            return Pending(figure, f"no ratio: {figure.metric} is 0 in {name}.json")
        measurements.append(measurement)
    old, new = measurements
    if len(old.values) == len(new.values) > 1:  # interleaved repeats of one call: compare pair by pair
        ratios = [_better(a, b, figure.lower_is_better) for a, b in zip(old.values, new.values)]
        ratio, low, high = statistics.median(ratios), min(ratios), max(ratios)
    else:
        ratio = _better(old.median, new.median, figure.lower_is_better)
        ends = [_better(a, b, figure.lower_is_better) for a in (old.low, old.high) for b in (new.low, new.high)]
        low, high = min(ends), max(ends)
    has_spread = len(old.values) > 1 or len(new.values) > 1 or low != high
    return Gain(figure, old, new, ratio, low, high, has_spread)


def gains_of(key: str, results_dir: Path = RESULTS_DIR) -> list[Gain | Pending]:
    """Every declared figure of milestone ``key`` (e.g. ``m04``), computed; [] for the baseline."""
    if key not in FIGURES:
        return [Pending(None, f"{PENDING} (no figure declared for {key} in milestones/_course/gains.py)")]
    return [compare(figure, results_dir) for figure in FIGURES[key]]


# ---- words -------------------------------------------------------------------------------------------------

def format_ratio(value: float) -> str:
    return f"{value:.0f}x" if value >= 10 else f"{value:.2f}x"


def format_value(metric: str, value: float) -> str:
    """A metric's value with its unit: seconds as ms (or s), rates as tok/s, counts with thousands separators."""
    if metric.endswith("_per_s"):
        return f"{value:,.0f} tok/s" if value >= 100 else f"{value:,.1f} tok/s"
    if metric.endswith("_s"):
        return f"{value:,.2f} s" if value >= 10 else f"{value * 1000:,.3g} ms"
    if metric.endswith("_fraction"):
        return f"{value:.2f}"
    return f"{value:,.0f}"


def describe(gain: Gain, previous_key: str) -> str:
    """One line, e.g. ``skewed: 1.78x m03's output tok/s (654 vs 367 tok/s)``, with ``(min-max)`` from repeats."""
    figure = gain.figure
    ratio, low, high = gain.ratio, gain.ratio_low, gain.ratio_high
    if figure.lower_is_better and ratio >= 1:
        words = "{r} lower {label} than {prev}"
    elif figure.lower_is_better:  # worse: say "higher" with the inverse, rather than "0.97x lower"
        ratio, low, high = 1 / ratio, 1 / high, 1 / low
        words = "{r} higher {label} than {prev}"
    else:
        words = "{r} {prev}'s {label}"
    r = format_ratio(ratio) + (f" ({format_ratio(low).removesuffix('x')}-{format_ratio(high)})"
                               if gain.has_spread else "")
    new, old = (format_value(figure.metric, m.median) for m in (gain.new, gain.old))
    new_number, _, new_unit = new.partition(" ")
    values = f"{new_number} vs {old}" if new_unit and old.endswith(" " + new_unit) else f"{new} vs {old}"
    line = f"{figure.workload}: {words.format(r=r, label=figure.label, prev=previous_key)} ({values})"
    runs = {len(gain.old.values), len(gain.new.values)}
    if runs != {1}:
        line += f", medians of {'/'.join(str(n) for n in sorted(runs))} runs"
    return line + _slice_note(gain)


def _slice_note(gain: Gain) -> str:
    """``; m02 ran 16 of the 128 requests`` when the two sides ran different numbers of a workload's requests."""
    notes = []
    for side in (gain.old.result, gain.new.result):
        workload = side.get("workload") or {}
        run, total = workload.get("num_requests"), workload.get("num_requests_total")
        if run and total and run != total:
            notes.append(f"{side.get('milestone', '?')} ran {run:,} of its {total:,} requests")
    return "; " + ", ".join(notes) if notes else ""
