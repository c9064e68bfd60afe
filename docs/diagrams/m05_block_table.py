"""Draws docs/images/m05_block_table.png: m05's K/V pool cut into blocks, three requests' block tables, and the slot
one token's K/V goes to.

    .venv/bin/python docs/diagrams/m05_block_table.py                   # writes docs/images/m05_block_table.png
    .venv/bin/python docs/diagrams/m05_block_table.py --out /tmp/b.png  # anywhere else

The picture is the example of docs/m05-paged-blocks.md, as data (``BLOCK_SIZE``, ``TABLES``, ``TOKENS``): change
it there and here together. Only matplotlib is needed; nothing of nanoserve is imported.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # no display needed
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import FancyArrowPatch, Rectangle  # noqa: E402
from figure_script import run_figure_script, save_png  # noqa: E402

DEFAULT_OUT = Path(__file__).resolve().parents[1] / "images" / "m05_block_table.png"
BLOCK_SIZE = 4
NUM_BLOCKS = 10
TABLES = {"A": [7, 2, 5], "B": [0, 4], "C": [1]}  # request -> its block table, in token order
TOKENS = {"A": 10, "B": 5, "C": 3}  # tokens each request holds now
COLORS = {"A": "#4e79a7", "B": "#f28e2b", "C": "#59a14f"}
FREE = [3, 6, 8, 9]  # the free list, front first
NEXT = ("B", 5)  # the token whose slot the picture computes: B's 6th token, position 5


def owner_of(block: int) -> tuple[str, int] | None:
    """(request, index in its table) of a block, or None if it is free."""
    for request, table in TABLES.items():
        if block in table:
            return request, table.index(block)
    return None


def draw(out: Path) -> None:
    fig, ax = plt.subplots(figsize=(12, 5.6))
    ax.set_xlim(-0.5, NUM_BLOCKS * 1.2 + 0.2)
    ax.set_ylim(-0.4, 6.4)
    ax.axis("off")
    cell = 1.0 / BLOCK_SIZE

    # The pool: NUM_BLOCKS blocks of BLOCK_SIZE slots, each slot filled if its request holds a token there.
    pool_y = 4.6
    ax.text(-0.4, pool_y + 1.25, f"K/V pool: {NUM_BLOCKS} blocks x {BLOCK_SIZE} slots (one layer shown; "
            "every layer has the same layout)", fontsize=11, weight="bold")
    block_x = {b: b * 1.2 for b in range(NUM_BLOCKS)}
    for block in range(NUM_BLOCKS):
        x = block_x[block]
        owner = owner_of(block)
        for slot in range(BLOCK_SIZE):
            used = owner is not None and owner[1] * BLOCK_SIZE + slot < TOKENS[owner[0]]
            color = COLORS[owner[0]] if used else ("#dddddd" if owner is None else "white")
            ax.add_patch(Rectangle((x + slot * cell, pool_y), cell, 0.8, facecolor=color, edgecolor="black", lw=0.6))
            ax.text(x + (slot + 0.5) * cell, pool_y - 0.12, str(block * BLOCK_SIZE + slot), ha="center", va="top",
                    fontsize=6.5, color="#555555")
        ax.text(x + 0.5, pool_y + 0.95, f"block {block}", ha="center", fontsize=8.5)
        if owner is None:
            ax.text(x + 0.5, pool_y + 0.4, "free", ha="center", va="center", fontsize=8, color="#666666")
    ax.text(NUM_BLOCKS * 1.2 - 0.1, pool_y - 0.45, "slot numbers", ha="right", fontsize=7, color="#555555")

    # The block tables, side by side, with an arrow from each entry up to its block.
    ax.text(-0.4, 3.1, "block tables (one per request, in token order)", fontsize=11, weight="bold")
    for column, (request, table) in enumerate(TABLES.items()):
        x0, y = 0.2 + column * 4.2, 2.0
        ax.text(x0, y + 0.75, f"{request}: {TOKENS[request]} tokens", fontsize=9.5, color=COLORS[request],
                weight="bold")
        for i, block in enumerate(table):
            x = x0 + i * 0.8
            ax.add_patch(Rectangle((x, y), 0.6, 0.5, facecolor="white", edgecolor=COLORS[request], lw=1.5))
            ax.text(x + 0.3, y + 0.25, str(block), ha="center", va="center", fontsize=10)
            first, last = i * BLOCK_SIZE, min(TOKENS[request], (i + 1) * BLOCK_SIZE) - 1
            ax.text(x + 0.3, y - 0.12, f"tokens {first}-{last}" if last > first else f"token {first}",
                    ha="center", va="top", fontsize=6.5, color="#555555")
            ax.add_patch(FancyArrowPatch((x + 0.3, y + 0.5), (block_x[block] + 0.5, pool_y - 0.35),
                                         arrowstyle="-|>", mutation_scale=9, color=COLORS[request], lw=0.8,
                                         alpha=0.75))
    ax.text(-0.4, 1.0, "filled slot: a token's K/V    white slot: held by a request, not written yet (its only "
            "waste)    grey: a free block", fontsize=8.5, color="#333333")

    request, position = NEXT
    table = TABLES[request]
    block = table[position // BLOCK_SIZE]
    slot = block * BLOCK_SIZE + position % BLOCK_SIZE
    ax.text(-0.4, 0.45, f"token p of a request lives in slot  table[p // {BLOCK_SIZE}] * {BLOCK_SIZE} + p % {BLOCK_SIZE}",
            fontsize=10, family="monospace")
    ax.text(-0.4, -0.05, f"{request}'s token p = {position}:  table[{position // BLOCK_SIZE}] * {BLOCK_SIZE} + "
            f"{position % BLOCK_SIZE} = {block} * {BLOCK_SIZE} + {position % BLOCK_SIZE} = slot {slot}     "
            f"free list (front first): {', '.join(map(str, FREE))}", fontsize=10, family="monospace")
    ax.add_patch(Rectangle((block_x[block] + (position % BLOCK_SIZE) * cell, pool_y), cell, 0.8, fill=False,
                           edgecolor="red", lw=2.2))
    ax.text(block_x[block] + (position % BLOCK_SIZE + 0.5) * cell, pool_y - 0.38, f"{request}'s next token",
            ha="center", va="top", fontsize=8, color="red")
    save_png(fig, out)


def main(argv: list[str] | None = None) -> None:
    run_figure_script(draw, __doc__.split("\n\n")[0], DEFAULT_OUT, argv)


if __name__ == "__main__":
    main()
