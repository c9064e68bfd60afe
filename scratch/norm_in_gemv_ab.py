"""One GPU call: the deferred norm done in o_proj's and down_proj's GEMV finish (NORM_IN_GEMV_MAX_ROWS,
gemv_epilogues.deferred_norm_when_last) against its own launch: the batch-1, -2 and -4 step at 512 keys (quant_step,
5 interleaved rounds).

    python3 scratch/norm_in_gemv_ab.py OUT_DIR             # the step, interleaved
    python3 scratch/norm_in_gemv_ab.py OUT_DIR --profile   # its kernels at one row (step_kernels.py), both ways
"""

from __future__ import annotations

import sys

import benchmarks.quant_step as quant_step
from milestones.m13_quantization import epilogue_layers


def main(out_dir: str) -> None:
    plain_build = quant_step.build
    default = epilogue_layers.NORM_IN_GEMV_MAX_ROWS

    def build(mode, args):
        try:  # the graphs record the launches they capture
            epilogue_layers.NORM_IN_GEMV_MAX_ROWS = {"int4-norm-in-gemv": 4, "int4-norm-launch": 0}.get(mode, default)
            return plain_build(mode, args)
        finally:
            epilogue_layers.NORM_IN_GEMV_MAX_ROWS = default

    for mode in ("int4-norm-in-gemv", "int4-norm-launch"):
        quant_step.MODES.setdefault(mode, quant_step.MODES["int4"])
    quant_step.build = build
    if "--profile" in sys.argv:
        from scratch import step_kernels
        step_kernels.main(f"{out_dir}/m13_step_kernels_norm_in_gemv.json", [1], ["int4-norm-launch",
                                                                                 "int4-norm-in-gemv"])
        return
    quant_step.main(["--modes", "bf16,int4-norm-launch,int4-norm-in-gemv", "--batches", "1,2,4", "--rounds", "5",
                     "--out", f"{out_dir}/m13_step_times_norm_in_gemv.json"])


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else ".")
