"""One GPU call: m08's split-regime launch (64-key tiles, 3 stages) against 32-key tiles (2 stages), in bf16's and
int4's decode graphs (``bf16-t32``, ``int4-t32``: ``LAUNCH_TABLE["split"]`` replaced while the graphs are captured);
5 interleaved rounds at 1 and 2 rows, at 512 keys a sequence and at 4,096 (quant_step, twice, no second gate).

    python3 scratch/split_tiles_ab.py OUT_DIR
"""

from __future__ import annotations

import sys

import benchmarks.quant_step as quant_step
from milestones.m08_triton_kernel.launch_config import LAUNCH_TABLE, DecodeKernelConfig

T32 = DecodeKernelConfig(tile_tokens=32, num_warps=4, num_stages=2, programs_per_sm=3)


def main(out_dir: str) -> None:
    plain_build, table_split = quant_step.build, LAUNCH_TABLE["split"]

    def build(mode, args):
        try:  # the graphs record the launches they capture
            LAUNCH_TABLE["split"] = T32 if mode.endswith("-t32") else table_split
            return plain_build(mode, args)
        finally:
            LAUNCH_TABLE["split"] = table_split

    quant_step.MODES.setdefault("bf16-t32", quant_step.MODES["bf16"])
    quant_step.MODES.setdefault("int4-t32", quant_step.MODES["int4"])
    quant_step.build = build
    for context in (512, 4096):
        quant_step.main(["--modes", "bf16,bf16-t32,int4,int4-t32", "--batches", "1,2", "--rounds", "5",
                         "--context", str(context), "--out", f"{out_dir}/m13_step_times_split_tiles_{context}.json"])


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else ".")
