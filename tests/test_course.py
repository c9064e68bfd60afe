"""``python -m milestones`` (the list of milestones and their gains) and ``python -m milestones diff``.

Expectations come from the packages themselves (their files, their classes' own ``__dict__``, ``inspect``) and
from the committed result JSON, read here independently of ``milestones/_course``; a few known facts of
m02-m04 are checked by name. New milestones are picked up the way tests/test_milestone_chain.py finds them.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
import json
import pkgutil
import re
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

import milestones
from milestones._course import gains
from milestones._course.cli import main
from milestones._course.style import Style, wants_colour

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results" / "h200"
PACKAGES = sorted(m.name for m in pkgutil.iter_modules(milestones.__path__) if m.name[:1] == "m" and m.ispkg)
PAIRS = list(zip(PACKAGES, PACKAGES[1:]))
ANSI = re.compile(r"\033\[[0-9;]*m")


def run(capsys, *argv: str) -> tuple[int, str, str]:
    status = main(list(argv))
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def result(name: str) -> dict:
    return json.loads((RESULTS / f"{name}.json").read_text())


def metric(name: str, key: str) -> float:
    return result(name)["metrics"][key]


def repeats_of(name: str, key: str, group: str | None = None) -> list[float]:
    """``key`` in every interleaved repeat of a result (of one request group, when given)."""
    return [(r["groups"][group] if group else r["metrics"])[key] for r in result(name)["repeats"]]


def median_ratio(old: list[float], new: list[float]) -> float:
    """The median of pair-by-pair ratios new/old: how interleaved repeats of one call are compared."""
    return statistics.median(b / a for a, b in zip(old, new))


def block_of(out: str, name: str) -> str:
    """The lines of ``python -m milestones`` that belong to milestone ``name``."""
    return out.split(f"\n{name} ", 1)[1].split("\n\n", 1)[0]


# ---- the list -------------------------------------------------------------------------------------------------

def test_list_shows_every_milestone_package_with_its_demo_and_doc(capsys):
    status, out, _ = run(capsys)
    assert status == 0
    for name in PACKAGES:
        assert re.search(rf"^{name}\s+\S", out, re.M), f"{name} is not listed with its idea"
        if (REPO / "milestones" / name / "__main__.py").is_file():
            assert f"python -m milestones.{name}" in out
        for page in (REPO / "docs").glob(f"{name.split('_')[0]}-*.md"):
            assert f"docs/{page.name}" in out


def test_list_idea_is_the_docstrings_first_sentence(capsys):
    _, out, _ = run(capsys)
    docstring = importlib.import_module("milestones.m02_kv_cache").__doc__
    first = docstring.split("\n")[0].removeprefix("m02_kv_cache:").strip().rstrip(".")
    assert re.search(rf"^m02_kv_cache\s+{re.escape(first)}$", out, re.M)
    assert "``" not in out


def test_list_gains_come_from_the_committed_results(capsys):
    _, out, _ = run(capsys)
    m04_skewed = median_ratio(repeats_of("m03_skewed", "output_tokens_per_s"),
                              repeats_of("m04_skewed", "output_tokens_per_s"))
    assert f"skewed (one request in 8 long): {m04_skewed:.2f}x (" in out
    m03_offline = statistics.median(repeats_of("m03_offline", "output_tokens_per_s"))
    m03_offline /= metric("m02_offline-n16", "output_tokens_per_s")
    assert re.search(rf"offline: {re.escape(gains.format_ratio(m03_offline))} (\(\S+\) )?m02's output tok/s", out)
    assert "m02 ran 16 of its 128 requests" in out
    itl = metric("m02_single", "itl_mean_s") / metric("m01_single", "itl_mean_s")  # m02 is slower at 512 tokens
    assert f"single (512-token prompt): {itl:.2f}x higher mean inter-token latency than m01" in out
    block_m01 = out.split("m01_naive_loop", 1)[1].split("m02_kv_cache", 1)[0]
    assert "the baseline" in block_m01


# Declared figures whose result files a planned GPU call has not written yet: milestone -> the stems of the files
# it will write. Their lines say "pending H200 run" and name one of them; every other line is measured.
AWAITING_H200: dict[str, tuple[str, ...]] = {
    "m14_tensor_parallel": ("m14_single+tp1-8b", "m14_single+tp2-8b", "m14_nanovllm+tp1-8b", "m14_nanovllm+tp2-8b",
                            "m14_nanovllm+tp1", "m14_nanovllm+tp2"),  # gpu_tp.sh two-gpus(-8b): two H200s
}


def test_every_milestone_after_the_first_has_a_measured_figure(capsys):
    _, out, _ = run(capsys)
    for name in PACKAGES[1:]:
        block = block_of(out, name)
        pending = [line for line in block.splitlines() if "pending H200 run" in line]
        assert "H200" in block and len(pending) < len(block.splitlines()) - 3, block  # one measured line at least
        if name not in AWAITING_H200:
            assert not pending, block
            continue
        assert pending, f"{name} is measured now: take it out of AWAITING_H200"
        assert all(any(f"{stem}.json" in line for stem in AWAITING_H200[name]) for line in pending), pending


def test_a_ratio_below_one_is_said_to_be_lower_and_interleaved_repeats_are_named(capsys):
    _, out, _ = run(capsys)
    block = block_of(out, "m04_continuous_batching")
    ratio = median_ratio(repeats_of("m03_offline", "output_tokens_per_s"), repeats_of("m04_offline", "output_tokens_per_s"))
    lower = r", i\.e\. lower" if ratio < 1 else ""  # a slower milestone must not read as a gain
    assert re.search(rf"offline: {ratio:.2f}x \(\S+\) m03's output tok/s{lower} .*medians of 3 interleaved runs",
                     block)
    skewed = next(line for line in block.splitlines() if "skewed" in line)
    assert "medians of 3 interleaved runs" in skewed
    m05 = block_of(out, "m05_paged_blocks")  # m05 on nanovllm is slower than m04 (committed), and says so
    nanovllm = next(line for line in m05.splitlines() if "nanovllm" in line)
    assert "m04's output tok/s, i.e. lower" in nanovllm and "medians of 3 interleaved runs" in nanovllm


def test_later_milestones_name_what_they_are_compared_with(capsys):
    _, out, _ = run(capsys)
    m05 = median_ratio(repeats_of("m04_memory-bound", "running_mean_while_waiting"),
                       repeats_of("m05_memory-bound", "running_mean_while_waiting"))
    assert f"memory-bound: {m05:.2f}x m04's requests in the batch while others wait" in block_of(out, "m05_paged_blocks")
    wall = median_ratio(repeats_of("m06_prefix-large", "wall_time_s"), repeats_of("m05_prefix-large", "wall_time_s"))
    assert f"prefix-large: {wall:.2f}x" in block_of(out, "m06_prefix_cache")
    itl_max = median_ratio(repeats_of("m07_chunked-long+mnbt-512", "itl_max_s", "decoder"),
                           repeats_of("m07_chunked-long+mnbt-none", "itl_max_s", "decoder"))
    m07 = block_of(out, "m07_chunked_prefill")
    assert f"{gains.format_ratio(itl_max)} (" in m07 and "than m07 with no budget" in m07
    online = result("online/online_m09_offline")
    m09 = block_of(out, "m09_server")
    assert f"{online['burst_vs_offline']:.2f}x the output tok/s of the same engine's offline generate" in m09
    assert "not a gain over m08" in m09
    versus_hf = median_ratio(repeats_of("hf-compiled_offline", "output_tokens_per_s"),
                             repeats_of("m10_offline", "output_tokens_per_s"))
    assert f"offline: {versus_hf:.2f}x " in block_of(out, "m10_cuda_graphs") and "hf-compiled's" in out


def test_the_engine_core_and_overlap_figures_are_their_files(capsys):
    _, out, _ = run(capsys)
    m11 = block_of(out, "m11_engine_core")
    online = result("online/online_m11_nanovllm")
    assert f"{online['burst_vs_offline']:.2f}x the output tok/s of the same engine's offline generate" in m11
    assert "of m10's server" in m11 and "single runs of different calls" in m11
    m12 = block_of(out, "m12_async_scheduling")
    ratio = median_ratio(repeats_of("m10_nanovllm+beside-m12", "output_tokens_per_s"),
                         repeats_of("m12_nanovllm", "output_tokens_per_s"))
    assert f"nanovllm (exact, 256 requests): {gains.format_ratio(ratio)} (" in m12 and "m10's output tok/s" in m12
    wall = result("step_probe_m11")["step_wall_ms"] / result("step_probe_m12")["step_wall_ms"]
    assert f"{gains.format_ratio(wall)} lower wall time per decode step than m11" in m12


def test_a_figure_of_one_comparison_stays_pending_until_one_comparison_holds_both(tmp_path):
    def write(name: str, comparison: str, commit: str, values: list[float]) -> None:
        (tmp_path / f"{name}.json").write_text(json.dumps({
            "status": "ok", "milestone": name, "env": {"git_commit": commit}, "comparison": {"id": comparison},
            "metrics": {"output_tokens_per_s": values[0]},
            "repeats": [{"metrics": {"output_tokens_per_s": v}} for v in values]}))

    figure = gains.Figure("m10_x", "m12_x", "output_tokens_per_s", "output tok/s", "x", same_comparison=True)
    write("m10_x", "x:m09/m10", "aaaaaaa", [100.0, 110.0, 90.0])  # an earlier call's comparison
    assert "m12_x.json not committed" in gains.compare(figure, tmp_path).reason
    write("m12_x", "x:m10/m12", "bbbbbbb", [150.0, 160.0, 140.0])
    pending = gains.compare(figure, tmp_path)
    assert isinstance(pending, gains.Pending) and "not the interleaved repeats of one comparison" in pending.reason
    write("m10_x", "x:m10/m12", "bbbbbbb", [100.0, 110.0, 90.0])
    gain = gains.compare(figure, tmp_path)
    assert gain.ratio == pytest.approx(1.5) and gain.provenance == "medians of 3 interleaved runs"


def test_a_milestone_without_committed_results_is_pending_never_a_number(tmp_path):
    figure = gains.Figure("m04_skewed", "m05_skewed", "output_tokens_per_s", "output tok/s", "skewed")
    pending = gains.compare(figure, results_dir=tmp_path)
    assert isinstance(pending, gains.Pending) and pending.reason.startswith("pending H200 run")
    (tmp_path / "m04_skewed.json").write_text(json.dumps({"status": "ok", "metrics": {"output_tokens_per_s": 5.0}}))
    (tmp_path / "m05_skewed.json").write_text(json.dumps({"status": "error", "metrics": None}))
    failed = gains.compare(figure, results_dir=tmp_path)
    assert isinstance(failed, gains.Pending) and "m05_skewed.json: error" in failed.reason
    undeclared = gains.gains_of("m99", results_dir=tmp_path)
    assert [type(p) for p in undeclared] == [gains.Pending] and "pending H200 run" in undeclared[0].reason


def test_interleaved_repeats_give_the_median_ratio_with_its_range(tmp_path):
    """A, B, A, B, A, B in one call: ratios pair by pair (2.0, 1.909.., 2.111..) -> median 2.00, range 1.91-2.11."""
    old = [100.0, 110.0, 90.0]
    new = [200.0, 210.0, 190.0]
    for name, values in (("old", old), ("new", new)):
        result = {"status": "ok", "milestone": name, "metrics": {"output_tokens_per_s": values[0]},
                  "repeats": [{"metrics": {"output_tokens_per_s": v}} for v in values]}
        (tmp_path / f"{name}.json").write_text(json.dumps(result))
    gain = gains.compare(gains.Figure("old", "new", "output_tokens_per_s", "output tok/s", "offline"), tmp_path)
    assert gain.ratio == pytest.approx(2.0)
    assert (gain.ratio_low, gain.ratio_high) == pytest.approx((190 / 90, 210 / 110)[::-1])
    line = gains.describe(gain, "m03")
    assert line.startswith("offline: 2.00x (1.91-2.11x) m03's output tok/s (200 vs 100 tok/s)")
    assert line.endswith("medians of 3 interleaved runs")


def test_a_spread_without_repeats_is_shown_as_a_range(tmp_path):
    (tmp_path / "a.json").write_text(json.dumps({"metrics": {"ttft_p50_s": 0.4}}))
    (tmp_path / "b.json").write_text(json.dumps({"metrics": {"ttft_p50_s": 0.1},
                                                 "spread": {"ttft_p50_s": {"min": 0.08, "max": 0.2}}}))
    gain = gains.compare(gains.Figure("a", "b", "ttft_p50_s", "TTFT p50", "prefix", lower_is_better=True), tmp_path)
    assert gain.ratio == pytest.approx(4.0) and (gain.ratio_low, gain.ratio_high) == pytest.approx((2.0, 5.0))
    assert gains.describe(gain, "m05").startswith("prefix: 4.00x (2.00-5.00x) lower TTFT p50 than m05 (100 vs 400 ms)")


def test_every_declared_figure_names_results_of_the_milestone_and_its_predecessor():
    """A figure compares the milestone with the one before it, or says what it compares with instead."""
    awaiting = {name.split("_")[0]: stems for name, stems in AWAITING_H200.items()}
    for key, figures in gains.FIGURES.items():
        for figure in figures:
            result = gains.load_result(figure.new)
            if result is None:
                assert figure.new in awaiting.get(key, ()), f"{figure.new}.json is not committed"
                continue
            assert result["milestone"].split("_")[0] == key, figure
            if figure.versus is None:
                assert figure.new.split("_")[0] == key, figure
                assert figure.old.split("_")[0] == f"m{int(key[1:]) - 1:02d}", figure


def test_repeats_of_two_comparisons_of_one_call_are_not_paired(tmp_path):
    """A two-GPU call runs two comparisons side by side: same commit, same number of repeats, yet not interleaved."""
    for name, comparison, values in (("old", "nanovllm:m03/m04", [100.0, 110.0, 90.0]),
                                     ("new", "nanovllm:m04/m05", [200.0, 210.0, 190.0])):
        (tmp_path / f"{name}.json").write_text(json.dumps({
            "status": "ok", "milestone": name, "env": {"git_commit": "abc1234"}, "comparison": {"id": comparison},
            "metrics": {"output_tokens_per_s": values[0]},
            "repeats": [{"metrics": {"output_tokens_per_s": v}} for v in values]}))
    gain = gains.compare(gains.Figure("old", "new", "output_tokens_per_s", "output tok/s", "offline"), tmp_path)
    assert gain.ratio == pytest.approx(2.0)  # median over median, not pair by pair
    assert (gain.ratio_low, gain.ratio_high) == pytest.approx((190 / 110, 210 / 90))
    assert "interleaved" not in gain.provenance


def test_provenance_says_single_runs_of_an_earlier_call_or_different_calls(tmp_path):
    (tmp_path / "calls").mkdir()
    (tmp_path / "calls" / "a.json").write_text(json.dumps({"suite": {"started": "2026-11-30T05:00:00+00:00"}}))

    def write(name: str, commit: str, stamp: str, value: float) -> None:
        (tmp_path / f"{name}.json").write_text(json.dumps({
            "milestone": name, "env": {"git_commit": commit, "timestamp": stamp},
            "metrics": {"output_tokens_per_s": value}}))

    figure = gains.Figure("old", "new", "output_tokens_per_s", "output tok/s", "skewed")
    write("old", "abc1234", "2026-11-30T02:00:00+00:00", 100.0)
    write("new", "abc1234", "2026-11-30T02:01:00+00:00", 150.0)
    line = gains.describe(gains.compare(figure, tmp_path), "m03")
    assert line == "skewed: 1.50x m03's output tok/s (150 vs 100 tok/s), single runs of an earlier call (abc1234)"
    write("new", "def5678", "2026-11-30T06:00:00+00:00", 50.0)  # slower, and from another call
    line = gains.describe(gains.compare(figure, tmp_path), "m03")
    assert line == ("skewed: 0.50x m03's output tok/s, i.e. lower (50.0 vs 100 tok/s), "
                    "single runs of different calls (abc1234, def5678)")


def test_an_online_result_compares_a_rate_with_the_offline_reference(tmp_path):
    (tmp_path / "online").mkdir()
    online = {"status": "ok", "milestone": "m09_server", "offline_reference": {"output_tokens_per_s": 400.0},
              "runs": [{"rate": 8.0, "summary": {"output_tokens_per_s": 100.0}},
                       {"rate": "inf", "summary": {"output_tokens_per_s": 300.0}}]}
    (tmp_path / "online" / "o.json").write_text(json.dumps(online))
    figure = gains.Figure("online/o", "online/o", "output_tokens_per_s", "output tok/s", "burst", section="runs:inf",
                          old_section="offline_reference", versus="the same engine offline", note="not a gain")
    gain = gains.compare(figure, tmp_path)
    assert gain.ratio == pytest.approx(0.75)
    assert gains.describe(gain, "m08") == ("burst: 0.75x the output tok/s of the same engine offline, i.e. lower "
                                           "(300 vs 400 tok/s), single runs; not a gain")
    assert isinstance(gains.compare(dataclasses.replace(figure, section="runs:16"), tmp_path), gains.Pending)


def test_colour_only_on_a_terminal_and_never_with_no_color(capsys, monkeypatch):
    class Terminal:
        def isatty(self) -> bool:
            return True

    monkeypatch.delenv("NO_COLOR", raising=False)
    assert wants_colour("auto", Terminal()) and not wants_colour("auto", sys.stdout)
    monkeypatch.setenv("NO_COLOR", "1")
    assert not wants_colour("auto", Terminal()) and wants_colour("always", sys.stdout)
    assert not wants_colour("never", Terminal())
    assert Style(False)("x", "red") == "x" and Style(True)("x", "red") == "\033[31mx\033[0m"
    _, plain, _ = run(capsys)
    _, coloured, _ = run(capsys, "--color", "always")
    assert not ANSI.search(plain) and ANSI.search(coloured) and ANSI.sub("", coloured) == plain


def test_the_command_line_runs_as_a_module():
    done = subprocess.run([sys.executable, "-m", "milestones"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert all(name in done.stdout for name in PACKAGES) and not ANSI.search(done.stdout)


# ---- the diff -------------------------------------------------------------------------------------------------

def own_methods(cls: type) -> list[str]:
    """Methods written in ``cls``'s body (a @dataclass adds generated ones to __dict__; those are not written)."""
    source = inspect.getsource(cls)
    node = ast.parse(source).body[0]
    return [n.name for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]


