"""Each milestone's measured H200 gain, read from ``benchmarks/results/h200/*.json`` (and ``online/*.json``).

Which figure is "the gain" of a milestone is a choice, so it is written down once, in ``FIGURES``: for each
milestone, the result files compared (their names, i.e. file stems), the metric, the workload as a reader
should see it, and whether lower is better. The first figure of a milestone is its headline. Usually the
comparison is with the milestone before; where the honest one is something else (m07 with its budget off, the
same engine offline for m09's server, a transformers baseline), the figure says what (``versus``). A milestone
with no entry, or whose files are not committed yet, shows "pending H200 run": a number appears only when a
result file holds it.

A result may carry interleaved repeats of the same run (``repeats``: a list of runs, each a result-shaped dict
or just its ``metrics``; or ``spread``: ``{metric: {"min": .., "max": ..}}``). Then the figure is the median
with its min-max. When both sides have the same number of repeats, the same commit and the same comparison
(``comparison.id``) they were interleaved in one call (A, B, A, B, ...), so the ratio is taken pair by pair and
its median and range are reported. A figure marked ``same_comparison`` counts only then: until one comparison
holds both sides (the older engine's file may come from an earlier call), it shows "pending H200 run".
Every line says how its two sides were measured (``provenance``): interleaved repeats, single runs, runs of
different calls (named by commit), or of a call earlier than the suite calls recorded in ``calls/*.json``.
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
    group of requests, e.g. ``groups.decoder``), ``sweep:<prompt_len>`` (one point of a sweep), or, in an online
    result (``online/*.json``), ``offline_reference`` (the same engine driven offline) or ``runs:<rate>`` (one
    arrival rate; ``runs:inf`` is the burst). ``old_section`` is the section in ``old`` where it differs.

    Most figures compare a milestone with the one before it. Where the honest comparison is another one (the
    same engine with a knob off, a transformers baseline, the same engine offline), ``versus`` says in a
    reader's words what ``old`` is, and ``note`` says what the figure is, or is not.
    """

    old: str  # result name (file stem under benchmarks/results/h200/), e.g. "m03_skewed"
    new: str
    metric: str  # e.g. "output_tokens_per_s", "itl_mean_s"
    label: str  # the metric as a reader says it, e.g. "output tok/s"
    workload: str  # the workload as a reader should see it, e.g. "skewed"
    lower_is_better: bool = False
    section: str = "metrics"
    old_section: str | None = None
    versus: str | None = None  # what ``old`` is when it is not the previous milestone, e.g. "hf-compiled"
    note: str = ""  # said after the numbers
    fewer: bool = False  # a count: "16x fewer prompt tokens computed" rather than "16x lower ..."
    same_comparison: bool = False  # a number only from interleaved repeats of one comparison, never across calls

    @property
    def sections(self) -> tuple[str, str]:
        """(the section read in ``old``, the section read in ``new``)."""
        return self.old_section or self.section, self.section


