"""x turned into integers where it is made: the add + RMSNorm that also writes the next GEMV's 16-bit x.

int4's GEMV multiplies x as 16-bit integers (``dp4a``, ``integer_dots.py``), and ``int16_x`` converts x in a
small launch of its own before each matmul: at batch 1 about 1.4 µs, as long as the loop's saving on the short
matmuls. Two of a layer's four matmuls, q/k/v and gate_up, read the output of an add + RMSNorm, a kernel whose
one program per row already holds the whole row in registers. There the conversion costs a few instructions
(each group's largest value and its reciprocal, a multiply per input, the bytes packed four to a word) and no
launch::

    before:  h = add_rms_norm(o, residual, w)     x = int16_x(h)     gate_up(h, x)       three launches
    here:    h, x = add_rms_norm_int16(o, residual, w)               gate_up(h, x)       two

The arithmetic is m12's ``add_rms_norm`` (its kernel's row, ``add_rms_norm_row``, called as it is), and the words
are ``int16_x``'s of that output, so the GEMV sees the same integers to the bit
either way. ``IntegerRows`` carries both forms from the norm to the matmul that reads them
(``epilogue_layers.py`` decides where: a norm whose reader multiplies on ``dp4a``).

After o_proj and down_proj the norm can also add the GEMV's slices of K itself (``sliced_sums.py``). Since call 97
the decode graphs run the deferred norm instead (``deferred_norm.py``: 1 / rms left to the readers, 8 programs a
row); this exact one runs where ``epilogue_layers.DEFERRED_NORM_MAX_ROWS`` is set below the step's rows.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from milestones.m08_triton_kernel.device_kernel import device_kernel
from milestones.m12_async_scheduling.fused_kernels import add_rms_norm_row, add_rms_norm_values

from .integer_dots import int16_x_words, store_int16_groups
from .quantize import GROUP_SIZE
from .sliced_sums import SlicedSums, add_slices


# One program a row. With 16 warps a row of 4,096 is 8 values a thread: the conversion's chain (the groups'
# largest values, the packing) is short. On the H200, 36 launches in a graph took 2.29 µs each at 4 warps and
# 2.24 at 16 (3.29 and 2.48 when each input was divided); the step was 2.09x bf16 against 2.00x at 4 warps with a
# division per input (results/h200/integer_norm_warps.json, m13_step_times+integer-norm-warps.json).
NORM_WARPS = 16


@dataclass(frozen=True)
class IntegerRows:
    """Rows of x in two forms: ``x`` ``[M, K]`` in the model's dtype, and ``words``, the same values as
    ``int16_x`` writes them (``[M, int16_x_words(K)]`` int32) for a GEMV on ``dp4a``."""

    x: torch.Tensor
    words: torch.Tensor


@triton.jit
def _store_row_words(normed, words_ptr, row, stride_wm, D: tl.constexpr, BLOCK: tl.constexpr, GROUP: tl.constexpr):
    """The row as the GEMV's integers: groups of GROUP from the values just rounded (past D: zeros, not stored)."""
    groups = tl.arange(0, BLOCK // GROUP)
    grouped = tl.reshape(normed.to(tl.float32), [BLOCK // GROUP, GROUP])
    store_int16_groups(grouped, groups, groups < D // GROUP, words_ptr + row * stride_wm, D, BLOCK // GROUP, GROUP)


@device_kernel
@triton.jit
def _add_rms_norm_int16_kernel(x_ptr, residual_ptr, weight_ptr, out_ptr, words_ptr, eps, stride_wm,
                               D: tl.constexpr, BLOCK: tl.constexpr, GROUP: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    normed = add_rms_norm_row(x_ptr, residual_ptr, weight_ptr, out_ptr, row, eps, D, BLOCK)  # m12's, as it stores it
    _store_row_words(normed, words_ptr, row, stride_wm, D, BLOCK, GROUP)


@device_kernel
@triton.jit
def _slices_add_rms_norm_int16_kernel(parts_ptr, residual_ptr, weight_ptr, out_ptr, words_ptr, eps, stride_slice,
                                      stride_pm, stride_wm, SLICES: tl.constexpr, D: tl.constexpr,
                                      BLOCK: tl.constexpr, GROUP: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    total = add_slices(parts_ptr + row * stride_pm + cols, cols < D, stride_slice, SLICES)
    x = total.to(out_ptr.dtype.element_ty)  # the matmul's output as the GEMV would have stored it
    normed = add_rms_norm_values(x, residual_ptr, weight_ptr, out_ptr, row, eps, D, BLOCK)
    _store_row_words(normed, words_ptr, row, stride_wm, D, BLOCK, GROUP)


def add_rms_norm_int16(x: torch.Tensor | SlicedSums, residual: torch.Tensor, weight: torch.Tensor,
                       eps: float) -> IntegerRows:
    """``residual += x`` in place; returns ``RMSNorm(residual) * weight`` and the same rows as ``int16_x``'s
    words. ``[T, D]`` contiguous, D a multiple of 128 (int4's group). ``x`` may be a GEMV's unadded slices."""
    tokens, dim = residual.shape
    sliced = isinstance(x, SlicedSums)
    rows = x.parts[0] if sliced else x
    if (dim % GROUP_SIZE or rows.shape[0] != tokens or rows.shape[1] < dim or not residual.is_contiguous()
            or (not sliced and (rows.shape[1] != dim or not x.is_contiguous()))
            or (sliced and not x.norm_can_add(residual.dtype))):
        raise ValueError(f"add_rms_norm_int16 needs x and the residual as contiguous [T, D] with D a multiple of "
                         f"{GROUP_SIZE} (or x a GEMV's float32 slices of [T, D] or wider, for a residual of their "
                         f"dtype, with no deferred 1 / rms); got x {tuple(rows.shape)}, residual {residual.dtype} "
                         f"{tuple(residual.shape)}")
    out = torch.empty_like(residual)
    words = torch.empty((tokens, int16_x_words(dim)), dtype=torch.int32, device=residual.device)
    constants = dict(D=dim, BLOCK=triton.next_power_of_2(dim), GROUP=GROUP_SIZE, num_warps=NORM_WARPS)
    if tokens and sliced:
        _slices_add_rms_norm_int16_kernel[(tokens,)](x.parts, residual, weight, out, words, eps, x.parts.stride(0),
                                                     x.parts.stride(1), words.stride(0), SLICES=x.parts.shape[0],
                                                     **constants)
    elif tokens:
        _add_rms_norm_int16_kernel[(tokens,)](x, residual, weight, out, words, eps, words.stride(0), **constants)
    return IntegerRows(out, words)
