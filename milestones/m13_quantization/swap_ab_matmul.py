"""From 17 rows of x: W's unpacked tile as the tensor cores' register operand (``out^T = W x^T``, "swap AB").

A Hopper tensor-core instruction (``wgmma``) multiplies an ``A`` tile of 64 rows by a ``B`` tile of 8 to 256
columns. ``A`` may come from registers; ``B`` must sit in shared memory. The classic tiled matmul
(``matmul_kernels._quantized_dot_kernel``) computes ``out = x W^T`` and makes the unpacked weight its ``B``: every
unpacked tile is written to shared memory and read back, and ``x``'s few rows are padded up to the 64 that ``A``
needs. Swap the operands and compute ``out^T = W x^T`` instead::

    one program:  BLOCK_N rows of W (wgmma's M: 64 a warp group)  x  BLOCK_M rows of x (wgmma's N: up to 256)
    a loop step:  W's bytes of one 128-input group -> unpacked, scaled, rounded to bf16 in registers = A
                  x^T's 128 inputs x BLOCK_M rows, loaded into shared memory (pipelined)              = B
                  acc[BLOCK_N, BLOCK_M] += A @ B       (two wgmma chains: the group's low and high nibbles)

The weight goes from memory to registers to the tensor cores without a shared-memory round trip, each of its
bytes read once for up to 128 rows of x. Where N gives too few programs to fill the GPU (at 64 rows q/k/v has 96
programs of 64 rows, o_proj and down_proj 64), K is cut into slices (``launch_config.choose_split_k``): each
slice writes float32 sums to its own plane of a scratch, and one reduction over the planes adds them afterwards
(one more launch; the same bits every run).

int8 runs the same kernel: its integers (exact in bf16) go into the dot, and each row's scale multiplies the
float32 sums at the end. On the H200 a Qwen3-8B decode step at 64 rows took 6.62 ms in int4 and 7.29 in int8
this way, against 13.28 and 13.81 with W unpacked into a bf16 scratch for cuBLAS (the table before), and bf16's
6.25 (``benchmarks/results/h200/m13_step_times+swap-ab.json``): twice as fast, and still no faster than bf16.
At 32 rows it beats bf16 in int4 (5.41 ms, 1.05x bf16's 5.68) where the tiled matmul, which unpacks W once per 16
rows of x, took 7.72 (``m13_step_times+small-swap-ab.json``): so it runs from 17 rows. The tensor cores wait on
each group's unpacking, which a hand-scheduled kernel (Marlin's) overlaps with the previous group's products.
"""

from __future__ import annotations

import torch

import triton
import triton.language as tl

from milestones.m08_triton_kernel.device_kernel import device_kernel, runs_interpreted

from .launch_config import MAX_SPLIT_K, QuantMatmulConfig, swap_ab_rows
from .quantize import GROUP_SIZE, TILE_ROWS
from .weight_unpacking import MAGIC, _int4_rows, _int8_to_float, _unpack_int4


