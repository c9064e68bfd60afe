"""One GPU call: m13's decode step at 64 and 128 rows with int4's large regime on swap_ab against the dequant path.

``swap_ab_matmul.py`` puts W's unpacked tile in the tensor cores' register operand (``out^T = W x^T``);
``scratch/int4_wide.py`` (calls 68-69) timed it per shape. This call times the step (quant_step on
qwen3-8b-random, 512 keys, 5 interleaved rounds) with each engine's graphs captured under its own table:

    bf16           m13's bf16 engine
    int4           m13's int4 engine: swap_ab from 33 to 512 rows (the table at this commit)
    int4-dequant   the same, its large regime the dequant path (W into a bf16 scratch, cuBLAS: the table before)
    int8           m13's int8 engine: the dequant path from 33 rows (the table at this commit)
    int8-swap_ab   the same, its large regime swap_ab

    python3 scratch/swap_ab_step.py OUT_DIR
"""

from __future__ import annotations

import sys

import benchmarks.quant_step as quant_step
from milestones.m13_quantization import launch_config

MODES = ("bf16", "int4", "int4-dequant", "int8", "int8-swap_ab")
LARGE = {"int4-dequant": ("int4", launch_config.DEQUANT), "int8-swap_ab": ("int8", launch_config.SWAP_AB)}


def main(out_dir: str) -> None:
    plain_build = quant_step.build

    def build(mode, args):
        method, config = LARGE.get(mode, (None, None))
        saved = launch_config.LAUNCH_TABLE[method]["large"] if method else None
        try:
            if method:  # the graphs record the launches they capture: the table matters only while building
                launch_config.LAUNCH_TABLE[method]["large"] = config
            return plain_build(mode, args)
        finally:
            if method:
                launch_config.LAUNCH_TABLE[method]["large"] = saved

    quant_step.MODES.setdefault("int4-dequant", {"quantization": "int4"})
    quant_step.MODES.setdefault("int8-swap_ab", {"quantization": "int8"})
    quant_step.build = build
    quant_step.main(["--modes", ",".join(MODES), "--batches", "1,64,128", "--rounds", "5",
                     "--kv-cache-memory-gib", "10", "--out", f"{out_dir}/m13_step_times+swap-ab.json"])


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else ".")
