"""One GPU call: m13's step with the deferred norm in o_proj's and down_proj's GEMV finish (NORM_IN_GEMV_MAX_ROWS)
and layer 0's input norm deferred too (EpilogueQwen3Model.first_norm), against m12's layer-0 norm and a
conversion launch, and against the norm's own launches: the batch-1 and -2 step at 512 keys, 7 interleaved rounds
(quant_step).

    python3 scratch/norm_in_gemv_ab.py OUT_DIR             # the step, interleaved
    python3 scratch/norm_in_gemv_ab.py OUT_DIR --profile   # its kernels at one row (step_kernels.py), both ways
"""

from __future__ import annotations

import sys

import benchmarks.quant_step as quant_step
from milestones.m12_async_scheduling.fused_layers import FusedQwen3Model
from milestones.m13_quantization import epilogue_layers
from milestones.m13_quantization.epilogue_layers import EpilogueQwen3Model


def main(out_dir: str) -> None:
    plain_build = quant_step.build
    default = epilogue_layers.NORM_IN_GEMV_MAX_ROWS
    first_norm = EpilogueQwen3Model.first_norm

    def build(mode, args):
        try:  # the graphs record the launches they capture
            if mode in ("int4-m12-first-norm", "int4-norm-launch"):
                EpilogueQwen3Model.first_norm = FusedQwen3Model.first_norm
            if mode == "int4-norm-launch":
                epilogue_layers.NORM_IN_GEMV_MAX_ROWS = 0
            return plain_build(mode, args)
        finally:
            epilogue_layers.NORM_IN_GEMV_MAX_ROWS = default
            EpilogueQwen3Model.first_norm = first_norm

    for mode in ("int4-m12-first-norm", "int4-norm-launch"):
        quant_step.MODES.setdefault(mode, quant_step.MODES["int4"])
    quant_step.build = build
    if "--profile" in sys.argv:
        from scratch import step_kernels
        step_kernels.main(f"{out_dir}/m13_step_kernels_norm_in_gemv.json", [1], ["int4-norm-launch", "int4"])
        return
    quant_step.main(["--modes", "bf16,int4,int4-m12-first-norm,int4-norm-launch", "--batches", "1,2", "--rounds", "7",
                     "--out", f"{out_dir}/m13_step_times_first_norm.json"])


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else ".")
