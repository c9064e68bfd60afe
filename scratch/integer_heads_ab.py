"""One GPU call: the batch-1 step with o_proj's x written as integers by attention's combine (m13 now) against
a conversion launch before o_proj (the step before: ``int4-launch``), beside bf16; 5 interleaved rounds at 1, 2
and 4 rows (quant_step, no second gate).

    python3 scratch/integer_heads_ab.py OUT_DIR
"""

from __future__ import annotations

import sys

import benchmarks.quant_step as quant_step
from milestones.m13_quantization import epilogue_layers


class NeverThis:
    """Stands in for m10's graph attention class in the decoder's check: nothing is wrapped."""


def main(out_dir: str) -> None:
    plain_build, plain_class = quant_step.build, epilogue_layers.GraphDecodeAttention

    def build(mode, args):
        try:  # the graphs record the launches they capture
            if mode == "int4-launch":
                epilogue_layers.GraphDecodeAttention = NeverThis
            return plain_build(mode, args)
        finally:
            epilogue_layers.GraphDecodeAttention = plain_class

    quant_step.MODES.setdefault("int4-launch", {"quantization": "int4"})
    quant_step.build = build
    quant_step.main(["--modes", "bf16,int4,int4-launch", "--batches", "1,2,4", "--rounds", "5",
                     "--out", f"{out_dir}/m13_step_times_integer_heads.json"])


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else ".")