@device_kernel
@triton.jit
def _swap_ab_kernel(
    x_ptr, w_ptr, s_ptr, out_ptr,
    M, N, K,
    stride_xm, stride_wn, stride_sn, stride_sg, stride_om, stride_split,
    INT4: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP: tl.constexpr, SPLIT: tl.constexpr, DOT_FP32: tl.constexpr, IEEE: tl.constexpr, TILED: tl.constexpr,
    NUM_STAGES: tl.constexpr,
):
    """One program: ``out^T``'s ``[BLOCK_N, BLOCK_M]`` tile over one slice of K (``program_id(1)``); with
    ``SPLIT`` > 1 the tile is written in float32 to the slice's plane (``stride_split`` apart)."""
    pid = tl.program_id(0)
    split = tl.program_id(1)
    num_m = tl.cdiv(M, BLOCK_M)
    pid_m = pid % num_m  # the programs that share a W tile are launched side by side: W leaves memory once
    pid_n = pid // num_m
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)  # rows of W (outputs)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)  # rows of x
    col_ok = cols < N
    row_ok = rows < M
    dot_dtype = tl.float32 if DOT_FP32 else x_ptr.dtype.element_ty
    acc = tl.zeros([BLOCK_N, BLOCK_M], tl.float32)
    steps = tl.cdiv(K, BLOCK_K)
    per_split = tl.cdiv(steps, SPLIT)
    first = split * per_split
    last = tl.minimum(first + per_split, steps)
    if INT4:  # BLOCK_K == GROUP: one group a step, its scale folded into the tile (as the dot kernel does)
        HALF: tl.constexpr = GROUP // 2
        j = tl.arange(0, HALF)
        w_rows, group_stride = _int4_rows(w_ptr, cols, stride_wn, K, TILED, HALF, GROUP)
        for g in tl.range(first, last, num_stages=NUM_STAGES):
            b = tl.load(w_rows + (g * group_stride + j)[None, :], mask=col_ok[:, None], other=0).to(tl.int32)
            scale = tl.load(s_ptr + cols * stride_sn + g * stride_sg, mask=col_ok, other=0.0)[:, None]
            lo, hi = _unpack_int4(b, MAGIC)
            x_t = x_ptr + rows[None, :] * stride_xm + (g * GROUP + j)[:, None]  # [HALF, BLOCK_M]: x^T
            x_lo = tl.load(x_t, mask=row_ok[None, :], other=0.0).to(dot_dtype)
            x_hi = tl.load(x_t + HALF, mask=row_ok[None, :], other=0.0).to(dot_dtype)
            if IEEE:
                acc = tl.dot((lo * scale).to(dot_dtype), x_lo, acc, input_precision="ieee")
                acc = tl.dot((hi * scale).to(dot_dtype), x_hi, acc, input_precision="ieee")
            else:
                acc = tl.dot((lo * scale).to(dot_dtype), x_lo, acc)
                acc = tl.dot((hi * scale).to(dot_dtype), x_hi, acc)
    else:
        ks = tl.arange(0, BLOCK_K)
        for step in tl.range(first, last, num_stages=NUM_STAGES):
            k_ok = step * BLOCK_K + ks < K
            q = tl.load(w_ptr + cols[:, None] * stride_wn + (step * BLOCK_K + ks)[None, :],
                        mask=col_ok[:, None] & k_ok[None, :], other=0)
            x_t = tl.load(x_ptr + rows[None, :] * stride_xm + (step * BLOCK_K + ks)[:, None],
                          mask=k_ok[:, None] & row_ok[None, :], other=0.0).to(dot_dtype)
            w = _int8_to_float(q, MAGIC).to(dot_dtype)  # -127..127: exact in bf16
            if IEEE:
                acc = tl.dot(w, x_t, acc, input_precision="ieee")
            else:
                acc = tl.dot(w, x_t, acc)
        acc = acc * tl.load(s_ptr + cols, mask=col_ok, other=0.0)[:, None]
    out = out_ptr + split * stride_split + rows[None, :] * stride_om + cols[:, None]
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=col_ok[:, None] & row_ok[None, :])


def swap_ab_matmul(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, m: int, n: int, k: int,
                   int4: bool, config: QuantMatmulConfig, split_k: int) -> torch.Tensor:
    """``x @ dequantize(W)^T`` through ``_swap_ab_kernel`` (shapes already checked by ``quantized_matmul``)."""
    block_m = swap_ab_rows(m, config)
    block_k = GROUP_SIZE if int4 else config.block_k
    steps = -(-k // block_k)
    most = max(1, min(steps, MAX_SPLIT_K))
    if isinstance(split_k, bool) or not isinstance(split_k, int) or not 1 <= split_k <= most:
        raise ValueError(f"split_k must be an int in [1, {most}] (K's loop steps of {block_k} inputs, at most "
                         f"{MAX_SPLIT_K}), got {split_k!r}")
    if m == 0 or n == 0 or k == 0:
        return x.new_zeros((m, n))  # nothing to launch: an empty product, or sums over no inputs
    split_k = -(-steps // -(-steps // split_k))  # slices that hold at least one step (the kernel's own split)
    if split_k > 1:
        planes = torch.empty((split_k, m, n), device=x.device, dtype=torch.float32)
        out = planes
    else:
        out = x.new_empty((m, n))
    grid = (triton.cdiv(m, block_m) * triton.cdiv(n, config.block_n), split_k)
    interpreted_bf16 = runs_interpreted(x.device) and x.dtype == torch.bfloat16  # its bf16 dots are wrong
    _swap_ab_kernel[grid](
        x, qweight, scales, out, m, n, k, x.stride(0), qweight.stride(0), scales.stride(0), scales.stride(-1),
        out.stride(-2), out.stride(0) if split_k > 1 else 0,
        INT4=int4, BLOCK_M=block_m, BLOCK_N=config.block_n, BLOCK_K=block_k, GROUP=GROUP_SIZE, SPLIT=split_k,
        DOT_FP32=x.dtype == torch.float32 or interpreted_bf16, IEEE=x.dtype == torch.float32,
        TILED=qweight.dim() == 4 and qweight.shape[-2] == TILE_ROWS, NUM_STAGES=config.num_stages,
        num_warps=config.num_warps, num_stages=config.num_stages,
    )
    if split_k == 1:
        return out
    return planes.sum(0).to(x.dtype)  # one reduction over the planes: the same bits every run
