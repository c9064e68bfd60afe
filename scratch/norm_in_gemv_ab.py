"""One GPU call: the deferred norm done in o_proj's and down_proj's GEMV finish (m13's default since call 130,
NORM_IN_GEMV_MAX_ROWS) against its own launch, and the same finish on GEMVs of 128 rows a program (a group a
program: one program of each slice counts on a counter, not two): the batch-1 and -2 step at 512 keys, 7
interleaved rounds, then at 4,096 keys, 5 rounds (quant_step).

    python3 scratch/norm_in_gemv_ab.py OUT_DIR             # the step, interleaved
    python3 scratch/norm_in_gemv_ab.py OUT_DIR --profile   # its kernels at one row (step_kernels.py), both ways
"""

from __future__ import annotations

import sys
from dataclasses import replace

import benchmarks.quant_step as quant_step
from milestones.m13_quantization import epilogue_layers, epilogue_matmuls
from milestones.m13_quantization.launch_config import LAUNCH_TABLE, SLICED_GEMV_PROGRAMS_PER_SM


def main(out_dir: str) -> None:
    plain_build = quant_step.build
    default = epilogue_layers.NORM_IN_GEMV_MAX_ROWS
    in_gemv = epilogue_matmuls.quantized_deferred_add_norm
    wide = replace(LAUNCH_TABLE["int4"]["gemv"], block_n=128, min_programs_per_sm=SLICED_GEMV_PROGRAMS_PER_SM)

    def build(mode, args):
        try:  # the graphs record the launches they capture
            epilogue_layers.NORM_IN_GEMV_MAX_ROWS = 0 if mode == "int4-norm-launch" else default
            if mode == "int4-norm-gemv-128":
                epilogue_layers.quantized_deferred_add_norm = lambda *a, **kw: in_gemv(*a, config=wide, **kw)
            return plain_build(mode, args)
        finally:
            epilogue_layers.NORM_IN_GEMV_MAX_ROWS = default
            epilogue_layers.quantized_deferred_add_norm = in_gemv

    for mode in ("int4-norm-launch", "int4-norm-gemv-128"):
        quant_step.MODES.setdefault(mode, quant_step.MODES["int4"])
    quant_step.build = build
    if "--profile" in sys.argv:
        from scratch import step_kernels
        step_kernels.main(f"{out_dir}/m13_step_kernels_norm_in_gemv.json", [1], ["int4-norm-launch", "int4"])
        return
    quant_step.main(["--modes", "bf16,int4,int4-norm-launch,int4-norm-gemv-128", "--batches", "1,2", "--rounds", "7",
                     "--out", f"{out_dir}/m13_step_times_norm_in_gemv_default.json"])
    quant_step.main(["--modes", "bf16,int4,int4-norm-launch", "--batches", "1,2", "--context", "4096", "--rounds", "5",
                     "--out", f"{out_dir}/m13_step_times_norm_in_gemv_4096.json"])


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else ".")