@pytest.mark.parametrize("old, new", PAIRS)
def test_diff_of_adjacent_milestones_names_what_the_new_one_adds(capsys, old, new):
    status, out, err = run(capsys, "diff", old, new, "--width", "120")
    assert status == 0, err
    assert not ANSI.search(out)
    package = REPO / "milestones" / new
    for path in package.rglob("*.py"):
        if path.name != "__init__.py":
            assert path.relative_to(REPO).as_posix() in out, f"new module {path.name} not shown"
    engine = importlib.import_module(f"milestones.{new}").LLMEngine
    for name in own_methods(engine):
        assert name in out, f"{new}'s LLMEngine.{name} not shown"
    before = importlib.import_module(f"milestones.{old}").EngineConfig
    after = importlib.import_module(f"milestones.{new}").EngineConfig
    for field in set(f.name for f in dataclasses.fields(after)) - set(f.name for f in dataclasses.fields(before)):
        assert re.search(rf"^  {field}: ", out, re.M), f"new config field {field} not shown"


KNOWN = {  # facts of the existing milestones: new classes, {override: the method it replaces}, new config fields
    "m02_kv_cache": ({"KVCache", "CachedAttention"},
                     {"LLMEngine.generate_one": "m01_naive_loop.engine.LLMEngine.generate_one"}, set()),
    "m03_static_batching": ({"PaddedBatch"},
                            {"LLMEngine.run": "m01_naive_loop.engine.LLMEngine.run",
                             "PaddedCachedAttention.__call__": "m02_kv_cache.kv_cache.CachedAttention.__call__"},
                            {"max_num_seqs"}),
    "m04_continuous_batching": ({"Scheduler", "KVPool", "ContiguousAllocator"},
                                {"LLMEngine.run": "m03_static_batching.engine.LLMEngine.run"},
                                {"kv_cache_tokens"}),
}


