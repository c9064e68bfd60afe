"""int8 at batch 2 and 4: the GEMV (the table's gemv regime, up to 4 rows) against the tensor-core dot kernel (the
`small` regime, taken from 2 rows while that engine captures its graphs), beside bf16 and int4, batch 1/2/4/16, in
interleaved rounds (quant_step). One GPU call."""

from __future__ import annotations

import sys

import benchmarks.quant_step as quant_step
from milestones.m13_quantization import launch_config

table_build = quant_step.build


def build(mode, args):
    if mode != "int8-dot":
        return table_build(mode, args)
    saved = launch_config.GEMV_MAX_M
    launch_config.GEMV_MAX_M = {**saved, "int8": 1}  # regime(m, "int8"): 2 rows and more go to tl.dot
    try:
        return table_build(mode, args)
    finally:
        launch_config.GEMV_MAX_M = saved


if __name__ == "__main__":
    quant_step.MODES["int8-dot"] = {"quantization": "int8"}
    quant_step.build = build
    quant_step.main(["--modes", "bf16,int8,int8-dot,int4", "--batches", "1,2,4,16", "--rounds", "5",
                     "--out", sys.argv[1] if len(sys.argv) > 1 else "m13_step_times_int8_small_batches.json"])
