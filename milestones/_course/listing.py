"""``python -m milestones``: one block per milestone, in order: its idea, demo, doc page and H200 gain.

    m02_kv_cache  prefill once, then decode one token per step against a contiguous per-request K/V cache
      demo  python -m milestones.m02_kv_cache
      doc   docs/m02-kv-cache.md
      H200  single (512-token prompt): 1.03x higher mean inter-token latency than m01 (10.8 ms vs 10.5 ms)
            long-sweep at a 32,768-token prompt: 21x lower mean inter-token latency than m01 (...)

Every figure comes from ``gains.py``'s table and the committed JSON; what is not measured says so.
"""

from __future__ import annotations

from pathlib import Path
from typing import TextIO

from .catalog import Milestone
from .gains import RESULTS_DIR, Figure, Gain, describe, gains_of
from .style import Style


def gain_lines(milestone: Milestone, previous: Milestone | None, style: Style,
               results_dir: Path = RESULTS_DIR) -> list[str]:
    """The H200 lines of one milestone: its figures, "the baseline" for the first, or why none."""
    if previous is None:
        return [style("the baseline", "dim")]
    lines = []
    for gain in gains_of(milestone.key, results_dir):
        if isinstance(gain, Gain):
            sources = style(f"  [{sources_of(gain.figure)}]", "dim")
            lines.append(style(describe(gain, previous.key), "green" if gain.ratio >= 1 else "yellow") + sources)
        else:
            workload = f"{gain.figure.workload}: " if gain.figure else ""
            lines.append(workload + style(gain.reason, "yellow"))
    return lines or [style("no gain declared in milestones/_course/gains.py", "yellow")]


def sources_of(figure: Figure) -> str:
    """``m03_skewed -> m04_skewed``, or ``file: section -> section`` when both sides come from one file."""
    if figure.old == figure.new:
        return f"{figure.new}: {' -> '.join(figure.sections)}"
    return f"{figure.old} -> {figure.new}"


def print_listing(milestones: list[Milestone], style: Style, out: TextIO,
                  results_dir: Path = RESULTS_DIR) -> None:
    """Print every milestone's block, then how to see what one changes."""
    width = max(len(m.name) for m in milestones)
    print(style("nanoserve milestones", "bold") + " (H200 gains from benchmarks/results/h200/*.json)\n", file=out)
    previous = None
    for milestone in milestones:
        print(f"{style(milestone.name.ljust(width), 'bold', 'cyan')}  {milestone.idea}", file=out)
        print(f"  demo  {milestone.demo_command or style('none yet (no __main__.py)', 'yellow')}", file=out)
        print(f"  doc   {milestone.doc_page or style('not written yet', 'yellow')}", file=out)
        for i, line in enumerate(gain_lines(milestone, previous, style, results_dir)):
            print(f"  {'H200' if i == 0 else '    '}  {line}", file=out)
        print(file=out)
        previous = milestone
    if len(milestones) > 1:
        print(f"What a milestone changes: python -m milestones diff {milestones[-2].key} {milestones[-1].key} "
              "(--stat, --unified; docs/course-tools.md)", file=out)
