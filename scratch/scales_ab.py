"""One GPU call: int4's scales in bfloat16 (``quantize.INT4_SCALE_DTYPE``, 2 bytes a group of 128) against float32
(``int4-f32s``, 4 bytes: m13 before), and with bf16 scales the deferred norm in 16 and 32 programs a row
(``int4-n16``, ``int4-n32``: ``deferred_norm.GROUPS_PER_PROGRAM`` 2 and 1, against 4); each engine quantized and
its graphs captured under its own setting; 5 interleaved rounds at 1, 2 and 4 rows, 512 keys (quant_step, whose
logit error per mode also says what the scales' rounding costs). Then the batch-1 step's kernels of int4-f32s and
int4 under the profiler.

    python3 scratch/scales_ab.py OUT_DIR
"""

from __future__ import annotations

import sys

import torch

import benchmarks.quant_step as quant_step
import milestones.m13_quantization.deferred_norm as deferred_norm
import milestones.m13_quantization.quantize as quantize

VARIANTS = {"int4-f32s": {"INT4_SCALE_DTYPE": torch.float32}, "int4-n16": {"GROUPS_PER_PROGRAM": 2},
            "int4-n32": {"GROUPS_PER_PROGRAM": 1}}


def main(out_dir: str) -> None:
    plain_build = quant_step.build
    defaults = {"INT4_SCALE_DTYPE": quantize.INT4_SCALE_DTYPE, "GROUPS_PER_PROGRAM": deferred_norm.GROUPS_PER_PROGRAM}

    def set_knobs(knobs: dict) -> None:
        quantize.INT4_SCALE_DTYPE = knobs.get("INT4_SCALE_DTYPE", defaults["INT4_SCALE_DTYPE"])
        deferred_norm.GROUPS_PER_PROGRAM = knobs.get("GROUPS_PER_PROGRAM", defaults["GROUPS_PER_PROGRAM"])

    def build(mode, args):
        try:  # weights quantized and graphs captured under the variant's knobs
            set_knobs(VARIANTS.get(mode, {}))
            return plain_build(mode, args)
        finally:
            set_knobs({})

    for mode in VARIANTS:
        quant_step.MODES.setdefault(mode, quant_step.MODES["int4"])
    quant_step.build = build
    quant_step.main(["--modes", "bf16,int4-f32s,int4,int4-n16,int4-n32", "--batches", "1,2,4", "--rounds", "5",
                     "--out", f"{out_dir}/m13_step_times_scales.json"])
    sys.argv = ["step_kernels"]
    from scratch.step_kernels import main as step_kernels

    step_kernels(f"{out_dir}/m13_step_kernels_scales.json", [1], ["int4-f32s", "int4"])


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else ".")
