"""One GPU call: the batch-1 step with its GEMVs at the floor of a kernel per matmul, everything else as it is.

(Calls 88-89 ran it at a8eb745; call 108 again after the nineteenth guess, with m13's GEMVs leaving their slices
and the deferred norms: the streaming kernel leaves every output unwritten, slices included.)

Call 27 chained the step's 145 matmuls alone: a kernel that only streams each matmul's int4 bytes (one
multiply-add per 32-bit word, 4 programs of 4 warps an SM) took 1.24 ms where m13's GEMVs took 2.42; with the
rest of the step then (0.633 ms) that was 2.52x bf16. The rest has changed since (the norms write x's integers,
74 conversion launches, epilogues), so this asks the step itself: each engine's graphs are captured with every
GEMV launch replaced by that streaming kernel over the same weight words and scales (its outputs left as they
are: the values are garbage, the timing is not), and timed beside bf16 and int4 in interleaved rounds:

    int4-floor      the GEMVs only stream their bytes; the norms, x's conversions and attention as in int4
    int4-floor-x    the same, and x's conversion launches gone too (int16_x returns an unwritten buffer)
    int4-x          m13's GEMVs, and x's conversion launches gone (call 89: what converting x where it is made
                    could save at most)

The logit error is measured for int4 only (the other engines' logits are garbage by design).

    python3 scratch/gemv_floor_in_step.py OUT_DIR [MODES]
"""

from __future__ import annotations

import sys

import torch
import triton
import triton.language as tl

import benchmarks.quant_step as quant_step
from milestones.m13_quantization import matmul_kernels
from milestones.m13_quantization.integer_dots import int16_x_words

BLOCK = 1024  # int32 words a program reads per loop step (4 KiB), as in call 27
PROGRAMS_PER_SM, WARPS, STAGES = 4, 4, 3


@triton.jit
def _stream_kernel(w_ptr, n_w, w_iters, s_ptr, n_s, s_iters, w_programs, sink_ptr,
                   STAGES: tl.constexpr, BLOCK: tl.constexpr):
    """Programs below ``w_programs`` stream the weight words, the others the scales' words."""
    pid = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    acc = tl.zeros([BLOCK], tl.float32)
    if pid < w_programs:
        base = pid * w_iters * BLOCK
        for i in tl.range(0, w_iters, num_stages=STAGES):
            idx = base + i * BLOCK + offs
            acc += tl.load(w_ptr + idx, mask=idx < n_w, other=0).to(tl.float32, bitcast=True)
    else:
        base = (pid - w_programs) * s_iters * BLOCK
        for i in tl.range(0, s_iters, num_stages=STAGES):
            idx = base + i * BLOCK + offs
            acc += tl.load(s_ptr + idx, mask=idx < n_s, other=0).to(tl.float32, bitcast=True)
    tl.store(sink_ptr + pid, tl.sum(acc))


class StreamInstead:
    """Stands in for ``_quantized_gemv_kernel[grid](...)``: streams the launch's weight words and scales."""

    def __init__(self) -> None:
        self.sink = None

    def __getitem__(self, grid):
        return self.launch

    def launch(self, x, qweight, scales, *args, **kwargs):
        flat_scales = scales if scales.is_contiguous() else scales.t()  # group by group: strides (1, N)
        assert qweight.is_contiguous() and flat_scales.is_contiguous()  # views only: no copy in the graph
        weights, scale_words = qweight.reshape(-1).view(torch.int32), flat_scales.reshape(-1).view(torch.int32)
        sms = torch.cuda.get_device_properties(qweight.device).multi_processor_count
        programs = sms * PROGRAMS_PER_SM
        s_programs = max(1, round(programs * scale_words.numel() / (weights.numel() + scale_words.numel())))
        w_programs = programs - s_programs
        w_iters = triton.cdiv(weights.numel(), w_programs * BLOCK)
        s_iters = triton.cdiv(scale_words.numel(), s_programs * BLOCK)
        if self.sink is None:
            self.sink = torch.zeros(programs, dtype=torch.float32, device=qweight.device)
        _stream_kernel[(programs,)](weights, weights.numel(), w_iters, scale_words, scale_words.numel(), s_iters,
                                    w_programs, self.sink, STAGES=STAGES, BLOCK=BLOCK, num_warps=WARPS)


def unwritten_int16_x(x: torch.Tensor) -> torch.Tensor:
    return torch.empty((x.shape[0], int16_x_words(x.shape[1])), dtype=torch.int32, device=x.device)


def main(out_dir: str) -> None:
    plain_build, plain_kernel, plain_x = quant_step.build, matmul_kernels._quantized_gemv_kernel, matmul_kernels.int16_x
    plain_compare = quant_step.compare_logits
    modes = sys.argv[2] if len(sys.argv) > 2 else "bf16,int4,int4-floor"

    def build(mode, args):
        try:  # the graphs record the launches they capture
            if mode.startswith("int4-floor"):
                matmul_kernels._quantized_gemv_kernel = StreamInstead()
            if mode in ("int4-floor-x", "int4-x"):
                matmul_kernels.int16_x = unwritten_int16_x
            return plain_build(mode, args)
        finally:
            matmul_kernels._quantized_gemv_kernel, matmul_kernels.int16_x = plain_kernel, plain_x

    def compare(reference, engines, prompts, positions):
        return plain_compare(reference, {m: e for m, e in engines.items() if m == "int4"}, prompts, positions)

    for mode in ("int4-floor", "int4-floor-x", "int4-x"):
        quant_step.MODES.setdefault(mode, {"quantization": "int4"})
    quant_step.build, quant_step.compare_logits = build, compare
    quant_step.main(["--modes", modes, "--batches", "1,2", "--rounds", "5",
                     "--out", f"{out_dir}/m13_step_times_gemv_floor_{len(modes.split(','))}.json"])


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else ".")
