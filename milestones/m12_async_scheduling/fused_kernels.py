"""Three Triton kernels that do in one pass what m10's layer does in several small kernels.

Once the host is hidden behind the GPU, a decode step costs what the GPU does, and at a few hundred rows much
of that is not the matmuls or the attention but small element-wise kernels, each reading and writing the
whole activation: per layer, m10 runs an RMSNorm, a multiply by the q/k norm weights, four kernels of RoPE
(a concatenation, two products and a sum), a SiLU, a product, two residual additions and two more RMSNorms.
Each costs a few microseconds of GPU time and a memory round trip. vLLM fuses the same ones (its
``fused_add_rms_norm``, ``rotary_embedding`` and ``silu_and_mul`` kernels):

* ``add_rms_norm``: ``residual += x`` (rounded to the model's dtype, as the unfused addition would), then
  ``RMSNorm(residual) * weight``: one read of each, one write of each;
* ``qk_norm_rope``: from the packed q/k/v projection, every q and k head normalised (its own weight row) and
  rotated by its position's angles: the RMSNorm, the weight and RoPE in registers, one write of q and k;
* ``silu_and_mul``: ``silu(gate) * up`` from the packed gate/up projection.

Arithmetic is float32 in registers, one rounding at the end (the unfused path rounds after every kernel: in
bfloat16 the two differ in the last bit, in float32 they agree). Each program handles one row (one token, or
one token's head); rows are contiguous in memory, so every load is a coalesced vector of the row.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from milestones.m08_triton_kernel.device_kernel import device_kernel


@device_kernel
@triton.jit
def _add_rms_norm_kernel(x_ptr, residual_ptr, weight_ptr, out_ptr, eps, D: tl.constexpr, BLOCK: tl.constexpr):
    add_rms_norm_row(x_ptr, residual_ptr, weight_ptr, out_ptr, tl.program_id(0).to(tl.int64), eps, D, BLOCK)


@triton.jit
def add_rms_norm_row(x_ptr, residual_ptr, weight_ptr, out_ptr, row, eps, D: tl.constexpr, BLOCK: tl.constexpr):
    """One row of ``add_rms_norm``; returns the normalised row as stored (``BLOCK`` values, zeros past ``D``)."""
    cols = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + row * D + cols, mask=cols < D, other=0.0)
    return add_rms_norm_values(x, residual_ptr, weight_ptr, out_ptr, row, eps, D, BLOCK)


@triton.jit
def add_rms_norm_values(x, residual_ptr, weight_ptr, out_ptr, row, eps, D: tl.constexpr, BLOCK: tl.constexpr):
    """``add_rms_norm_row`` of a row already loaded (``x``: ``BLOCK`` values, zeros past ``D``; a seam: m13's
    norm adds a split matmul's slices into it first)."""
    cols = tl.arange(0, BLOCK)
    mask = cols < D
    summed = (x.to(tl.float32) + tl.load(residual_ptr + row * D + cols, mask=mask, other=0.0).to(tl.float32))
    summed = summed.to(x.dtype)  # the residual stream keeps the model's dtype
    tl.store(residual_ptr + row * D + cols, summed, mask=mask)
    s = summed.to(tl.float32)
    inv_rms = 1.0 / tl.sqrt(tl.sum(s * s, axis=0) / D + eps)
    w = tl.load(weight_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    normed = (s * inv_rms * w).to(x.dtype)
    tl.store(out_ptr + row * D + cols, normed, mask=mask)
    return normed


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float,
                 out: torch.Tensor | None = None) -> torch.Tensor:
    """``residual += x`` in place; returns ``RMSNorm(residual) * weight`` (into ``out`` if given). ``[T, D]``,
    contiguous."""
    tokens, dim = residual.shape
    out = torch.empty_like(residual) if out is None else out
    if tokens:
        _add_rms_norm_kernel[(tokens,)](x, residual, weight, out, eps, D=dim, BLOCK=triton.next_power_of_2(dim),
                                        num_warps=4)
    return out


@device_kernel
@triton.jit
def _qk_norm_rope_kernel(qkv_ptr, weight_ptr, cos_ptr, sin_ptr, positions_ptr, q_ptr, k_ptr, eps,
                         stride_qkv, stride_table, HEADS: tl.constexpr, DIM: tl.constexpr, HALF: tl.constexpr):
    token = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)  # 0..HEADS-1: query heads; then the K/V heads
    first = tl.arange(0, HALF)
    row = qkv_ptr + token * stride_qkv + head * DIM
    qk_norm_rope_head(tl.load(row + first), tl.load(row + HALF + first), token, head, weight_ptr, cos_ptr, sin_ptr,
                      positions_ptr, q_ptr, k_ptr, eps, stride_table, tl.num_programs(1) - HEADS, HEADS, DIM, HALF)