@pytest.mark.parametrize("new", sorted(KNOWN))
def test_diff_shows_known_classes_overrides_and_fields(capsys, new):
    classes, overrides, fields = KNOWN[new]
    _, out, _ = run(capsys, "diff", new, "--width", "120")  # one name: against its predecessor
    section = out.split("New classes", 1)[1].split("Extended classes", 1)[0]
    assert all(re.search(rf"^  {c}\b", section, re.M) for c in classes), section
    for override, replaced in overrides.items():
        assert f"-- {override}  replaces {replaced}" in out
    config = out.split("New config fields", 1)[1].split("Overridden methods", 1)[0]
    assert {f for f in re.findall(r"^  (\w+): ", config, re.M)} == fields


def test_an_override_is_shown_beside_the_method_it_replaces_found_through_the_mro(capsys):
    from milestones.m01_naive_loop.engine import LLMEngine as M01
    from milestones.m02_kv_cache.engine import LLMEngine as M02

    _, out, _ = run(capsys, "diff", "m01", "m02", "--layout", "side-by-side", "--width", "150")
    old_line = inspect.getsourcelines(M01.generate_one)[1]
    new_line = inspect.getsourcelines(M02.generate_one)[1]
    assert f"milestones/m01_naive_loop/engine.py:{old_line}" in out
    assert f"milestones/m02_kv_cache/engine.py:{new_line}" in out
    rows = [line for line in out.splitlines() if " | " in line]
    assert any(line.startswith("- ") and "+ " in line.split(" | ", 1)[1] for line in rows)  # changed, side by side
    assert any("KVCache.for_model" in line.split(" | ", 1)[1] for line in rows)
    assert all(len(line) <= 150 for line in out.splitlines() if " | " in line)
    # m04's make_request extends m01's: m02 and m03 never overrode it, so the MRO reaches back to m01.
    _, out, _ = run(capsys, "diff", "m03", "m04")
    assert "-- LLMEngine.make_request  extends m01_naive_loop.engine.LLMEngine.make_request" in out


