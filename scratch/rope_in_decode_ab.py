"""One GPU call: q/k norm + RoPE inside the decode kernel's programs (rope_in_decode.py), q's slices loaded by every
split without waiting for the length (Q_IN_EVERY_SPLIT) against only by the splits that hold keys, and against RoPE's
own kernel: the batch-1 and -2 step at 512 keys (quant_step, 5 interleaved rounds).

    python3 scratch/rope_in_decode_ab.py OUT_DIR             # the step, interleaved
    python3 scratch/rope_in_decode_ab.py OUT_DIR --profile   # its kernels at one row (step_kernels.py), int4 both ways
"""

from __future__ import annotations

import sys

import benchmarks.quant_step as quant_step
from milestones.m13_quantization import epilogue_layers, rope_in_decode


def main(out_dir: str) -> None:
    plain_build = quant_step.build

    def build(mode, args):
        try:  # the graphs record the launches they capture
            epilogue_layers.ROPE_IN_DECODE = mode != "int4-rope-launch"
            rope_in_decode.Q_IN_EVERY_SPLIT = mode != "int4-live"
            return plain_build(mode, args)
        finally:
            epilogue_layers.ROPE_IN_DECODE = rope_in_decode.Q_IN_EVERY_SPLIT = True

    for mode in ("int4-live", "int4-rope-launch"):
        quant_step.MODES.setdefault(mode, quant_step.MODES["int4"])
    quant_step.build = build
    if "--profile" in sys.argv:
        from scratch import step_kernels
        step_kernels.main(f"{out_dir}/m13_step_kernels_rope_in_decode.json", [1], ["int4", "int4-rope-launch"])
        return
    modes = "bf16,int4,int4-live,int4-rope-launch"
    quant_step.main(["--modes", modes, "--batches", "1,2", "--rounds", "5",
                     "--out", f"{out_dir}/m13_step_times_rope_in_decode_every_split.json"])


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else ".")
