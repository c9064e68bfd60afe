"""One GPU call: the step with the split GEMVs whose slices the next kernel adds (q/k/v, o_proj, down_proj) cut
into more slices, K split until 2 (the table), 3, 4 or 6 programs an SM, beside bf16; 5 interleaved rounds at 1, 2
and 4 rows (quant_step, no second gate). Then the step's kernels under the profiler at 1 and 2 rows.

    python3 scratch/slices_grid_ab.py OUT_DIR
"""

from __future__ import annotations

import sys
from dataclasses import replace
from functools import partial

import benchmarks.quant_step as quant_step
from milestones.m13_quantization import epilogue_layers
from milestones.m13_quantization.epilogue_matmuls import quantized_matmul_slices
from milestones.m13_quantization.launch_config import LAUNCH_TABLE

PER_SM = {"int4": 2, "int4-p3": 3, "int4-p4": 4, "int4-p6": 6}


def main(out_dir: str) -> None:
    plain_build = quant_step.build
    table = LAUNCH_TABLE["int4"]["gemv"]

    def build(mode, args):
        try:  # the graphs record the launches they capture
            config = replace(table, min_programs_per_sm=PER_SM.get(mode, 2))
            epilogue_layers.quantized_matmul_slices = partial(quantized_matmul_slices, config=config)
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
