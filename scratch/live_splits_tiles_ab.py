"""One GPU call: m13's live-splits decode (``live_splits.py``) with m08's split launch (64-key tiles, 3 stages:
``int4``) against 32- and 16-key tiles (``int4-t32``, ``int4-t16``), and m08's decode with the combine launch
(``int4-launch``), beside bf16; 5 interleaved rounds at 1 and 2 rows, at 512 keys a sequence and at 4,096
(quant_step, twice, no second gate).

    python3 scratch/live_splits_tiles_ab.py OUT_DIR
"""

from __future__ import annotations

import sys

import benchmarks.quant_step as quant_step
from milestones.m08_triton_kernel.launch_config import DecodeKernelConfig
from milestones.m13_quantization import live_splits

CONFIGS = {"int4-t32": DecodeKernelConfig(tile_tokens=32, num_warps=4, num_stages=2, programs_per_sm=3),
           "int4-t16": DecodeKernelConfig(tile_tokens=16, num_warps=4, num_stages=2, programs_per_sm=3)}


def main(out_dir: str) -> None:
    plain_build = quant_step.build

    def build(mode, args):
        try:  # the graphs record the launches they capture
            live_splits.LIVE_SPLITS_CONFIG = CONFIGS.get(mode)
            live_splits.LIVE_SPLITS_MAX_ROWS = 0 if mode == "int4-launch" else 2
            return plain_build(mode, args)
        finally:
            live_splits.LIVE_SPLITS_CONFIG, live_splits.LIVE_SPLITS_MAX_ROWS = None, 2

    for mode in (*CONFIGS, "int4-launch"):
        quant_step.MODES.setdefault(mode, {"quantization": "int4"})
    quant_step.build = build
    for context in (512, 4096):
        quant_step.main(["--modes", "bf16,int4,int4-t32,int4-t16,int4-launch", "--batches", "1,2", "--rounds", "5",
                         "--context", str(context), "--out", f"{out_dir}/m13_step_times_live_tiles_{context}.json"])


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else ".")