def test_an_override_that_calls_super_marks_only_what_it_adds(capsys):
    """m07's config __post_init__ runs m05's through super(): none of m05's lines may read as removed."""
    _, out, _ = run(capsys, "diff", "m06", "m07", "--layout", "side-by-side", "--width", "160")
    section = out.split("-- EngineConfig.__post_init__", 1)[1].split("\n-- ", 1)[0]
    assert "calls it through super(), so all of it still runs" in section
    rows = [line for line in section.splitlines() if " | " in line]
    assert not any(line.startswith("-") for line in rows)
    assert any("+     if self.max_num_batched_tokens is None:" in line for line in rows)
    _, out, _ = run(capsys, "diff", "m06", "m07", "--unified")
    assert not any(line.startswith("-  ") for line in out.split("EngineConfig.__post_init__", 1)[1].split("---")[0]
                   .splitlines())


def test_class_attributes_and_retired_methods_are_shown(capsys):
    _, out, _ = run(capsys, "diff", "m06", "m07", "--width", "120")
    assert re.search(r"^    sets         .*scheduler_class = Scheduler", out, re.M)
    _, out, _ = run(capsys, "diff", "m04", "m05", "--width", "200")
    assert re.search(r"^    retires      region_starts, prefill, decode, record_kv_usage$", out, re.M)
    assert "-- LLMEngine.prefill  retires m04_continuous_batching.engine.LLMEngine.prefill: m05 runs" in out
    _, out, _ = run(capsys, "diff", "m04", "m05", "--stat")
    assert "(4 of them retired)" in out