@triton.jit
def qk_norm_rope_values(x1, x2, token, head, weight_ptr, cos_ptr, sin_ptr, positions_ptr, eps, stride_table,
                        DIM: tl.constexpr, HALF: tl.constexpr):
    """One q or k head of one token, its halves ``x1``, ``x2`` loaded: normalised and rotated, in float32 (a seam:
    m13 stores a K head in the paged cache, and rotates a group of heads as the rows of ``[rows, HALF]`` halves,
    ``head`` then ``[rows, 1]``)."""
    first = tl.arange(0, HALF)
    x1 = x1.to(tl.float32)
    x2 = x2.to(tl.float32)
    squares = tl.sum(x1 * x1, axis=-1, keep_dims=True) + tl.sum(x2 * x2, axis=-1, keep_dims=True)  # each head's
    inv_rms = 1.0 / tl.sqrt(squares / DIM + eps)
    x1 = x1 * inv_rms * tl.load(weight_ptr + head * DIM + first).to(tl.float32)
    x2 = x2 * inv_rms * tl.load(weight_ptr + head * DIM + HALF + first).to(tl.float32)
    position = tl.load(positions_ptr + token).to(tl.int64)
    cos = tl.load(cos_ptr + position * stride_table + first).to(tl.float32)
    sin = tl.load(sin_ptr + position * stride_table + HALF + first).to(tl.float32)  # signed_sin's +sin half
    return x1 * cos - x2 * sin, x2 * cos + x1 * sin


@triton.jit
def qk_norm_rope_head(x1, x2, token, head, weight_ptr, cos_ptr, sin_ptr, positions_ptr, q_ptr, k_ptr, eps,
                      stride_table, KV_HEADS, HEADS: tl.constexpr, DIM: tl.constexpr, HALF: tl.constexpr):
    """One q or k head of one token, its halves ``x1``, ``x2`` loaded: normalised, rotated and stored (a seam:
    m13 loads them from a split matmul's slices)."""
    first = tl.arange(0, HALF)
    out1, out2 = qk_norm_rope_values(x1, x2, token, head, weight_ptr, cos_ptr, sin_ptr, positions_ptr, eps,
                                     stride_table, DIM, HALF)
    dtype = q_ptr.dtype.element_ty
    if head < HEADS:
        out = q_ptr + (token * HEADS + head) * DIM
    else:
        out = k_ptr + (token * KV_HEADS + head - HEADS) * DIM
    tl.store(out + first, out1.to(dtype))
    tl.store(out + HALF + first, out2.to(dtype))


def qk_norm_rope(qkv: torch.Tensor, num_heads: int, num_kv_heads: int, head_dim: int, norm_weight: torch.Tensor,
                 cos: torch.Tensor, signed_sin: torch.Tensor, positions: torch.Tensor, eps: float,
                 out: tuple[torch.Tensor, torch.Tensor] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``qkv [T, (heads + 2 kv_heads) * dim]`` (rows contiguous) -> q ``[T, heads, dim]``, k ``[T, kv_heads, dim]``:
    each head RMS-normalised with its row of ``norm_weight [heads + kv_heads, dim]``, then rotated by the angles
    of its token's position (m01's tables: ``cos`` = [cos, cos], ``signed_sin`` = [-sin, +sin]). ``out``: (q, k)
    to write into (contiguous), else new tensors."""
    tokens = qkv.shape[0]
    if out is None:
        out = (torch.empty((tokens, num_heads, head_dim), dtype=qkv.dtype, device=qkv.device),
               torch.empty((tokens, num_kv_heads, head_dim), dtype=qkv.dtype, device=qkv.device))
    q, k = out
    if tokens:
        _qk_norm_rope_kernel[(tokens, num_heads + num_kv_heads)](
            qkv, norm_weight, cos, signed_sin, positions, q, k, eps, qkv.stride(0), cos.stride(0),
            HEADS=num_heads, DIM=head_dim, HALF=head_dim // 2, num_warps=1)
    return q, k


@device_kernel
@triton.jit
def _silu_and_mul_kernel(gate_up_ptr, out_ptr, INTER: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < INTER
    gate = tl.load(gate_up_ptr + row * 2 * INTER + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(gate_up_ptr + row * 2 * INTER + INTER + cols, mask=mask, other=0.0).to(tl.float32)
    silu = gate / (1.0 + tl.exp(-gate))
    tl.store(out_ptr + row * INTER + cols, (silu * up).to(out_ptr.dtype.element_ty), mask=mask)


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """``gate_up [T, 2 * I]`` (contiguous) -> ``silu(gate_up[:, :I]) * gate_up[:, I:]``, ``[T, I]``."""
    tokens, inter = gate_up.shape[0], gate_up.shape[1] // 2
    out = torch.empty((tokens, inter), dtype=gate_up.dtype, device=gate_up.device)
    block = min(1024, triton.next_power_of_2(inter))
    if tokens:
        _silu_and_mul_kernel[(tokens, triton.cdiv(inter, block))](gate_up, out, INTER=inter, BLOCK=block,
                                                                  num_warps=4)
    return out
