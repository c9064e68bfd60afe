"""A split GEMV's last step left to the kernel that reads its output: the slices of K added where they are read.

A batch-1 GEMV with few rows of W cuts K into slices so that every SM has programs to run (o_proj: 64 blocks of
64 rows, each in 8 slices). Each slice's sums must then be added, and the GEMV does it at its end: every program
stores its float32 sums, counts itself done on its block's counter (an atomic), and the last of a block's slices
reads them all back and stores the output (``matmul_kernels.py``). That finish is a chain of latencies (the store,
the count, the loads, the store) that nothing overlaps, at the end of a kernel of 5-10 µs.

The kernel after the GEMV reads every output anyway. So where it is m13's own, the GEMV stores its slices and
ends, and the reader loads the slices instead of the output and adds them, in slice order, as it loads::

    finished:  q/k/v, o, down = gemv(x)  [slices -> count -> the last adds]  ->  the next kernel reads the output
    here:      parts = gemv(x)  [slices stored]                              ->  the next kernel adds the parts

The same float32 additions in the same order, rounded to the activations' dtype as the GEMV would store them:
the same bits. The readers are the norm after o_proj and down_proj (``deferred_norm.py``, or the exact one,
``integer_norm.py``) and, here, q/k norm + RoPE after q/k/v (m12's arithmetic, ``qk_norm_rope_head``), which also
writes v, the one part of q/k/v it does not rotate; after a deferred norm it multiplies each row's sums by the
norm's 1 / rms first. ``epilogue_layers.py`` decides where (int4's GEMV on ``dp4a``). On the H200 the batch-1
step went from 2.18x bf16's to 2.24x, 2 rows from 1.83x to 1.93x, 4 from 1.29x to 1.39x
(``results/h200/m13_step_times+sliced-sums.json``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from milestones.m08_triton_kernel.device_kernel import device_kernel, runs_interpreted
from milestones.m12_async_scheduling.fused_kernels import qk_norm_rope_head, qk_norm_rope_values

from .gemv_epilogues import row_rstd
from .kv_at_rope import CacheSlots, store_head_at_slot

# warps a (token, head) program of q/k norm + RoPE over the slices: 2 were no faster in the batch-1 step on the H200
# (2.31x bf16's against 2.33x, results/h200/m13_step_times+launch-knobs.json)
ROPE_WARPS = 1


@dataclass(frozen=True)
class SlicedSums:
    """A GEMV's output left unadded: ``parts`` ``[slices, M, N or more]`` float32, each slice of K's sums; the
    output is their sum in slice order, rounded to ``dtype``. ``row_squares`` (with ``eps`` and x's ``x_dim`` values a
    row): x was a deferred norm's (``deferred_norm.py``), and each row's sum is multiplied by its 1 / rms before
    the rounding."""

    parts: torch.Tensor
    dtype: torch.dtype
    row_squares: torch.Tensor | None = None
    eps: float = 0.0
    x_dim: int = 0

    def norm_can_add(self, dtype: torch.dtype) -> bool:
        """Whether a norm may add these slices into a residual of ``dtype``: float32 parts contiguous along N, no
        deferred 1 / rms (only q/k norm + RoPE multiplies by one), rounded to that dtype."""
        return (self.parts.dtype == torch.float32 and self.parts.stride(-1) == 1 and self.row_squares is None
                and self.dtype == dtype)


@triton.jit
def add_slices(first_slice, mask, stride_slice, SLICES: tl.constexpr):
    """The slices' sums at ``first_slice``'s offsets added in slice order (their loads go out together)."""
    total = tl.load(first_slice, mask=mask, other=0.0)
    for s in tl.static_range(1, SLICES):
        total += tl.load(first_slice + s * stride_slice, mask=mask, other=0.0)
    return total


@triton.jit
def head_from_slices(parts_ptr, token, head, stride_pm, stride_slice, rsq_ptr, stride_rsq, x_dim, x_eps, dtype,
                     wanted, SLICES: tl.constexpr, DIM: tl.constexpr, HALF: tl.constexpr, ROW_NORM_PARTS: tl.constexpr,
                     ROW_NORM_POW2: tl.constexpr):
    """The halves of one token's q, k or v head (``head``: a number, or ``[rows, 1]`` of them): its slices added,
    times x's deferred 1 / rms (the input norm's, over its ``x_dim`` values) where ``ROW_NORM_PARTS``, each value
    rounded to ``dtype`` as the GEMV would have stored it. Not ``wanted`` (a condition of the program): zeros, and
    nothing loaded."""
    first = tl.arange(0, HALF)
    row = parts_ptr + token * stride_pm + head * DIM + first
    loaded = first < tl.where(wanted, HALF, 0)
    x1 = add_slices(row, loaded, stride_slice, SLICES)
    x2 = add_slices(row + HALF, loaded, stride_slice, SLICES)
    if ROW_NORM_PARTS > 0:
        rstd = row_rstd(rsq_ptr + token * stride_rsq, ROW_NORM_PARTS, ROW_NORM_POW2, x_dim, x_eps)
        x1 = x1 * rstd
        x2 = x2 * rstd
    return x1.to(dtype), x2.to(dtype)


@device_kernel
@triton.jit
def _sliced_qk_norm_rope_kernel(parts_ptr, weight_ptr, cos_ptr, sin_ptr, positions_ptr, q_ptr, k_ptr, v_ptr, eps,
                                rsq_ptr, x_eps, x_dim, stride_slice, stride_pm, stride_table, stride_rsq,
                                k_cache_ptr, v_cache_ptr, slot_ptr, stride_k_slot, stride_v_slot, k_scale_ptr,
                                v_scale_ptr, SLICES: tl.constexpr, HEADS: tl.constexpr, KV_HEADS: tl.constexpr,
                                DIM: tl.constexpr, HALF: tl.constexpr, ROW_NORM_PARTS: tl.constexpr,
                                ROW_NORM_POW2: tl.constexpr, TO_CACHE: tl.constexpr, KV_FP8: tl.constexpr,
                                ROUND_FIRST: tl.constexpr):
    token = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)  # query heads, then K heads, then V heads
    first = tl.arange(0, HALF)
    dtype = q_ptr.dtype.element_ty
    x1, x2 = head_from_slices(parts_ptr, token, head, stride_pm, stride_slice, rsq_ptr, stride_rsq, x_dim, x_eps,
                              dtype, True, SLICES, DIM, HALF, ROW_NORM_PARTS, ROW_NORM_POW2)
    if head < HEADS or (head < HEADS + KV_HEADS and not TO_CACHE):
        qk_norm_rope_head(x1, x2, token, head, weight_ptr, cos_ptr, sin_ptr, positions_ptr, q_ptr, k_ptr, eps,
                          stride_table, KV_HEADS, HEADS, DIM, HALF)
    elif head < HEADS + KV_HEADS:  # K, rotated and rounded as k would hold it, at the token's slot
        k1, k2 = qk_norm_rope_values(x1, x2, token, head, weight_ptr, cos_ptr, sin_ptr, positions_ptr, eps,
                                     stride_table, DIM, HALF)
        store_head_at_slot(k1.to(dtype), k2.to(dtype), token, head - HEADS, k_cache_ptr, slot_ptr, stride_k_slot,
                           k_scale_ptr, DIM, HALF, KV_FP8, ROUND_FIRST)
    elif TO_CACHE:
        store_head_at_slot(x1, x2, token, head - HEADS - KV_HEADS, v_cache_ptr, slot_ptr, stride_v_slot,
                           v_scale_ptr, DIM, HALF, KV_FP8, ROUND_FIRST)
    else:
        out = v_ptr + (token * KV_HEADS + head - HEADS - KV_HEADS) * DIM
        tl.store(out + first, x1)
        tl.store(out + HALF + first, x2)


def sliced_qk_norm_rope(qkv: SlicedSums, num_heads: int, num_kv_heads: int, head_dim: int,
                        norm_weight: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor,
                        positions: torch.Tensor, eps: float, cache: CacheSlots | None = None
                        ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """m12's ``qk_norm_rope`` of q/k/v left in slices: q ``[T, heads, dim]``, k and v ``[T, kv_heads, dim]``; or,
    given the ``cache``'s slots, q, and k and v written there instead (``kv_at_rope.py``): then (q, None, None)."""
    slices, tokens, width = qkv.parts.shape
    if width < (num_heads + 2 * num_kv_heads) * head_dim or qkv.parts.stride(-1) != 1:
        raise ValueError(f"q/k/v's slices must hold {(num_heads + 2 * num_kv_heads) * head_dim} outputs a row, "
                         f"contiguous; got {tuple(qkv.parts.shape)}")
    q = torch.empty((tokens, num_heads, head_dim), dtype=qkv.dtype, device=qkv.parts.device)
    if cache is None:
        k, v = (torch.empty((tokens, num_kv_heads, head_dim), dtype=qkv.dtype, device=q.device) for _ in range(2))
        kv_out, to_cache = (k, v), (q, q, q, 0, 0, None, None)  # q: a stand-in pointer the kernel never uses
    else:
        k = v = None
        kv_out = (q, q)
        to_cache = (cache.k_cache, cache.v_cache, cache.slot_mapping,
                    *cache.row_strides(tokens, num_kv_heads, head_dim, qkv.dtype, q.device), cache.k_scale,
                    cache.v_scale)
    kv_fp8 = to_cache[-1] is not None
    squares = qkv.row_squares
    parts = 0 if squares is None else squares.shape[1]
    if tokens:
        _sliced_qk_norm_rope_kernel[(tokens, num_heads + 2 * num_kv_heads)](
            qkv.parts, norm_weight, cos, signed_sin, positions, q, *kv_out, eps, q if squares is None else squares,
            qkv.eps, qkv.x_dim, qkv.parts.stride(0), qkv.parts.stride(1), cos.stride(0),
            0 if squares is None else squares.stride(0), *to_cache, SLICES=slices, HEADS=num_heads,
            KV_HEADS=num_kv_heads, DIM=head_dim, HALF=head_dim // 2, ROW_NORM_PARTS=parts,
            ROW_NORM_POW2=triton.next_power_of_2(max(parts, 1)), TO_CACHE=cache is not None, KV_FP8=kv_fp8,
            ROUND_FIRST=kv_fp8 and runs_interpreted(q.device), num_warps=ROPE_WARPS)
    return q, k, v
