"""Launch configurations of m08's decode kernel beyond its launch table, for the tests that run or compile it.

They are the candidates ``benchmarks/kernel_bench.py --autotune-sweep`` timed until commit 0c790fd, when the sweep
was retired (its results stay in ``benchmarks/results/h200/``; benchmarks/KERNEL_NOTES.md, sections 4 and 6, says
why each). ``programs_per_sm`` is each configuration's occupancy on an H200 when it splits (Triton 3.6, bf16,
head_dim 128, from its registers and shared memory); ``ppsm8`` and ``min1`` ask what more (or shorter) slices buy.
``tests/test_m08_kernel.py`` checks the kernel under each on CUDA; ``tests/compile_for_gpu.py --sweep-configs``
compiles each for the GPU without one.
"""

from __future__ import annotations

from milestones.m08_triton_kernel.launch_config import DecodeKernelConfig


def _config(tile: int, warps: int, stages: int, programs_per_sm: int, **more) -> DecodeKernelConfig:
    return DecodeKernelConfig(tile_tokens=tile, num_warps=warps, num_stages=stages, programs_per_sm=programs_per_sm,
                              **more)


SWEEP_CONFIGS: dict[str, DecodeKernelConfig] = {
    "t64-w4-s3": _config(64, 4, 3, 3), "t64-w4-s3 ppsm8": _config(64, 4, 3, 8),
    "t64-w4-s3 min1": _config(64, 4, 3, 3, min_tiles_per_split=1),
    "t64-w4-s2": _config(64, 4, 2, 4), "t64-w4-s4": _config(64, 4, 4, 2), "t64-w4-s1": _config(64, 4, 1, 4),
    "t64-w8-s3": _config(64, 8, 3, 3), "t32-w4-s2": _config(32, 4, 2, 7), "t32-w4-s3": _config(32, 4, 3, 6),
    "t32-w4-s4": _config(32, 4, 4, 4), "t16-w4-s4": _config(16, 4, 4, 7), "t128-w8-s2": _config(128, 8, 2, 2),
    "t64-w4-s3 fp32 dots": _config(64, 4, 3, 2, dot_in_fp32=True),
}
