"""One GPU call: the step with split GEMVs' slices added by the kernels after them (m13 now) against the GEMVs
adding them (``int4-finish``) and against the norms adding o_proj's and down_proj's only (``int4-norm-slices``),
beside bf16; 5 interleaved rounds at 1, 2 and 4 rows (quant_step, no second gate).

    python3 scratch/sliced_sums_ab.py OUT_DIR
"""

from __future__ import annotations

import sys

import benchmarks.quant_step as quant_step
from milestones.m13_quantization import epilogue_layers

ROWS = {"int4": (4, 4), "int4-finish": (0, 0), "int4-norm-slices": (4, 0)}  # (norm's, rope's) rows


def main(out_dir: str) -> None:
    plain_build = quant_step.build

    def build(mode, args):
        try:  # the graphs record the launches they capture
            norm, rope = ROWS.get(mode, (4, 4))
            epilogue_layers.NORM_ADDS_SLICES_MAX_ROWS, epilogue_layers.ROPE_ADDS_SLICES_MAX_ROWS = norm, rope
            return plain_build(mode, args)
        finally:
            epilogue_layers.NORM_ADDS_SLICES_MAX_ROWS, epilogue_layers.ROPE_ADDS_SLICES_MAX_ROWS = 4, 4

    for mode in ROWS:
        quant_step.MODES.setdefault(mode, {"quantization": "int4"})
    quant_step.build = build
    quant_step.main(["--modes", "bf16,int4,int4-finish,int4-norm-slices", "--batches", "1,2,4", "--rounds", "5",
                     "--out", f"{out_dir}/m13_step_times_sliced_sums.json"])


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else ".")
