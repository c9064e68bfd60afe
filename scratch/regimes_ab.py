"""The launch table from the full quant_bench (call 38: the tensor cores from 3 rows for int8 too, 16 x 32 x 256 tiles,
the dequant path from 33 rows) against the table before it, bf16 beside them: the decode step of qwen3-8b-random at
batch 1/2/4/16/64 in interleaved rounds (quant_step). One GPU call."""

from __future__ import annotations

import sys

import benchmarks.quant_step as quant_step
from milestones.m13_quantization import launch_config
from milestones.m13_quantization.launch_config import QuantMatmulConfig

table_build = quant_step.build
BEFORE = {
    "int8": {"small": QuantMatmulConfig("dot", block_m=16, block_n=64, block_k=128, num_warps=4, num_stages=4),
             "large": QuantMatmulConfig("dot", block_m=128, block_n=128, block_k=64, num_warps=8, num_stages=3)},
    "int4": {"small": QuantMatmulConfig("dot", block_m=16, block_n=64, block_k=128, num_warps=4, num_stages=4),
             "large": QuantMatmulConfig("dot", block_m=64, block_n=128, block_k=128, num_warps=4, num_stages=3)},
}


def build(mode, args):
    if not mode.endswith("-before"):
        return table_build(mode, args)
    method = mode.split("-")[0]
    saved_table, saved_max = dict(launch_config.LAUNCH_TABLE[method]), launch_config.GEMV_MAX_M
    launch_config.LAUNCH_TABLE[method].update(BEFORE[method])
    launch_config.GEMV_MAX_M = {"int8": 4, "int4": 2}
    try:
        return table_build(mode, args)  # its graphs capture the table before
    finally:
        launch_config.LAUNCH_TABLE[method].update(saved_table)
        launch_config.GEMV_MAX_M = saved_max


if __name__ == "__main__":
    quant_step.MODES["int8-before"] = {"quantization": "int8"}
    quant_step.MODES["int4-before"] = {"quantization": "int4"}
    quant_step.build = build
    quant_step.main(["--modes", "bf16,int8,int8-before,int4,int4-before", "--batches", "1,2,4,16,64", "--rounds", "5", "--kv-cache-memory-gib", "6",
                     "--out", sys.argv[1] if len(sys.argv) > 1 else "m13_step_times_regimes_ab.json"])
