"""m13's int4 GEMV launch table before and after int4_gemv_grid.py, in one call: quant_step on bf16, int4 with the
new table and int4 with the old one (its choices captured into that engine's graphs while choose_launch is patched),
at batch 1 and 4 in interleaved rounds."""

from __future__ import annotations

import sys
from dataclasses import replace

import benchmarks.quant_step as quant_step
from milestones.m13_quantization import matmul_kernels
from milestones.m13_quantization.launch_config import QuantMatmulConfig, choose_split_k

OLD_WORDS = QuantMatmulConfig("gemv", block_n=32, block_k=256, num_warps=1, num_stages=3)
OLD_NARROW = QuantMatmulConfig("gemv", block_n=16, block_k=256, num_warps=4, num_stages=4, unpack="magic")


def old_choose(method, m, n, k, num_sms, *rest):
    """The table before: the words kernel where N gives it 4 warps per SM, else the bytes kernel; block_n halved
    only below one program per SM."""
    if method != "int4" or m > 4:
        return new_choose(method, m, n, k, num_sms, *rest)
    config = OLD_WORDS if -(-n // OLD_WORDS.block_n) >= 4 * num_sms else OLD_NARROW
    block_n = config.block_n
    while block_n > 8 and -(-n // block_n) < num_sms:
        block_n //= 2
    config = replace(config, block_n=block_n)
    return config, choose_split_k(m, n, k, num_sms, config)


new_choose = matmul_kernels.choose_launch
table_build = quant_step.build


def build(mode, args):
    if mode != "int4-old-table":
        return table_build(mode, args)
    matmul_kernels.choose_launch = old_choose
    try:
        return table_build(mode, args)
    finally:
        matmul_kernels.choose_launch = new_choose


if __name__ == "__main__":
    quant_step.MODES["int4-old-table"] = {"quantization": "int4"}
    quant_step.build = build
    quant_step.main(["--modes", "bf16,int4,int4-old-table", "--batches", "1,4", "--rounds", "5",
                     "--out", sys.argv[1] if len(sys.argv) > 1 else "m13_step_times+table-ab.json"])
