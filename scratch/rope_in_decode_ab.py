"""One GPU call: q/k norm + RoPE inside the decode kernel's programs (rope_in_decode.py, ROPE_IN_DECODE), q made in
registers beside m08's first loads (its body a jit function, decode_keys), with and without the first tile's
K/V asked of L2 before q is made (PREFETCH_FIRST_TILE), against its own launch before the decode kernel: the batch-1, -2 and -4 step at 512 keys and the batch-1 step at 4,096 (quant_step, 5 interleaved
rounds).

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
            rope_in_decode.PREFETCH_FIRST_TILE = mode != "int4-no-prefetch"
            return plain_build(mode, args)
        finally:
            epilogue_layers.ROPE_IN_DECODE = rope_in_decode.PREFETCH_FIRST_TILE = True

    for mode in ("int4-no-prefetch", "int4-rope-launch"):
        quant_step.MODES.setdefault(mode, quant_step.MODES["int4"])
    quant_step.build = build
    if "--profile" in sys.argv:
        from scratch import step_kernels
        step_kernels.main(f"{out_dir}/m13_step_kernels_rope_in_decode.json", [1], ["int4", "int4-rope-launch"])
        return
    modes = "bf16,int4,int4-no-prefetch,int4-rope-launch"
    quant_step.main(["--modes", modes, "--batches", "1,2,4", "--rounds", "5",
                     "--out", f"{out_dir}/m13_step_times_rope_in_decode_prefetch.json"])
    quant_step.main(["--modes", modes, "--batches", "1", "--context", "4096", "--rounds", "5",
                     "--out", f"{out_dir}/m13_step_times_rope_in_decode_prefetch_4096.json"])


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else ".")
