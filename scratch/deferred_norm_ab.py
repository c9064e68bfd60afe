"""One GPU call: the step with the deferred norm (m13 now: 1 / rms left to the readers, 8 programs a row) against
the exact norm that writes the integers in one program a row (``int4-exact-norm``), beside bf16; 5 interleaved
rounds at 1, 2 and 4 rows (quant_step, no second gate); then the step's kernels under the profiler at 1 and 2 rows.

    python3 scratch/deferred_norm_ab.py OUT_DIR
"""

from __future__ import annotations

import sys

import benchmarks.quant_step as quant_step
from milestones.m13_quantization import epilogue_layers


def main(out_dir: str) -> None:
    plain_build = quant_step.build

    def build(mode, args):
        try:  # the graphs record the launches they capture
            epilogue_layers.DEFERRED_NORM_MAX_ROWS = 0 if mode == "int4-exact-norm" else 4
            return plain_build(mode, args)
        finally:
            epilogue_layers.DEFERRED_NORM_MAX_ROWS = 4

    quant_step.MODES.setdefault("int4-exact-norm", {"quantization": "int4"})
    quant_step.build = build
    quant_step.main(["--modes", "bf16,int4,int4-exact-norm", "--batches", "1,2,4", "--rounds", "5",
                     "--out", f"{out_dir}/m13_step_times_deferred_norm.json"])


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else ".")