def test_stacked_layout_puts_the_replaced_method_first(capsys):
    _, out, _ = run(capsys, "diff", "m01", "m02", "--layout", "stacked")
    old_at, new_at = out.index("replaces: milestones/m01_naive_loop/engine.py"), out.index("with: milestones/m02")
    assert old_at < new_at
    assert "-     \"\"\"m01: every step runs the model" in out[old_at:new_at]
    assert "+     cache = KVCache.for_model" in out[new_at:]


def test_non_adjacent_diff_reaches_the_last_milestone(capsys):
    first, last = PACKAGES[-4], PACKAGES[-1]
    status, out, _ = run(capsys, "diff", first, last, "--stat")
    assert status == 0
    for old, new in PAIRS[-3:]:
        assert re.search(rf"^{new} \(after {old.split('_')[0]}\): \d+ files", out, re.M), new
    assert out.rstrip().splitlines()[-1].startswith("3 steps: ")
    status, out, _ = run(capsys, "diff", first, last, "--width", "120")  # the full view too, every step in order
    assert status == 0 and out.startswith(f"{first} -> {last}: 3 steps")
    heads = [out.index(f"== {new} (after {old})") for old, new in PAIRS[-3:]]
    assert heads == sorted(heads)


def test_non_adjacent_diff_walks_every_step_in_order(capsys):
    status, out, _ = run(capsys, "diff", "m01_naive_loop", "m04")
    assert status == 0
    assert out.startswith("m01_naive_loop -> m04_continuous_batching: 3 steps")
    heads = [out.index(f"== {new} (after {old})") for old, new in PAIRS[:3]]
    assert heads == sorted(heads)
    assert "KVCache" in out and "PaddedBatch" in out and "Scheduler" in out


