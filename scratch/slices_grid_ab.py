"""One GPU call: the step with the split GEMVs whose slices the next kernel adds (q/k/v, o_proj, down_proj) cut
into more or fewer slices: K split until 1, 2 (the table), 3, 4 or 6 programs an SM, the same for all three or
per matmul; beside bf16; 5 interleaved rounds at 1, 2 and 4 rows (quant_step, no second gate). Call 2 of this
session ran 2-6 at 294652d (with a profile of the step's kernels, scratch/step_kernels.py); call 3 runs 1-3 and a
mixture.

    python3 scratch/slices_grid_ab.py OUT_DIR
"""

from __future__ import annotations

import sys
from dataclasses import replace

import benchmarks.quant_step as quant_step
from milestones.m13_quantization import epilogue_layers
from milestones.m13_quantization.epilogue_matmuls import quantized_matmul_slices
from milestones.m13_quantization.launch_config import LAUNCH_TABLE

# programs an SM for (q/k/v, o_proj, down_proj)
PER_SM = {"int4": (2, 2, 2), "int4-p1": (1, 1, 1), "int4-p3": (3, 3, 3), "int4-q3-o1-d1": (3, 1, 1)}


def main(out_dir: str) -> None:
    plain_build = quant_step.build
    table = LAUNCH_TABLE["int4"]["gemv"]

    def build(mode, args):
        qkv, o, down = PER_SM.get(mode, (2, 2, 2))

        def sliced(x, qweight, scales, method, **kw):
            n, k = qweight.shape[0] * 16, x.shape[1]  # tiles of 16 rows
            per_sm = down if k > 4096 else o if n == 4096 else qkv
            return quantized_matmul_slices(x, qweight, scales, method,
                                           config=replace(table, min_programs_per_sm=per_sm), **kw)

        try:  # the graphs record the launches they capture
            epilogue_layers.quantized_matmul_slices = sliced
            return plain_build(mode, args)
        finally:
            epilogue_layers.quantized_matmul_slices = quantized_matmul_slices

    for mode in PER_SM:
        quant_step.MODES.setdefault(mode, {"quantization": "int4"})
    quant_step.build = build
    quant_step.main(["--modes", "bf16," + ",".join(PER_SM), "--batches", "1,2,4", "--rounds", "5",
                     "--out", f"{out_dir}/m13_step_times_slices_grid.json"])


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else ".")
