"""The milestone pages keep their shape and their word: the sections docs/README.md promises, in order; every
exercise with a folded answer, and the workshop's exercises on their pages; the H200 sections led by a takeaway
and a chart, with the calls and commits folded away; and statements that code or a result file can hold.

(tests/test_docs.py checks links and runs the documented commands; tests/exercises/ checks the build-it tasks.)
"""

from __future__ import annotations

import contextlib
import importlib
import io
import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import env_with_checkout

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
RESULTS = REPO / "benchmarks" / "results" / "h200"
PAGES = {f"m{n:02d}": next(DOCS.glob(f"m{n:02d}-*.md")) for n in range(1, 15)}
WORKSHOP_PAGES = {name: page for name, page in PAGES.items() if name <= "m10"}  # the workshop's plans end at m10
ORDER = ["The idea", "A picture", "What changed", "What the code adds", "Run it and measure it", "Cost analysis",
         "In vLLM", "Build it", "Exercises", "Measured on the H200"]
DETAILS = re.compile(r"<details>.*?</details>", re.S)
FENCED = re.compile(r"^ {0,3}```.*?^ {0,3}```", re.S | re.M)


def sections(page: Path) -> dict[str, str]:
    """'## ' heading -> its body, in page order (headings inside fenced code do not count)."""
    text = FENCED.sub(lambda m: re.sub(r"(?m)^## ", "#​# ", m.group(0)), page.read_text(encoding="utf-8"))
    parts = re.split(r"(?m)^## (.+)$", text)
    return {parts[i].strip(): parts[i + 1] for i in range(1, len(parts), 2)}


# ---- the shape of a page -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", PAGES)
def test_every_page_has_its_sections_in_order(name):
    headings = list(sections(PAGES[name]))
    expected = [h for h in ORDER if h in headings]
    assert headings == expected, f"{PAGES[name].name}: sections out of order"
    required = {"The idea", "A picture", "What changed", "Run it and measure it", "Cost analysis", "Exercises",
                "Measured on the H200"}
    if name >= "m04":
        required.add("In vLLM")
    if name in ("m05", "m06", "m07"):
        required.add("Build it")
    assert required <= set(headings), f"{PAGES[name].name} lacks {sorted(required - set(headings))}"


@pytest.mark.parametrize("name", [n for n in PAGES if n >= "m04"])
def test_in_vllm_names_the_differences_and_two_readings(name):
    box = sections(PAGES[name])["In vLLM"]
    assert "**The real counterpart.**" in box and "**Where nanoserve differs.**" in box and "**Read next.**" in box
    readings = box.split("**Read next.**", 1)[1]
    assert len(re.findall(r"\]\(https?://", readings)) >= 2, f"{name}: fewer than two readings linked"


@pytest.mark.parametrize("name", PAGES)
def test_every_exercise_has_a_folded_answer(name):
    exercises = sections(PAGES[name])["Exercises"]
    numbered = re.findall(r"(?m)^\d+\. \*\*", exercises)
    answers = re.findall(r"<details><summary>Answer</summary>", exercises)
    assert numbered and len(answers) == len(numbered), f"{name}: {len(numbered)} exercises, {len(answers)} answers"


@pytest.mark.parametrize("name", PAGES)
def test_the_h200_section_leads_with_three_lines_and_a_chart_and_folds_its_provenance(name):
    measured = sections(PAGES[name])["Measured on the H200"]
    blocks = [b.strip() for b in measured.strip().split("\n\n") if b.strip()]
    assert blocks[0].startswith("**In three lines.**"), f"{name}: no takeaway first"
    assert len(blocks[0].splitlines()) <= 5, f"{name}: the takeaway is longer than a few lines"
    assert blocks[1].startswith("![") and "](images/" in blocks[1], f"{name}: no chart right after the takeaway"
    visible = DETAILS.sub("", measured)
    assert not re.search(r"\bcalls? [A-G]\b|\[[A-G]\]", visible), f"{name}: a call letter outside <details>"
    assert not re.search(r"`[0-9a-f]{7}`|commit [0-9a-f]{7}", visible), f"{name}: a commit outside <details>"
    assert not re.search(r"\bissue\b", visible, re.I), f"{name}: an issue target outside <details>"
    for file in re.findall(r"`(?:benchmarks/results/h200/)?(\w[\w.+-]*\.json)`", visible):
        if "{" not in file and "*" not in file:
            assert list(RESULTS.rglob(file)), f"{name}: names {file}, which is not in benchmarks/results/h200/"


