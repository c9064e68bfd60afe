"""One GPU call: the step with the integer norm as committed (16 warps, a multiply per input) beside bf16, and
bf16 with m12's add + RMSNorm at 16 warps too (``bf16-norm16``; m12 launches it with 4): how much of int4's gain
over bf16 a faster plain norm would take back. quant_step, no second gate, 5 interleaved rounds at 1, 2, 4 rows.

    python3 scratch/bf16_norm_warps.py OUT_DIR
"""

from __future__ import annotations

import sys

import torch
import triton

import benchmarks.quant_step as quant_step
from milestones.m12_async_scheduling import fused_layers
from milestones.m12_async_scheduling.fused_kernels import _add_rms_norm_kernel


def norm16(x, residual, weight, eps, out=None):
    out = torch.empty_like(residual) if out is None else out
    _add_rms_norm_kernel[(residual.shape[0],)](x, residual, weight, out, eps, D=residual.shape[1],
                                               BLOCK=triton.next_power_of_2(residual.shape[1]), num_warps=16)
    return out


def main(out_dir: str) -> None:
    plain_build, plain_norm = quant_step.build, fused_layers.add_rms_norm

    def build(mode, args):
        try:  # the graphs record the launches they capture
            if mode == "bf16-norm16":
                fused_layers.add_rms_norm = norm16
            return plain_build(mode, args)
        finally:
            fused_layers.add_rms_norm = plain_norm

    quant_step.MODES.setdefault("bf16-norm16", {})
    quant_step.build = build
    quant_step.main(["--modes", "bf16,int4,bf16-norm16", "--batches", "1,2,4", "--rounds", "5",
                     "--out", f"{out_dir}/m13_step_times_bf16_norm_warps.json"])


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else ".")
