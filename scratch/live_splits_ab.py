"""One GPU call: m13's decode over only the splits that hold keys (``live_splits.py``), with m13's combine launch
after it (``int4-skip``) or the combine in its last program (``int4-last``), against m13 as it is (``int4``: m08's
decode over every split, then the combine launch), beside bf16; 5 interleaved rounds at 1, 2 and 4 rows
(quant_step, no second gate; its steps have 512 keys a sequence in graphs captured for 40,960).

    python3 scratch/live_splits_ab.py OUT_DIR
"""

from __future__ import annotations

import sys

import benchmarks.quant_step as quant_step
from milestones.m13_quantization import live_splits

FLAGS = {"int4-skip": (True, False), "int4-last": (True, True)}  # SKIP_EMPTY_SPLITS, LAST_SPLIT_COMBINES


def main(out_dir: str) -> None:
    plain_build = quant_step.build

    def build(mode, args):
        try:  # the graphs record the launches they capture
            live_splits.SKIP_EMPTY_SPLITS, live_splits.LAST_SPLIT_COMBINES = FLAGS.get(mode, (False, False))
            return plain_build(mode, args)
        finally:
            live_splits.SKIP_EMPTY_SPLITS, live_splits.LAST_SPLIT_COMBINES = False, False

    for mode in FLAGS:
        quant_step.MODES.setdefault(mode, {"quantization": "int4"})
    quant_step.build = build
    quant_step.main(["--modes", "bf16,int4,int4-skip,int4-last", "--batches", "1,2,4", "--rounds", "5",
                     "--out", f"{out_dir}/m13_step_times_live_splits.json"])


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else ".")