def test_the_workshop_exercises_are_on_their_pages_and_link_to_them():
    workshop = (DOCS / "workshop.md").read_text(encoding="utf-8")
    for name, page in WORKSHOP_PAGES.items():
        match = re.search(rf"(?ms)^### {name} — .*?(?=^### |^## )", workshop)
        assert match, f"workshop.md has no exercise for {name}"
        block = match.group(0)
        assert f"]({page.name}#exercises)" in block, f"the workshop's {name} exercise does not link to its page"
        title = re.search(r"\*\*(.+?)\*\*", block).group(1).rstrip(".")
        assert f"**{title}.**" in sections(page)["Exercises"], f"{page.name} lacks the workshop's {title!r}"
        assert "workshop.md#" in sections(page)["Exercises"], f"{page.name} does not link to the workshop"


# ---- statements the code holds ---------------------------------------------------------------------------------------

def test_m04s_picture_is_what_m04s_scheduler_does():
    """The continuous rows of m04's picture: a step that admits runs only the newcomers' prefill."""
    from milestones.m01_naive_loop.request import Request
    from milestones.m01_naive_loop.sampling_params import SamplingParams
    from milestones.m04_continuous_batching.kv_allocator import ContiguousAllocator
    from milestones.m04_continuous_batching.scheduler import Scheduler

    picture = sections(PAGES["m04"])["A picture"]
    seats = [line.split()[:9] for line in picture.split("continuous (m04)", 1)[1].splitlines()[:3]]
    wants = {"A": 3, "B": 4, "C": 6, "D": 5, "E": 5, "F": 5}
    scheduler = Scheduler(3, ContiguousAllocator(10_000))
    requests = {k: Request(k, [1, 2], SamplingParams(max_tokens=n, ignore_eos=True), frozenset())
                for k, n in wants.items()}
    for request in requests.values():
        scheduler.add(request)
    cells: dict[str, list[str]] = {k: [] for k in wants}
    for _ in range(9):
        out = scheduler.schedule()
        prefilled, decoded = {r.request_id for r in out.prefills}, {r.request_id for r in out.decodes}
        for request in out.prefills + out.decodes:
            request.append_token(7)
        running = {r.request_id for r in scheduler.running}
        for k in wants:
            cells[k].append(k.lower() if k in prefilled else k if k in decoded else "-" if k in running else ".")
        scheduler.remove_finished()
    for seat in seats:
        letters = {c.upper() for c in seat if c.isalpha()}
        expected = ["".join(c for k in sorted(letters) if (c := cells[k][step]) != ".") or "." for step in range(9)]
        assert seat == expected, f"m04's picture shows {seat}, the scheduler does {expected}"


def test_architecture_hop_6_counts_the_lookups_cached_prefix_makes():
    from milestones.m06_prefix_cache.block_manager import PrefixCachingBlockManager

    class CountingDict(dict):
        lookups = 0

        def get(self, key, default=None):
            CountingDict.lookups += 1
            return super().get(key, default)

    manager = PrefixCachingBlockManager(num_blocks=200, block_size=16)
    system = list(range(1, 1025))  # 1,024 shared tokens: 64 full blocks, registered by an earlier request
    manager.allocate("earlier", system + [5000])
    manager.cache_full_blocks("earlier", system + [5000], 1025)
    manager.cached_blocks = CountingDict(manager.cached_blocks)
    found = manager.cached_prefix(system + list(range(6000, 6076)))  # a 1,100-token prompt
    assert (len(found), CountingDict.lookups) == (64, 65)
    text = (DOCS / "architecture.md").read_text(encoding="utf-8")
    assert "(1,100 - 1) // 16 = 68 candidates it looks up 65, finds the first\n  64" in text


def test_the_launch_overhead_figures_on_m02s_page_are_the_jsons():
    forwards = json.loads((RESULTS / "launch_overhead.json").read_text())["forwards"]
    page = PAGES["m02"].read_text(encoding="utf-8")
    for name, label in (("m01_full_sequence_544", "m01, the whole 544-token sequence"),
                        ("m02_decode_1x544", "m02, one token against a 544-token cache"),
                        ("m03_decode_64x400", "m03, 64 rows of one token, 400 cached each")):
        row = f"| {label} | {forwards[name]['eager_ms']:.1f} ms | {forwards[name]['graph_ms']:.1f} ms |"
        assert row in page, f"m02's page should read: {row}"


