"""The dequant path: W widened into a scratch in memory, then cuBLAS; and the float32 product every kernel must meet.

Beyond 512 rows of x (``LAUNCH_TABLE``'s ``prefill`` entries) the weight is widened in memory after all:
``_dequant_then_cublas`` unpacks a slice of W's rows into a scratch in x's dtype (``_dequantize_kernel``, with
``weight_unpacking.py``'s helpers) and calls ``F.linear`` (cuBLAS) on it, slice after slice, at most
``DEQUANT_SCRATCH_BYTES`` of scratch at a time; at thousands of rows the product dwarfs the unpacking.

``quantized_matmul_reference`` is the same product in float32 torch (``quantize.dequantize_weight``, then a
matmul): what the tests hold every kernel to.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

import triton
import triton.language as tl

from milestones.m08_triton_kernel.device_kernel import device_kernel

from .launch_config import QuantMatmulConfig
from .quantize import GROUP_SIZE, TILE_ROWS
from .weight_unpacking import MAGIC, _int4_rows, _unpack_int4

DEQUANT_SCRATCH_BYTES = 64 * 2**20  # the dequant path unpacks at most this many bytes of W at a time


@device_kernel
@triton.jit
def _dequantize_kernel(
    w_ptr, s_ptr, out_ptr, N, K, stride_wn, stride_sn, stride_sg, stride_on,
    INT4: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP: tl.constexpr, TILED: tl.constexpr,
):
    """W's rows [pid_n * BLOCK_N, +BLOCK_N), inputs [pid_k * BLOCK_K, +BLOCK_K), written as floats."""
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < N
    if INT4:
        HALF: tl.constexpr = GROUP // 2
        GROUPS: tl.constexpr = BLOCK_K // GROUP
        g = pid_k * GROUPS + tl.arange(0, GROUPS)
        j = tl.arange(0, HALF)
        scale_mask = col_ok[:, None] & (g * GROUP < K)[None, :]  # [BLOCK_N, GROUPS]
        mask = scale_mask[:, :, None] & (j < HALF)[None, None, :]
        w_rows, group_stride = _int4_rows(w_ptr, cols, stride_wn, K, TILED, HALF, GROUP)
        b = tl.load(w_rows[:, :, None] + (g[:, None] * group_stride + j[None, :])[None, :, :], mask=mask,
                    other=0).to(tl.int32)
        scale = tl.load(s_ptr + cols[:, None] * stride_sn + g[None, :] * stride_sg, mask=scale_mask, other=0.0)
        lo, hi = _unpack_int4(b, MAGIC)
        k_lo = (g[:, None] * GROUP + j[None, :])[None, :, :]
        out = out_ptr + cols[:, None, None] * stride_on + k_lo
        tl.store(out, (lo * scale[:, :, None]).to(out_ptr.dtype.element_ty), mask=mask)
        tl.store(out + HALF, (hi * scale[:, :, None]).to(out_ptr.dtype.element_ty), mask=mask)
    else:
        ks = pid_k * BLOCK_K + tl.arange(0, BLOCK_K)
        mask = col_ok[:, None] & (ks < K)[None, :]
        q = tl.load(w_ptr + cols[:, None] * stride_wn + ks[None, :], mask=mask, other=0)
        scale = tl.load(s_ptr + cols, mask=col_ok, other=0.0)
        tl.store(out_ptr + cols[:, None] * stride_on + ks[None, :],
                 (q.to(tl.float32) * scale[:, None]).to(out_ptr.dtype.element_ty), mask=mask)


def dequantize(qweight: torch.Tensor, scales: torch.Tensor, method: str, dtype: torch.dtype,
               rows: slice | None = None, config: QuantMatmulConfig | None = None) -> torch.Tensor:
    """``W[rows]`` as a dense ``dtype`` matrix, unpacked by ``_dequantize_kernel`` (the dequant path's scratch).
    int4 tiles: ``rows`` starts on a whole tile (a multiple of 16)."""
    rows = slice(*(rows or slice(None)).indices(scales.shape[0]))
    tiled = qweight.dim() == 4
    if tiled and rows.start % TILE_ROWS:
        raise ValueError(f"int4 tiles are dequantized whole: rows must start at a multiple of {TILE_ROWS}")
    w = qweight[rows.start // TILE_ROWS:-(-rows.stop // TILE_ROWS)] if tiled else qweight[rows]
    s = scales[rows]
    n = s.shape[0]
    k = 2 * w.shape[-1] * (w.shape[1] if tiled else 1) if method == "int4" else w.shape[1]
    config = config or QuantMatmulConfig("dequant", block_n=64, block_k=256, num_warps=4, num_stages=2)
    block_k = max(config.block_k, GROUP_SIZE) if method == "int4" else config.block_k
    out = torch.empty((n, k), dtype=dtype, device=qweight.device)
    _dequantize_kernel[(triton.cdiv(n, config.block_n), triton.cdiv(k, block_k))](
        w, s, out, n, k, w.stride(0), s.stride(0), s.stride(-1), out.stride(0),
        INT4=method == "int4", BLOCK_N=config.block_n, BLOCK_K=block_k, GROUP=GROUP_SIZE, TILED=tiled,
        num_warps=config.num_warps,
    )
    return out


def _dequant_then_cublas(x, qweight, scales, n, k, int4, config) -> torch.Tensor:
    method = "int4" if int4 else "int8"
    rows_per_slice = max(config.block_n, DEQUANT_SCRATCH_BYTES // (k * x.element_size()))
    rows_per_slice = -(-rows_per_slice // TILE_ROWS) * TILE_ROWS  # whole tiles (int4 in tiles)
    if rows_per_slice >= n:
        return F.linear(x, dequantize(qweight, scales, method, x.dtype, config=config))
    out = x.new_empty((x.shape[0], n))
    for start in range(0, n, rows_per_slice):
        rows = slice(start, min(n, start + rows_per_slice))
        out[:, rows] = F.linear(x, dequantize(qweight, scales, method, x.dtype, rows, config))
    return out


def quantized_matmul_reference(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor,
                               method: str) -> torch.Tensor:
    """The same product in float32 torch: the definition every kernel must meet."""
    from .quantize import dequantize_weight

    return (x.float() @ dequantize_weight(qweight, scales, method, torch.float32).T).to(x.dtype)
