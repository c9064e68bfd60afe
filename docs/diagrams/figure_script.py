"""What every mechanism figure script shares: write the PNG reproducibly, and a ``--out`` command line.

    from figure_script import run_figure_script, save_png   # the script's own folder is on sys.path
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path


def save_png(fig, out: Path) -> None:
    """Write ``fig`` to ``out`` (folders made), with no software stamp, so a redraw of the same figure is the same file."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110, metadata={"Software": None})
    plt.close(fig)


def run_figure_script(draw: Callable[[Path], None], description: str, default_out: Path,
                      argv: list[str] | None = None) -> None:
    """``python docs/diagrams/<script>.py [--out PATH]``: draw into ``default_out`` or wherever ``--out`` says."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--out", type=Path, default=default_out, help="where to write the PNG")
    draw(parser.parse_args(argv).out)