def test_the_step_times_on_m10s_page_are_the_jsons():
    rows = {r["batch"]: r for r in json.loads((RESULTS / "m10_step_times.json").read_text())["steps"]["rows"]}
    page = PAGES["m10"].read_text(encoding="utf-8")
    for batch in (1, 64, 256):
        eager, replayed = rows[batch]["eager step (ms)"], rows[batch]["graph replay (ms)"]
        assert f"| {batch} | {eager:.1f} ms | {replayed:.2f} ms |" in page, f"m10's step table, batch {batch}"
    eager, replayed = rows[1]["eager step (ms)"], rows[1]["graph replay (ms)"]
    assert f"{replayed:.2f} ms against {eager:.1f} ms eager" in sections(PAGES["m10"])["Measured on the H200"]


# ---- the workshop's smaller demos ------------------------------------------------------------------------------------

def demo_defaults(module: str) -> dict[str, str]:
    """flag -> its default, from the demo's own ``--help`` (its ``main``, in this process: a fresh interpreter per
    demo spent minutes importing torch fourteen times)."""
    help_text = io.StringIO()
    with contextlib.redirect_stdout(help_text), pytest.raises(SystemExit) as exited:
        importlib.import_module(module + ".__main__").main(["--help"])
    assert exited.value.code in (0, None), help_text.getvalue()
    text = " ".join(help_text.getvalue().split())
    return dict(re.findall(r"(--[a-z-]+) [A-Z_]+ (?:(?! --[a-z-]+ [A-Z_]+ ).)*?\(default: ([^)]*)\)", text))


@pytest.mark.slow
def test_the_workshops_smaller_demos_use_real_flags_that_shrink_them():
    workshop = (DOCS / "workshop.md").read_text(encoding="utf-8")
    table = workshop.split("### Smaller demos for slow laptops", 1)[1]
    rows = re.findall(r"^\| (m\d\d) \| `([^`]+)` \|", table, re.M)
    assert [name for name, _ in rows] == list(WORKSHOP_PAGES), "one row per milestone, in order"
    for name, flags in rows:
        module = "milestones." + PAGES[name].stem.replace("-", "_")
        defaults = demo_defaults(module)
        words = flags.split()
        for flag, value in zip(words[::2], words[1::2]):
            assert flag in defaults, f"{name}: {flag} is not a flag of {module} (or shows no default)"
            if re.fullmatch(r"[\d,]+", value) and re.fullmatch(r"[\d,]+", defaults[flag]):
                assert max(map(int, value.split(","))) <= max(map(int, defaults[flag].split(","))), \
                    f"{name}: {flag} {value} does not shrink the default {defaults[flag]}"


# ---- the answers' code runs ------------------------------------------------------------------------------------------

def exercise_snippets() -> list[tuple[str, str]]:
    """(page, code) of every ```python block in the Exercises sections of the milestone pages."""
    found = []
    for name, page in PAGES.items():
        for block in re.findall(r"(?ms)^( {0,3})```python\n(.*?)^\1```", sections(page)["Exercises"]):
            found.append((name, textwrap.dedent("\n".join(line[len(block[0]):] for line in
                                                          block[1].splitlines()))))
    return found


@pytest.mark.slow
def test_the_code_in_the_pages_exercises_runs(tokenizer_cache, tmp_path):
    snippets = exercise_snippets()
    assert len(snippets) >= 4, "the pages lost their exercise code?"
    script = tmp_path / "snippets.py"
    script.write_text("\n".join(f"print('== {name} {i}', flush=True)\n"
                                f"exec(compile({code!r}, 'docs {name} exercise {i}', 'exec'), {{'__name__': '__main__'}})"
                                for i, (name, code) in enumerate(snippets)))
    done = subprocess.run([sys.executable, str(script)], cwd=REPO, env=env_with_checkout(OMP_NUM_THREADS="1"),
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-1500:] + done.stderr[-3000:]


# ---- the pictures drawn from source ------------------------------------------------------------------------------------

@pytest.mark.parametrize("script, image", [("m05_block_table.py", "m05_block_table.png"),
                                           ("m10_timeline.py", "m10_timeline.png"),
                                           ("m12_timeline.py", "m12_timeline.png")])
def test_the_mechanism_figures_are_drawn_from_their_scripts(script, image, tmp_path):
    out = tmp_path / image
    done = subprocess.run([sys.executable, str(DOCS / "diagrams" / script), "--out", str(out)], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (DOCS / "images" / image).is_file()
    assert sum(f"images/{image}" in page.read_text(encoding="utf-8") for page in PAGES.values()) == 1
