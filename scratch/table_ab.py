"""Call 45: int4's GEMV launch table in the decode step of qwen3-8b-random at batch 1 and 2 (512 keys), 5
interleaved rounds: bf16; int4 with K cut into equal slices (q/k/v in 4); int4 as call 43 measured it (q/k/v in
6 + 6 + 4 steps); and two guesses on top of equal slices: 4 pipeline stages, and gate_up in programs of 64 rows.

    python3 scratch/table_ab.py OUT_DIR
"""

from __future__ import annotations

import dataclasses
import sys

import benchmarks.quant_step as quant_step
from milestones.m13_quantization import matmul_kernels
from milestones.m13_quantization.launch_config import choose_launch


def variant(mode: str):
    def choose(method, m, n, k, num_sms, table=None):
        config, split = choose_launch(method, m, n, k, num_sms)
        if method != "int4" or config.kernel != "gemv":
            return config, split
        if mode == "int4-split3" and (n, k) == (6144, 4096):
            return config, 3
        if mode == "int4-s4":
            return dataclasses.replace(config, num_stages=4), split
        if mode == "int4-gu64" and m == 1 and (n, k) == (24576, 4096):
            return dataclasses.replace(config, block_n=64), split
        return config, split

    return choose


def main(out_dir: str) -> None:
    table_build = quant_step.build

    def build(mode, args):
        saved = matmul_kernels.choose_launch
        matmul_kernels.choose_launch = variant(mode)
        try:
            return table_build(mode, args)  # its graphs capture these launches
        finally:
            matmul_kernels.choose_launch = saved

    for mode in ("int4-split3", "int4-s4", "int4-gu64"):
        quant_step.MODES[mode] = {"quantization": "int4"}
    quant_step.build = build
    quant_step.main(["--modes", "bf16,int4,int4-split3,int4-s4,int4-gu64", "--batches", "1,2", "--rounds", "5",
                     "--out", f"{out_dir}/m13_step_times_table_ab.json"])


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else ".")
