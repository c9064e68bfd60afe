"""Draws docs/images/m12_timeline.png: three steady-state decode steps as the host and the GPU see them, taking
turns (m11: m10's step, in its engine core) and overlapped (m12).

    .venv/bin/python docs/diagrams/m12_timeline.py                   # writes docs/images/m12_timeline.png
    .venv/bin/python docs/diagrams/m12_timeline.py --out /tmp/t.png  # anywhere else

The time axis is to scale and its lengths are measured: each step's wall time and GPU-busy time come from
``benchmarks/results/h200/step_probe_m11.json`` and ``step_probe_m12.json`` (the exact ``nanovllm`` workload, steps
300-380), read here, so the figure changes when those files do. Taking turns, the host's share of a step is the
wall time minus the GPU-busy time; overlapped, how the host splits its work inside a step is a schematic. Only
matplotlib is needed; nothing of nanoserve is imported.
"""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # no display needed
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import FancyArrowPatch, Rectangle  # noqa: E402
from figure_script import run_figure_script, save_png  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
DEFAULT_OUT = REPO / "docs" / "images" / "m12_timeline.png"
PROBES = REPO / "benchmarks" / "results" / "h200"
HOST, WAIT, DEVICE, IDLE = "#f28e2b", "#fbe3c9", "#4e79a7", "#eeeeee"
STEPS = 3


def probe(milestone: str) -> tuple[float, float, float]:
    """(wall ms, GPU-busy ms, mean running requests) of a steady-state decode step in the step probe."""
    result = json.loads((PROBES / f"step_probe_{milestone}.json").read_text())
    return result["step_wall_ms"], result["gpu_busy_ms"], result["mean_running"]


def lane(ax, y: float, label: str, end: float) -> None:
    ax.text(-0.4, y + 0.3, label, ha="right", va="center", fontsize=9.5)
    ax.add_patch(Rectangle((0, y), end, 0.6, facecolor=IDLE, edgecolor="none"))


def bar(ax, x: float, y: float, width: float, color: str, text: str = "", size: float = 7.5,
        text_color: str = "white", hatch: str | None = None) -> None:
    ax.add_patch(Rectangle((x, y), width, 0.6, facecolor=color, edgecolor="white", lw=0.8, hatch=hatch))
    if text:
        ax.text(x + width / 2, y + 0.3, text, ha="center", va="center", fontsize=size, color=text_color)


def draw_turns(ax, y: float, wall: float, busy: float, end: float) -> None:
    """m11: plan and launch, wait for the GPU, read the ids and make outputs; the GPU runs only in between."""
    host = wall - busy
    before, after = host * 0.6, host * 0.4  # schematic split of the host's share: before the launch, after the read
    lane(ax, y + 1, "host", end)
    lane(ax, y, "GPU", end)
    for n in range(STEPS):
        t = n * wall
        bar(ax, t, y + 1, before, HOST, f"launch {n + 1}", 6.5)
        bar(ax, t + before, y + 1, busy, WAIT, f"waits for step {n + 1}'s ids", 7, "#8a5a1f")
        bar(ax, t + before + busy, y + 1, after, HOST, "read", 6.5)
        bar(ax, t + before, y, busy, DEVICE, f"step {n + 1}")


def draw_overlapped(ax, y: float, wall: float, busy: float, end: float) -> None:
    """m12: step N+1 is planned and queued while step N runs; step N's ids are read while step N+1 runs."""
    gap = wall - busy  # the GPU's idle time per step that the overlap did not hide
    lane(ax, y + 1, "host", end)
    lane(ax, y, "GPU", end)
    bar(ax, 0, y + 1, gap, HOST)  # the first step's plan and launch, before any GPU work
    read, plan = busy * 0.3, busy * 0.35  # schematic: read step n-1's ids and make outputs, then plan step n+1
    for n in range(STEPS):
        start = gap + n * wall
        bar(ax, start, y, busy, DEVICE, f"step {n + 1}")
        t = start
        if n:  # the host wakes when step n ends (step n+1 is already queued): it reads step n's ids first
            t = start - gap
            bar(ax, t, y + 1, read, HOST, f"read {n}", 6.5)
            t += read
        bar(ax, t, y + 1, plan, HOST, f"plan, launch {n + 2}", 6.5)
        bar(ax, t + plan, y + 1, start + busy - t - plan, WAIT, f"waits for {n + 1}", 6.5, "#8a5a1f")
        if n == STEPS - 1:
            bar(ax, start + busy, y + 1, read, HOST, f"read {n + 1}", 6.5)
        if n < STEPS - 1:
            ax.add_patch(FancyArrowPatch((start + busy - 0.6, y + 0.3), (start + wall + 0.6, y + 0.3),
                                         arrowstyle="-|>", mutation_scale=9, color="#222222", lw=1.0,
                                         connectionstyle="arc3,rad=-0.6"))


def draw(out: Path) -> None:
    (m11_wall, m11_busy, m11_running), (m12_wall, m12_busy, m12_running) = probe("m11"), probe("m12")
    end = STEPS * m11_wall + 0.5
    fig, ax = plt.subplots(figsize=(12.5, 5.6))
    ax.set_xlim(-4.5, end + 0.2)
    ax.set_ylim(-1.5, 7.6)
    ax.axis("off")

    ax.text(-4.4, 7.1, f"taking turns (m11, m10's step): {m11_wall:.2f} ms a step, the GPU busy {m11_busy:.2f} ms "
            f"of it ({m11_wall / m11_busy:.2f}x)", fontsize=11, weight="bold")
    draw_turns(ax, 4.9, m11_wall, m11_busy, end)
    ax.text(-4.4, 3.4, f"overlapped (m12): {m12_wall:.2f} ms a step, the GPU busy {m12_busy:.2f} ms of it "
            f"({m12_wall / m12_busy:.2f}x)", fontsize=11, weight="bold")
    draw_overlapped(ax, 1.2, m12_wall, m12_busy, end)
    ax.text(STEPS * m12_wall + 0.5, 0.95, "arrows: step N's sampled ids feed step N+1\non the GPU (never through "
            "the host)", fontsize=8, color="#333333", va="top")

    for ms in range(0, int(end) + 1, 5):  # the time axis, in milliseconds
        ax.plot([ms, ms], [-0.15, -0.05], color="#555555", lw=0.8)
        ax.text(ms, -0.3, f"{ms} ms", ha="center", va="top", fontsize=7.5, color="#555555")
    ax.plot([0, end], [-0.1, -0.1], color="#555555", lw=0.8)

    handles = [Rectangle((0, 0), 1, 1, color=c) for c in (HOST, WAIT, DEVICE, IDLE)]
    ax.legend(handles, ["host work (schedule, pack, launch the replay, append tokens, outputs)",
                        "the host blocked on the sampled ids", "the GPU running a step", "idle"],
              loc="lower center", ncol=4, fontsize=8, frameon=False, bbox_to_anchor=(0.5, -0.1))
    ax.text(end, -1.45, f"to scale; step lengths measured (step_probe_m11.json, step_probe_m12.json: the exact "
            f"nanovllm, steps 300-380, {m11_running:.0f} and {m12_running:.0f} requests running); how the host "
            "splits its work inside a step is a schematic", ha="right", fontsize=7.5, color="#777777")
    save_png(fig, out)


def main(argv: list[str] | None = None) -> None:
    run_figure_script(draw, __doc__.split("\n\n")[0], DEFAULT_OUT, argv)


if __name__ == "__main__":
    main()
