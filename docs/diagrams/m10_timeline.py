"""Draws docs/images/m10_timeline.png: one decode step launched eagerly against replayed from a CUDA graph, as two
lanes each (the CPU issuing work, the GPU running it).

    .venv/bin/python docs/diagrams/m10_timeline.py                   # writes docs/images/m10_timeline.png
    .venv/bin/python docs/diagrams/m10_timeline.py --out /tmp/t.png  # anywhere else

The lanes are a schematic (a few kernels stand for the step's ~540; widths are not to scale). The two totals
printed on it are measured: the batch-1 row of ``benchmarks/results/h200/m10_step_times.json``, read here, so the
figure changes when that file does. Only matplotlib is needed; nothing of nanoserve is imported.
"""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # no display needed
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import Rectangle  # noqa: E402
from figure_script import run_figure_script, save_png  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
DEFAULT_OUT = REPO / "docs" / "images" / "m10_timeline.png"
STEP_TIMES = REPO / "benchmarks" / "results" / "h200" / "m10_step_times.json"
HOST, DEVICE, IDLE, COPY = "#f28e2b", "#4e79a7", "#eeeeee", "#76b7b2"
KERNELS = ["norm", "qkv", "norm", "RoPE", "store", "attn", "o_proj", "add", "norm", "gate_up", "silu*up", "down",
           "add"]  # one layer's launches, in order (m10's packed layer plus its attention), standing for all 28


def batch_one_times() -> tuple[float, float]:
    """(eager ms, replayed ms) of the batch-1 decode step in the probe call."""
    rows = json.loads(STEP_TIMES.read_text())["steps"]["rows"]
    row = next(r for r in rows if r["batch"] == 1)
    return row["eager step (ms)"], row["graph replay (ms)"]


def lane(ax, y: float, label: str) -> None:
    ax.text(-0.3, y + 0.3, label, ha="right", va="center", fontsize=9.5)
    ax.add_patch(Rectangle((0, y), 100, 0.6, facecolor=IDLE, edgecolor="none"))


def bar(ax, x: float, y: float, width: float, color: str, text: str = "", size: float = 7) -> None:
    ax.add_patch(Rectangle((x, y), width, 0.6, facecolor=color, edgecolor="white", lw=0.8))
    if text:
        ax.text(x + width / 2, y + 0.3, text, ha="center", va="center", fontsize=size, color="white")


def draw(out: Path) -> None:
    eager_ms, replay_ms = batch_one_times()
    fig, ax = plt.subplots(figsize=(12.5, 5.2))
    ax.set_xlim(-14, 101)
    ax.set_ylim(-1.1, 7.4)
    ax.axis("off")

    # Eager: the CPU spends a slice of Python, dispatcher and launcher work per kernel; the GPU runs each kernel
    # in a fraction of that, then waits for the next launch.
    ax.text(-13.5, 7.0, f"eager: m10's decode forward launched from Python, kernel by kernel: {eager_ms:.1f} ms at batch 1",
            fontsize=11, weight="bold")
    lane(ax, 5.6, "CPU")
    lane(ax, 4.6, "GPU")
    host, gpu = 6.6, 1.6
    for i, name in enumerate(KERNELS):
        x = 1 + i * (host + 0.4)
        bar(ax, x, 5.6, host, HOST, name)
        bar(ax, x + host - 0.4, 4.6, gpu, DEVICE)
    ax.text(50, 4.25, "the GPU idles between kernels: each waits for Python to launch it (x 28 layers, ~540 kernels)",
            ha="center", va="top", fontsize=8.5, color="#333333")

    # Replayed: the CPU copies the step's inputs into the static buffers and issues one replay; the GPU runs the
    # recorded kernels back to back.
    ax.text(-13.5, 2.9, f"the same forward replayed from its CUDA graph: {replay_ms:.2f} ms at batch 1",
            fontsize=11, weight="bold")
    lane(ax, 1.5, "CPU")
    lane(ax, 0.5, "GPU")
    bar(ax, 1, 1.5, 9, HOST, "fill pinned\nhost buffers", 6.5)
    bar(ax, 10.4, 1.5, 3.4, HOST, "replay", 6.5)
    bar(ax, 58, 1.5, 9, HOST, "read the\nsampled ids", 6.5)
    bar(ax, 10.4, 0.5, 3.0, COPY, "H2D", 6.5)
    for i, name in enumerate(KERNELS):
        bar(ax, 13.6 + i * 3.3, 0.5, 3.2, DEVICE)
    ax.text(36, 0.15, "the same kernels, back to back (one launch for all of them)", ha="center", va="top",
            fontsize=8.5, color="#333333")
    ax.text(38, 1.8, "the CPU waits (m10 does not overlap steps)", ha="center", va="center", fontsize=8,
            color="#555555")

    handles = [Rectangle((0, 0), 1, 1, color=c) for c in (HOST, DEVICE, COPY, IDLE)]
    ax.legend(handles, ["host work (Python, PyTorch's dispatcher, Triton's launcher, the driver)", "a GPU kernel",
                        "copy to the GPU", "idle"], loc="lower center", ncol=4, fontsize=8, frameon=False,
              bbox_to_anchor=(0.5, -0.08))
    ax.text(100, -0.9, "schematic: a few kernels stand for a step's ~540, widths not to scale; the two "
            "totals are measured (m10_step_times.json, probe call, median of 20)",
            ha="right", fontsize=7.5, color="#777777")
    save_png(fig, out)


def main(argv: list[str] | None = None) -> None:
    run_figure_script(draw, __doc__.split("\n\n")[0], DEFAULT_OUT, argv)


if __name__ == "__main__":
    main()
