"""One GPU call: gate_up's GEMV with SiLU * up reading each program's rows as two runs (a run of gate rows and the
run of up rows beside it: ``gemv_epilogues.pair_rows``) against lanes 2i and 2i + 1 as a gate row and its up row
(``int4-lanes``, m13 before: ``SILU_PAIR_HALVES`` False while the graphs are captured); 5 interleaved rounds at 1,
2 and 4 rows, 512 keys (quant_step). Call 111 found the interleaved lanes 1.5 µs a launch slower than contiguous
rows (``gemv_vs_stream.py`` with ``ADJACENT_ROWS=1``).

    python3 scratch/silu_halves_ab.py OUT_DIR
"""

from __future__ import annotations

import sys

import benchmarks.quant_step as quant_step
import milestones.m13_quantization.gemv_epilogues as gemv_epilogues


def main(out_dir: str) -> None:
    plain_build = quant_step.build

    def build(mode, args):
        try:  # the graphs record the launches they capture
            gemv_epilogues.SILU_PAIR_HALVES = mode != "int4-lanes"
            return plain_build(mode, args)
        finally:
            gemv_epilogues.SILU_PAIR_HALVES = True

    quant_step.MODES.setdefault("int4-lanes", quant_step.MODES["int4"])
    quant_step.build = build
    quant_step.main(["--modes", "bf16,int4-lanes,int4", "--batches", "1,2,4", "--rounds", "5",
                     "--out", f"{out_dir}/m13_step_times_silu_halves.json"])


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else ".")
