"""One GPU call: the step with down_proj's x written as integers by gate_up's GEMV (m13 now: each group's last
program converts it) against a conversion launch before down_proj (``int4-launch``), o_proj's x from the
combine in both, beside bf16; 5 interleaved rounds at 1, 2 and 4 rows (quant_step, no second gate).

    python3 scratch/silu_words_ab.py OUT_DIR
"""

from __future__ import annotations

import sys

import benchmarks.quant_step as quant_step
from milestones.m13_quantization import epilogue_layers


def main(out_dir: str) -> None:
    plain_build = quant_step.build

    def build(mode, args):
        try:  # the graphs record the launches they capture
            epilogue_layers.SILU_WRITES_INTEGERS = mode != "int4-launch"
            return plain_build(mode, args)
        finally:
            epilogue_layers.SILU_WRITES_INTEGERS = True

    quant_step.MODES.setdefault("int4-launch", {"quantization": "int4"})
    quant_step.build = build
    quant_step.main(["--modes", "bf16,int4,int4-launch", "--batches", "1,2,4", "--rounds", "5",
                     "--out", f"{out_dir}/m13_step_times_silu_words.json"])


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else ".")
