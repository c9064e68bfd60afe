"""One GPU call: the norms before q/k/v and gate_up writing those GEMVs' x as integers (``integer_norm.py``)
against the step before (each dp4a GEMV converting its own x, the norm done in o/down's finish at one row).

quant_step on qwen3-8b-random, 512 keys, the float32 gate first, 5 interleaved rounds, each engine's graphs
captured under its own setting: ``bf16``; ``int4-before`` (``INTEGER_X_MAX_ROWS = 0``); ``int4`` (now).

    python3 scratch/integer_norm_ab.py OUT_DIR [BATCHES]
"""

from __future__ import annotations

import sys

import benchmarks.quant_step as quant_step
from milestones.m13_quantization import epilogue_layers


def main(out_dir: str, batches: str) -> None:
    plain_build = quant_step.build

    def build(mode, args):
        saved = epilogue_layers.INTEGER_X_MAX_ROWS
        try:  # the graphs record the launches they capture: the setting matters only while building
            if mode == "int4-before":
                epilogue_layers.INTEGER_X_MAX_ROWS = 0
            return plain_build(mode, args)
        finally:
            epilogue_layers.INTEGER_X_MAX_ROWS = saved

    quant_step.MODES.setdefault("int4-before", {"quantization": "int4"})
    quant_step.build = build
    quant_step.main(["--gate", "--modes", "bf16,int4-before,int4", "--batches", batches, "--rounds", "5",
                     "--out", f"{out_dir}/m13_step_times_integer_norm.json"])


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else ".", sys.argv[2] if len(sys.argv) > 2 else "1,2,4")
