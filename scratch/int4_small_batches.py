"""int4 at batch 2 and 4: the GEMV (CUDA cores, the table's gemv regime up to 4 rows) against the tensor-core dot
kernel (the `small` regime, taken from 2 rows while that engine captures its graphs), with bf16, in interleaved
rounds (quant_step). One GPU call."""

from __future__ import annotations

import sys

import benchmarks.quant_step as quant_step
from milestones.m13_quantization import launch_config

table_build = quant_step.build


def build(mode, args):
    if mode != "int4-dot":
        return table_build(mode, args)
    launch_config.GEMV_MAX_M = 1  # regime(m): 2 rows and more go to the `small` regime's tl.dot kernel
    try:
        return table_build(mode, args)
    finally:
        launch_config.GEMV_MAX_M = 4


if __name__ == "__main__":
    quant_step.MODES["int4-dot"] = {"quantization": "int4"}
    quant_step.build = build
    quant_step.main(["--modes", "bf16,int4,int4-dot", "--batches", "2,4", "--rounds", "5",
                     "--out", sys.argv[1] if len(sys.argv) > 1 else "m13_step_times_small_batches.json"])
