"""RMSNorm with its one global number left to the matmul that reads it: the norm spread over the GPU.

An RMSNorm row is ``h * w / rms(h)``: everything in it is elementwise except ``1 / rms(h)``, one number per row
that needs every value of the row. m13's norm that writes the GEMV's integers (``integer_norm.py``) therefore
runs in one program a row, and after o_proj and down_proj that program also adds the GEMV's slices of K
(``sliced_sums.py``): 8 slices of 4,096 float32 sums, 128 KiB read by one SM of 132, 3.6 µs a norm on the H200.

But the integers do not need ``1 / rms``: int4's GEMV multiplies x as 16-bit integers per group of 128 with a scale
per group (``integer_dots.py``), and a scale common to the whole row can as well multiply the GEMV's sums at the
end. So the norm is cut at that number:

    exact:     x = round(h * w * (1 / rms));  words(x)          ->  GEMV: sums of W x
    deferred:  words(h * w), and sum(h^2) in parts            ->  GEMV: (sums of W (h * w)) * (1 / rms)

Every part is now local to its group of inputs: the norm runs as 8 programs a row (``GROUPS_PER_PROGRAM`` groups
each), each adding its columns' slices, updating its part of the residual stream, writing its groups' integers and
its part of the sum of squares. The reader adds the parts (a few floats) and multiplies: q/k norm + RoPE after
q/k/v (``sliced_sums.py``), the SiLU epilogue of gate_up's GEMV (``gemv_epilogues.row_rstd``).

On the H200 a norm took 2.40 µs a launch in the batch-1 step instead of 3.58, and the step was 2.34x bf16's
against 2.24x with the exact norm, 2.03x against 1.96x at 2 rows (``results/h200/m13_step_times+deferred-norm.json``,
``m13_step_kernels+deferred-norm.json``).

What changes in the numbers: the exact path rounds ``h * w / rms`` to bf16 before making it integers; here ``h * w``
is made integers straight from float32 (16 bits against its group's largest, finer than bf16's 8 for every input
at least 1/128 of it) and ``1 / rms`` multiplies float32 sums. Neither is m12's bf16 arithmetic to the bit; both are
int4's engine, whose logits quant_step measures against bf16's at 1-4 rows (the same on
``qwen3-8b-random`` either way, call 97).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from milestones.m08_triton_kernel.device_kernel import device_kernel

from .integer_dots import int16_x_words, store_int16_groups
from .quantize import GROUP_SIZE
from .sliced_sums import SlicedSums, add_slices

# groups of 128 inputs a program: 8 programs a row of 4,096 (16 programs, 2 groups each, were no faster in the batch-1
# step on the H200: results/h200/m13_step_times+launch-knobs.json)
GROUPS_PER_PROGRAM = 4


@dataclass(frozen=True)
class DeferredRows:
    """RMSNorm(h) * w with 1 / rms left out: ``words``, ``int16_x``'s form of ``h * w`` (``[M,
    int16_x_words(dim)]`` int32), and ``squares`` ``[M, parts]`` float32, each row's sum of h^2 in parts; the reader
    multiplies its sums by ``1 / sqrt(sum(squares) / dim + eps)`` (``gemv_epilogues.row_rstd``)."""

    words: torch.Tensor
    squares: torch.Tensor
    eps: float
    dim: int
    dtype: torch.dtype

    def stand_in(self) -> torch.Tensor:
        """An ``[M, dim]`` tensor of the model's dtype, never written or read: what a matmul's shape checks see
        in place of x, whose integers are ``words``."""
        return torch.empty((self.words.shape[0], self.dim), dtype=self.dtype, device=self.words.device)


@device_kernel
@triton.jit
def _deferred_norm_kernel(x_ptr, residual_ptr, weight_ptr, words_ptr, squares_ptr, stride_slice, stride_xm,
                          stride_wm, stride_sq, SLICES: tl.constexpr, D: tl.constexpr, CHUNK: tl.constexpr,
                          GROUP: tl.constexpr, ADD: tl.constexpr = True):
    """One row's ``CHUNK`` columns: x (a matmul's output, or its ``SLICES`` slices of float32 sums added) plus the
    residual, stored back as m12's addition rounds it; the part's sum of squares; the integers of ``h * w``.
    Without ``ADD`` the residual is the row itself (the embedding's, before layer 0), read and not written."""
    row = tl.program_id(0).to(tl.int64)
    part = tl.program_id(1)
    cols = part * CHUNK + tl.arange(0, CHUNK)
    dtype = residual_ptr.dtype.element_ty
    if SLICES == 0:
        x = tl.load(x_ptr + row * stride_xm + cols)
    else:  # the matmul's output as its GEMV would have stored it
        x = add_slices(x_ptr + row * stride_xm + cols, cols < D, stride_slice, SLICES).to(dtype)
    if ADD:
        summed = (x.to(tl.float32) + tl.load(residual_ptr + row * D + cols).to(tl.float32)).to(dtype)
        tl.store(residual_ptr + row * D + cols, summed)
    else:
        summed = x
    s = summed.to(tl.float32)
    tl.store(squares_ptr + row * stride_sq + part, tl.sum(s * s, axis=0))
    groups = part * (CHUNK // GROUP) + tl.arange(0, CHUNK // GROUP)
    scaled = tl.reshape(s * tl.load(weight_ptr + cols).to(tl.float32), [CHUNK // GROUP, GROUP])
    store_int16_groups(scaled, groups, groups < D // GROUP, words_ptr + row * stride_wm, D, CHUNK // GROUP, GROUP)


def deferred_rms_norm(residual: torch.Tensor, weight: torch.Tensor, eps: float) -> DeferredRows:
    """RMSNorm(residual) * weight with 1 / rms deferred, the residual only read: layer 0's input norm, over the
    embedding's rows (``[T, D]`` contiguous, D a multiple of 128)."""
    return _deferred_norm(residual, residual, weight, eps, add=False)


def deferred_add_rms_norm(x: torch.Tensor | SlicedSums, residual: torch.Tensor, weight: torch.Tensor,
                          eps: float) -> DeferredRows:
    """``residual += x`` in place; returns RMSNorm(residual) * weight with 1 / rms deferred (``DeferredRows``).
    ``x``: ``[T, D]`` contiguous in the residual's dtype, or a GEMV's slices of it; D a multiple of 128."""
    return _deferred_norm(x, residual, weight, eps, add=True)


def _deferred_norm(x: torch.Tensor | SlicedSums, residual: torch.Tensor, weight: torch.Tensor, eps: float, *,
                   add: bool) -> DeferredRows:
    tokens, dim = residual.shape
    sliced = isinstance(x, SlicedSums)
    rows = x.parts[0] if sliced else x
    if (dim % GROUP_SIZE or rows.shape[0] != tokens or rows.shape[1] < dim or rows.stride(-1) != 1
            or not residual.is_contiguous() or (sliced and not x.norm_can_add(residual.dtype))
            or (not sliced and (rows.shape[1] != dim or rows.dtype != residual.dtype))):
        raise ValueError(f"deferred_add_rms_norm needs x and the residual as [T, D] in one dtype, D a multiple of "
                         f"{GROUP_SIZE} (x contiguous along D, or a GEMV's float32 slices of [T, D] or wider, with "
                         f"no deferred 1 / rms); got x {tuple(rows.shape)}, residual {residual.dtype} "
                         f"{tuple(residual.shape)}")
    groups = dim // GROUP_SIZE
    per_program = next(g for g in (GROUPS_PER_PROGRAM, 2, 1) if groups % g == 0)
    words = torch.empty((tokens, int16_x_words(dim)), dtype=torch.int32, device=residual.device)
    squares = torch.empty((tokens, groups // per_program), dtype=torch.float32, device=residual.device)
    if tokens:
        source = x.parts if sliced else x
        _deferred_norm_kernel[(tokens, groups // per_program)](
            source, residual, weight, words, squares, source.stride(0) if sliced else 0, rows.stride(0),
            words.stride(0), squares.stride(0), SLICES=x.parts.shape[0] if sliced else 0, D=dim,
            CHUNK=per_program * GROUP_SIZE, GROUP=GROUP_SIZE, ADD=add, num_warps=4)
    return DeferredRows(words, squares, eps, dim, residual.dtype)