TOKS = "output tok/s"
FIGURES: dict[str, tuple[Figure, ...]] = {
    "m01": (),  # the baseline: nothing before it
    "m02": (Figure("m01_single", "m02_single", "itl_mean_s", "mean inter-token latency", "single (512-token prompt)",
                   lower_is_better=True),
            Figure("m01_long-sweep", "m02_long-sweep", "itl_mean_s", "mean inter-token latency",
                   "long-sweep at a 32,768-token prompt", lower_is_better=True, section="sweep:32768")),
    "m03": (Figure("m02_offline-n16", "m03_offline", "output_tokens_per_s", TOKS, "offline"),),
    "m04": (Figure("m03_offline", "m04_offline", "output_tokens_per_s", TOKS, "offline",
                   note="about as many steps as m03, each with more host work, all bound by eager kernel launches"),
            Figure("m03_offline", "m04_offline", "ttft_p50_s", "TTFT p50", "offline", lower_is_better=True),
            Figure("m03_skewed", "m04_skewed", "output_tokens_per_s", TOKS, "skewed (one request in 8 long)"),
            Figure("m03_nanovllm", "m04_nanovllm", "output_tokens_per_s", TOKS, "nanovllm (exact, 256 requests)",
                   note="uniform random lengths: m03's padding waste is moderate there")),
    "m05": (Figure("m04_memory-bound", "m05_memory-bound", "output_tokens_per_s", TOKS, "memory-bound"),
            Figure("m04_memory-bound", "m05_memory-bound", "running_mean_while_waiting",
                   "requests in the batch while others wait", "memory-bound"),
            Figure("m04_nanovllm+beside-m05", "m05_nanovllm", "output_tokens_per_s", TOKS,
                   "nanovllm (all 256 in flight)",
                   note="slower: the same steps, each with block-table metadata and a gather; and admission "
                        "runs 19 prefill-only steps in a row (decodes join them only in m07)")),
    "m06": (Figure("m05_prefix", "m06_prefix", "ttft_p50_s", "TTFT p50", "prefix", lower_is_better=True),
            Figure("m05_prefix", "m06_prefix", "prompt_tokens_computed", "prompt tokens computed", "prefix",
                   lower_is_better=True, fewer=True),
            Figure("m05_prefix-large", "m06_prefix-large", "wall_time_s", "wall time", "prefix-large",
                   lower_is_better=True)),
    "m07": (Figure("m07_chunked-long+mnbt-none", "m07_chunked-long+mnbt-512", "itl_max_s",
                   "worst decoder inter-token latency", "chunked-long, budget 512", lower_is_better=True,
                   section="groups.decoder", versus="m07 with no budget, each prompt in one step as in m06"),
            Figure("m07_chunked-long+mnbt-none", "m07_chunked-long+mnbt-512", "ttft_p50_s",
                   "TTFT p50 of the long prompts", "chunked-long, budget 512", lower_is_better=True,
                   section="groups.long_prompt", versus="m07 with no budget",
                   note="the price: each long prompt now takes many steps")),
    "m08": (Figure("m07_nanovllm", "m08_nanovllm", "output_tokens_per_s", TOKS, "nanovllm"),
            Figure("m07_offline", "m08_offline", "output_tokens_per_s", TOKS, "offline (64 in flight)",
                   note="short contexts: less K/V to gather, so less to gain")),
    "m09": (Figure("online/online_m09_offline", "online/online_m09_offline", "output_tokens_per_s", TOKS,
                   "offline, streamed over HTTP all at once (burst)", section="runs:inf",
                   old_section="offline_reference", versus="the same engine's offline generate",
                   note="not a gain over m08: what serving costs (event loop and engine thread share one "
                        "Python process; the clients run in another)"),
            Figure("online/online_m09_nanovllm", "online/online_m09_nanovllm", "output_tokens_per_s", TOKS,
                   "nanovllm, streamed over HTTP all at once (burst)", section="runs:inf",
                   old_section="offline_reference", versus="the same engine's offline generate",
                   note="at 6,000 tok/s the server's per-token Python is the ceiling")),
    "m10": (Figure("m09_offline", "m10_offline", "output_tokens_per_s", TOKS, "offline"),
            Figure("hf-compiled_offline", "m10_offline", "output_tokens_per_s", TOKS, "offline",
                   versus="hf-compiled",
                   note="hf-compiled: transformers' generate with a static cache and torch.compile, warmed up"),
            Figure("m09_nanovllm", "m10_nanovllm", "output_tokens_per_s", TOKS, "nanovllm"),
            Figure("m09_memory-bound", "m10_memory-bound", "output_tokens_per_s", TOKS, "memory-bound"),
            Figure("online/online_m09_offline", "online/online_m10_offline", "output_tokens_per_s", TOKS,
                   "offline, served over HTTP, all at once (burst)", section="runs:inf", versus="m09's server",
                   note="at a p99 TTFT target of 0.25-1 s: 1,951 vs 814 tok/s (2.40x)")),
    "m11": (Figure("online/online_m11_nanovllm", "online/online_m11_nanovllm", "output_tokens_per_s", TOKS,
                   "nanovllm, streamed over HTTP all at once (burst)", section="runs:inf",
                   old_section="offline_reference", versus="the same engine's offline generate",
                   note="what serving costs once the server's Python runs in a process of its own"),
            Figure("online/online_m11_offline", "online/online_m11_offline", "output_tokens_per_s", TOKS,
                   "offline, streamed over HTTP all at once (burst)", section="runs:inf",
                   old_section="offline_reference", versus="the same engine's offline generate",
                   note="target 0.95, not met; m10's server in the same call: 0.67"),
            Figure("online/online_m10_offline+beside-m11", "online/online_m11_offline", "output_tokens_per_s", TOKS,
                   "offline, streamed over HTTP all at once (burst)", section="runs:inf",
                   versus="m10's server in the same call"),
            Figure("online/online_m10_offline+beside-m11", "online/online_m11_offline", "ttft_p50_s", "TTFT p50",
                   "offline at 8 requests/s", lower_is_better=True, section="runs:8",
                   versus="m10's server in the same call",
                   note="target: at most 10% higher, missed by a hair; at 4 and 16 requests/s m11's is lower"),
            Figure("online/online_m10_nanovllm", "online/online_m11_nanovllm", "output_tokens_per_s", TOKS,
                   "nanovllm, streamed over HTTP all at once (burst)", section="runs:inf", versus="m10's server",
                   note="hosts differ between calls: compare each burst with its own engine's offline generate"),
            Figure("m10_nanovllm+beside-m11", "m11_nanovllm", "output_tokens_per_s", TOKS, "nanovllm, offline generate",
                   versus="m10", same_comparison=True,
                   note="no gain expected: offline, m11's generate is m10's, in the caller's process")),
    "m12": (Figure("m10_nanovllm+beside-m12", "m12_nanovllm", "output_tokens_per_s", TOKS,
                   "nanovllm (exact, 256 requests)", versus="m10", same_comparison=True,
                   note="m11's offline generate is m10's: the step before the overlap"),
            Figure("step_probe_m11", "step_probe_m12", "step_wall_ms", "wall time per decode step",
                   "nanovllm at steady state (steps 300-380, benchmarks.step_probe)", lower_is_better=True,
                   versus="m11", note="the host's work hidden behind the GPU's, and fewer, larger kernels in the decode graphs"),
            Figure("hf-compiled_offline+beside-m12", "m12_offline", "output_tokens_per_s", TOKS, "offline",
                   versus="hf-compiled", same_comparison=True,
                   note="target 5x, met with steps with prompt chunks replayed whole (one prefill kernel a layer)"),
            Figure("m12_offline+piecewise", "m12_offline", "output_tokens_per_s", TOKS, "offline",
                   versus="m12 with mixed steps in pieces", same_comparison=True,
                   note="cudagraph_mode full against full_and_piecewise: the attention recorded too"),
            Figure("m10_offline+beside-m12", "m12_offline", "output_tokens_per_s", TOKS, "offline",
                   versus="m10", same_comparison=True),
            Figure("m10_memory-bound+beside-m12", "m12_memory-bound", "output_tokens_per_s", TOKS, "memory-bound",
                   versus="m10", same_comparison=True,
                   note="measured before mixed steps were replayed in pieces")),
    # m13's headline, the batch-1 decode step of qwen3-8b-random per weight format, is a file of per-round step
    # times (m13_step_times.json, benchmarks/quant_step.py) that no section here reads: its page quotes it.
    # Here: the FP8 K/V cache against m13's own bf16 cache, interleaved in one comparison, Qwen3-0.6B's shape.
    "m13": (Figure("m13_memory-bound", "m13_memory-bound+fp8kv", "output_tokens_per_s", TOKS,
                   "memory-bound (4 GiB of K/V)", versus="m13 with a bf16 K/V cache", same_comparison=True,
                   note="the same bytes hold twice the tokens: all 96 requests ran at once, none preempted "
                        "(measured before the FP8 tiles were widened to fp16)"),
            Figure("m13_memory-bound", "m13_memory-bound+fp8kv", "running_mean", "mean number of requests running",
                   "memory-bound (4 GiB of K/V)", versus="m13 with a bf16 K/V cache", same_comparison=True,
                   note="at most 96 (every request) against 66"),
            Figure("m13_memory-bound", "m13_memory-bound+fp8kv", "running_mean_while_waiting",
                   "requests in the batch while others wait", "memory-bound (4 GiB of K/V)",
                   versus="m13 with a bf16 K/V cache", same_comparison=True,
                   note="with FP8 only the first 6 steps had a request waiting, for the prefill budget, not for "
                        "memory: this counts the admission ramp there"),
            Figure("m13_nanovllm", "m13_nanovllm+fp8kv", "output_tokens_per_s", TOKS, "nanovllm (exact, 256 requests)",
                   versus="m13 with a bf16 K/V cache", same_comparison=True,
                   note="the bf16 cache was never short here: FP8 halves the bytes attention reads, but its kernels "
                        "(tiles widened to fp16) cost more per byte than bf16's")),
    # m14's gain is a split against no split (two GPUs); at tensor_parallel_size=1 it must equal the milestone
    # before it, which is what its one-GPU figure checks.
    "m14": (Figure("m14_single+tp1-8b", "m14_single+tp2-8b", "itl_mean_s", "mean inter-token latency",
                   "single on Qwen3-8B's shape (batch 1), two H200s", lower_is_better=True,
                   versus="tensor_parallel_size=1", same_comparison=True),
            Figure("m14_nanovllm+tp1-8b", "m14_nanovllm+tp2-8b", "output_tokens_per_s", TOKS,
                   "nanovllm on Qwen3-8B's shape, two H200s", versus="tensor_parallel_size=1", same_comparison=True),
            Figure("m14_nanovllm+tp1", "m14_nanovllm+tp2", "output_tokens_per_s", TOKS,
                   "nanovllm on Qwen3-0.6B's shape, two H200s", versus="tensor_parallel_size=1",
                   same_comparison=True),
            Figure("m13_nanovllm+beside-m14", "m14_nanovllm", "output_tokens_per_s", TOKS,
                   "nanovllm at tensor_parallel_size=1", versus="m13", same_comparison=True,
                   note="must be 1.0x: one rank is m13 (no worker, no collective)")),
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
    provenance: str = ""  # how the two sides were measured, e.g. "medians of 3 interleaved runs"


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


TOP_LEVEL_SECTIONS = ("metrics", "offline_reference")


def _block(run: dict, section: str) -> dict | None:
    """The dict that holds the metrics of ``section`` in one run (a result or one of its repeats)."""
    if section == "metrics":
        return run.get("metrics", run)
    if section in TOP_LEVEL_SECTIONS:
        return run.get(section)
    if section.startswith("groups."):
        return (run.get("groups") or {}).get(section.removeprefix("groups."))
    if section.startswith("sweep:"):
        prompt_len = int(section.removeprefix("sweep:"))
        return next((p for p in run.get("sweep") or [] if p.get("prompt_len") == prompt_len), None)
    if section.startswith("runs:"):  # an online result: one arrival rate ("inf": the burst)
        rate = float(section.removeprefix("runs:"))
        found = next((r for r in run.get("runs") or [] if _as_float(r.get("rate")) == rate), None)
        return found.get("summary") if isinstance(found, dict) else None
    raise ValueError(f"unknown section {section!r}")


def _as_float(value: object) -> float | None:
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _pick(run: dict, metric: str, section: str) -> float | None:
    """``metric`` of ``section`` in one run; None when it is not there."""
    block = _block(run, section)
    value = block.get(metric) if isinstance(block, dict) else None
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def measure(result: dict, figure: Figure, section: str | None = None) -> Measurement | None:
    """``figure``'s metric in ``result`` (in ``section``, default the figure's), over its repeats when it has
    them; None when the metric is absent."""
    section = section or figure.section
    repeats = [r for r in result.get("repeats") or [] if isinstance(r, dict)]
    values = [v for v in (_pick(run, figure.metric, section) for run in repeats) if v is not None]
    if values:
        return Measurement(result, tuple(values), min(values), max(values))
    value = _pick(result, figure.metric, section)
    if value is None:
        return None
    spread = result.get("spread") or {}
    spread = spread.get(figure.metric, spread.get(f"{section}.{figure.metric}"))
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
    for name, section in zip((figure.old, figure.new), figure.sections):
        result = load_result(name, results_dir)
        if result is None:
            return Pending(figure, f"{PENDING} ({name}.json not committed)")
        if result.get("status", "ok") != "ok":
            return Pending(figure, f"{PENDING} ({name}.json: {result.get('status')})")
        measurement = measure(result, figure, section)
        if measurement is None:
            return Pending(figure, f"{PENDING} ({name}.json has no {figure.metric} in {section})")
        if 0 in (measurement.low, measurement.high):
            return Pending(figure, f"no ratio: {figure.metric} is 0 in {name}.json")
        measurements.append(measurement)
    old, new = measurements
    interleaved = (len(old.values) == len(new.values) > 1 and _commit(old.result) == _commit(new.result)
                   and _comparison(old.result) == _comparison(new.result))
    if figure.same_comparison and not interleaved:
        return Pending(figure, f"{PENDING} ({figure.old}.json and {figure.new}.json are not the interleaved "
                               "repeats of one comparison)")
    if interleaved:  # repeats of one call, A, B, A, B, ...: compare pair by pair
        ratios = [_better(a, b, figure.lower_is_better) for a, b in zip(old.values, new.values)]
        ratio, low, high = statistics.median(ratios), min(ratios), max(ratios)
    else:
        ratio = _better(old.median, new.median, figure.lower_is_better)
        ends = [_better(a, b, figure.lower_is_better) for a in (old.low, old.high) for b in (new.low, new.high)]
        low, high = min(ends), max(ends)
    has_spread = len(old.values) > 1 or len(new.values) > 1 or low != high
    return Gain(figure, old, new, ratio, low, high, has_spread, provenance(old, new, interleaved, results_dir))


def _commit(result: dict) -> str | None:
    """The result's git commit, short (suite records write it in full or short)."""
    commit = (result.get("env") or {}).get("git_commit")
    return commit[:7] if isinstance(commit, str) and commit else None


def _comparison(result: dict) -> str | None:
    """The interleaved comparison a result was measured in (``comparison.id``, e.g. ``nanovllm:m03/m04``).

    Two results of one commit were interleaved only if they share it: a two-GPU call runs two comparisons
    side by side, one per GPU, and a ratio must not pair repeats from different GPUs."""
    comparison = result.get("comparison")
    return comparison.get("id") if isinstance(comparison, dict) else None


def first_suite_call(results_dir: Path = RESULTS_DIR) -> str | None:
    """When the earliest suite call recorded in ``<results_dir>/calls/*.json`` started (ISO time), or None."""
    starts = []
    for path in sorted((results_dir / "calls").glob("*.json")):
        try:
            started = json.loads(path.read_text(encoding="utf-8")).get("suite", {}).get("started")
        except (OSError, ValueError, AttributeError):
            continue
        if isinstance(started, str):
            starts.append(started)
    return min(starts) if starts else None


def provenance(old: Measurement, new: Measurement, interleaved: bool, results_dir: Path = RESULTS_DIR) -> str:
    """How the two sides were measured, in words: interleaved repeats of one call, single runs, or runs of
    different calls (named by commit). A run made before the first recorded suite call is "an earlier call"."""
    runs = sorted({len(old.values), len(new.values)})
    if interleaved:
        return f"medians of {runs[0]} interleaved runs"
    commits = [c for c in dict.fromkeys((_commit(old.result), _commit(new.result))) if c]
    first_call = first_suite_call(results_dir)
    stamps = [(m.result.get("env") or {}).get("timestamp") for m in (old, new)]
    earlier = first_call is not None and all(isinstance(t, str) and t < first_call for t in stamps)
    words = "single runs" if runs == [1] else f"medians of {'/'.join(str(n) for n in runs)} runs"
    if len(commits) > 1:
        return f"{words} of different calls ({', '.join(commits)})"
    if earlier:
        return f"{words} of an earlier call" + (f" ({commits[0]})" if commits else "")
    return words


def gains_of(key: str, results_dir: Path = RESULTS_DIR) -> list[Gain | Pending]:
    """Every declared figure of milestone ``key`` (e.g. ``m04``), computed; [] for the baseline."""
    if key not in FIGURES:
        return [Pending(None, f"{PENDING} (no figure declared for {key} in milestones/_course/gains.py)")]
    return [compare(figure, results_dir) for figure in FIGURES[key]]


# ---- words -------------------------------------------------------------------------------------------------

def format_ratio(value: float) -> str:
    """Three significant digits below 100 (``16.5x``, never rounded to ``16x``), whole numbers above."""
    if value >= 100:
        return f"{value:,.0f}x"
    return f"{value:.1f}x" if value >= 10 else f"{value:.2f}x"


def format_value(metric: str, value: float) -> str:
    """A metric's value with its unit: seconds as ms (or s), rates as tok/s, counts with thousands separators."""
    if metric.endswith("_per_s"):
        return f"{value:,.0f} tok/s" if value >= 100 else f"{value:,.1f} tok/s"
    if metric.endswith("_ms"):
        return f"{value:.2f} ms"
    if metric.endswith("_s"):
        if value >= 10:
            return f"{value:,.1f} s"
        return f"{value:.2f} s" if value >= 1 else f"{value * 1000:.3g} ms"
    if metric.endswith("_fraction"):
        return f"{value:.2f}"
    return f"{value:,.0f}" if value >= 100 or value == int(value) else f"{value:.1f}"


def describe(gain: Gain, previous_key: str) -> str:
    """One line, e.g. ``skewed: 1.78x m03's output tok/s (654 vs 367 tok/s), single runs``, with ``(min-max)``
    from repeats; the comparison is with ``previous_key`` unless the figure names what it is ``versus``."""
    figure = gain.figure
    ratio, low, high = gain.ratio, gain.ratio_low, gain.ratio_high
    against = figure.versus or previous_key
    lower, higher = ("fewer", "more") if figure.fewer else ("lower", "higher")
    if figure.lower_is_better and ratio >= 1:
        words = f"{{r}} {lower} {figure.label} than {against}"
    elif figure.lower_is_better:  # worse: say "higher" with the inverse, rather than "0.97x lower"
        ratio, low, high = 1 / ratio, 1 / high, 1 / low
        words = f"{{r}} {higher} {figure.label} than {against}"
    else:
        words = f"{{r}} {against}'s {figure.label}" if " " not in against else f"{{r}} the {figure.label} of {against}"
        if ratio < 1:  # worse where higher is better: the ratio stays (it is the honest one), and the line says so
            words += f", i.e. {lower}"
    r = format_ratio(ratio)
    if gain.has_spread and format_ratio(low) != format_ratio(high):
        r += f" ({format_ratio(low).removesuffix('x')}-{format_ratio(high)})"
    new, old = (format_value(figure.metric, m.median) for m in (gain.new, gain.old))
    new_number, _, new_unit = new.partition(" ")
    values = f"{new_number} vs {old}" if new_unit and old.endswith(" " + new_unit) else f"{new} vs {old}"
    line = f"{figure.workload}: {words.format(r=r)} ({values})"
    if gain.provenance:
        line += f", {gain.provenance}"
    line += _slice_note(gain)
    return line + (f"; {figure.note}" if figure.note else "")


def _slice_note(gain: Gain) -> str:
    """``; m02 ran 16 of its 128 requests`` when a side ran only part of its workload's requests."""
    notes = []
    for side in (gain.old.result, gain.new.result):
        workload = side.get("workload")
        if not isinstance(workload, dict):  # a probe's file names its workload only
            continue
        run, total = workload.get("num_requests"), workload.get("num_requests_total")
        if run and total and run != total:
            notes.append(f"{side.get('milestone', '?')} ran {run:,} of its {total:,} requests")
    return "; " + ", ".join(dict.fromkeys(notes)) if notes else ""