def test_short_and_full_names_give_the_same_diff(capsys):
    assert run(capsys, "diff", "m02", "m03")[1] == run(capsys, "diff", "m02_kv_cache", "M03_STATIC_BATCHING")[1]


@pytest.mark.parametrize("argv, words", [
    (["diff", "m01", "m99"], "unknown milestone 'm99': choose from " + ", ".join(PACKAGES)),
    (["diff", "kv_cache", "m02"], "unknown milestone 'kv_cache'"),
    (["diff", "m04", "m02"], "m04_continuous_batching comes after m02_kv_cache: put the earlier one first"),
    (["diff", "m03", "m03_static_batching"], "nothing to compare: both names are m03_static_batching"),
    (["diff", "m01"], "m01_naive_loop is the first milestone"),
])
def test_bad_names_are_refused_in_one_line_with_status_2(capsys, argv, words):
    status, out, err = run(capsys, *argv)
    assert status == 2 and out == ""
    assert err.count("\n") == 1 and words in err


def test_unknown_name_exits_2_from_the_real_command():
    done = subprocess.run([sys.executable, "-m", "milestones", "diff", "m00", "m02"], cwd=REPO, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.strip().count("\n") == 0 and "m01_naive_loop" in done.stderr


def test_stat_counts_the_lines_of_every_new_file(capsys):
    status, out, _ = run(capsys, "diff", "m01", "m04", "--stat")
    assert status == 0 and len(out.splitlines()) < 50
    for new in PACKAGES[1:4]:
        for path in (REPO / "milestones" / new).glob("*.py"):
            num_lines = len(path.read_text().splitlines())
            assert re.search(rf"^  {re.escape(path.name)}\s+\|\s+{num_lines} \++$", out, re.M), path
    assert re.search(r"^m02_kv_cache \(after m01\): \d+ files, .*methods 1 overridden", out, re.M)
    assert out.rstrip().splitlines()[-1].startswith("3 steps: ")


def test_unified_diff_has_the_files_own_line_numbers(capsys):
    from milestones.m01_naive_loop.engine import LLMEngine as M01
    from milestones.m02_kv_cache.engine import LLMEngine as M02

    status, out, _ = run(capsys, "diff", "m01", "m02", "--unified")
    assert status == 0
    lines = out.splitlines()
    assert "--- a/milestones/m01_naive_loop/engine.py" in lines and "+++ b/milestones/m02_kv_cache/engine.py" in lines
    old_source, old_start = inspect.getsourcelines(M01.generate_one)
    new_source, new_start = inspect.getsourcelines(M02.generate_one)
    assert f"@@ -{old_start},{len(old_source)} +{new_start},{len(new_source)} @@ LLMEngine.generate_one" in lines
    removed = [line[1:] for line in lines if line.startswith("-") and not line.startswith("---")]
    added = [line[1:] for line in lines if line.startswith("+") and not line.startswith("+++")]
    assert set(removed) <= {line.rstrip("\n") for line in old_source}
    assert set(added) <= {line.rstrip("\n") for line in new_source} and any("KVCache.for_model" in a for a in added)


def test_stat_and_unified_exclude_each_other(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["diff", "m01", "m02", "--stat", "--unified"])
    assert exit_info.value.code == 2


def test_a_milestone_that_does_not_import_is_named_in_one_line(capsys, monkeypatch):
    from milestones._course import changes

    real = importlib.import_module

    def half_written(name: str, *args):
        if name == "milestones.m02_kv_cache.kv_cache":
            raise SyntaxError("invalid syntax (kv_cache.py, line 12)")
        return real(name, *args)

    monkeypatch.setattr(changes.importlib, "import_module", half_written)
    status, out, err = run(capsys, "diff", "m01", "m02")
    assert status == 1 and out == ""
    assert err == ("python -m milestones: error: cannot import milestones.m02_kv_cache.kv_cache: "
                   "SyntaxError: invalid syntax (kv_cache.py, line 12)\n")


def test_the_course_package_is_no_milestone_to_the_benchmarks():
    from benchmarks.runners import resolve_milestone_module

    with pytest.raises(ValueError) as error:
        resolve_milestone_module("_course")
    assert "_course" not in str(error.value).split("choose from", 1)[1]
    assert resolve_milestone_module("m02") == "milestones.m02_kv_cache"


def test_the_architecture_pages_override_table_is_the_code():
    """docs/architecture.md lists, per engine, what it overrides, retires and sets: exactly what diff reads."""
    from milestones._course.catalog import REPO_ROOT, discover
    from milestones._course.changes import step_changes

    text = (REPO_ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    table = text.split("### What each engine overrides", 1)[1].split("\n\n", 3)[2]
    documented = {}
    for row in table.splitlines()[2:]:
        key, *cells = [cell.strip() for cell in row.strip("|").split("|")]
        documented[key] = [set(re.findall(r"`([^`]+)`", cell)) for cell in cells]
    milestones_found = discover()
    for old, new in zip(milestones_found, milestones_found[1:]):
        engine = next(c for c in step_changes(old, new).extended_classes if c.name == "LLMEngine")
        in_code = [{o.method for o in engine.overrides if o.retired is None}, {o.method for o in engine.retired},
                   {a for a in engine.attributes if not a.startswith("milestone =")}]
        assert documented.get(new.key) == in_code, f"docs/architecture.md's row for {new.key}"


def test_the_readme_quotes_the_ratio_the_course_prints():
    """One source for a figure: the README's m06 prompt-token ratio is the one `python -m milestones` prints."""
    from milestones._course.catalog import REPO_ROOT

    [tokens] = [g for g in gains.gains_of("m06") if "prompt tokens" in gains.describe(g, "m05")]
    printed = gains.describe(tokens, "m05").split(" fewer", 1)[0].split(": ", 1)[1]
    assert printed == "16.5x"
    assert f"{printed} fewer prompt tokens computed" in (REPO_ROOT / "README.md").read_text(encoding="utf-8")


def test_every_page_that_quotes_diff_stat_quotes_it_right():
    """A milestone page's "`--stat`: N files, +L lines" is what `python -m milestones diff PREV NEW --stat` says."""
    from milestones._course.catalog import REPO_ROOT, discover
    from milestones._course.changes import step_changes

    found = discover()
    quoted = 0
    for old, new in zip(found, found[1:]):
        if new.doc_page is None:
            continue
        text = " ".join((REPO_ROOT / new.doc_page).read_text(encoding="utf-8").split())
        for files, lines in re.findall(r"`--stat`(?::| counts) (\d+) files, \+([\d,]+) lines", text):
            changes = step_changes(old, new)
            assert (int(files), int(lines.replace(",", ""))) == (len(changes.file_lines),
                                                                sum(changes.file_lines.values())), new.doc_page
            quoted += 1
    assert quoted >= 5
