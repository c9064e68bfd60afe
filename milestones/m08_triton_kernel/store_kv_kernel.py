"""Write the step's new keys and values into the paged cache: one Triton launch for K and V together.

Every layer of every step stores the K/V of the tokens it just computed before attending, at the slots the
scheduler gave them (``slot = block_id * block_size + offset``, one per token: the ``slot_mapping``). In
torch that is two ``index_copy_`` launches per layer; this kernel does both in one, and skips tokens whose
slot is negative (padding rows, as in vLLM), so a padded batch needs no spare "trash" slot.

    k, v                [num_tokens, kv_heads, head_dim]
    k_cache, v_cache    [num_blocks, block_size, kv_heads, head_dim]  (or [num_slots, kv_heads, head_dim])
    slot_mapping        [num_tokens]   k_cache.view(-1, kv_heads, head_dim)[slot_mapping[i]] = k[i]

One program copies one token: its ``kv_heads * head_dim`` contiguous elements (2 KB per tensor for
Qwen3-0.6B in bf16), for K and for V.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .device_kernel import device_kernel, runs_interpreted
from .paged_decode_kernel import SUPPORTED_DTYPES


@triton.jit
def scaled_fp8(x, scale_ptr, ROUND_FIRST: tl.constexpr):
    """``x / scale`` as float8_e4m3 (m13's FP8 cache): clamped to its largest value, 448, rounded to nearest.

    ``ROUND_FIRST``: round in float32 arithmetic, then convert a value FP8 holds exactly. Triton's interpreter
    (numpy) drops the carry when a conversion rounds up into the next power of two (7.94 becomes 4, not 8);
    compiled, the conversion itself rounds correctly and this is not needed."""
    y = tl.minimum(tl.maximum(x.to(tl.float32) / tl.load(scale_ptr), -448.0), 448.0)
    if ROUND_FIRST:
        bits = y.to(tl.int32, bitcast=True)
        # normal FP8 values keep 3 of float32's 23 mantissa bits: round the other 20 to nearest, ties to even
        normal = ((bits + 0x7FFFF + ((bits >> 20) & 1)) & -0x100000).to(tl.float32, bitcast=True)
        # below 2^-6 FP8 is subnormal, in steps of 2^-9: adding 1.5 * 2^14 (whose float32 step is 2^-9) rounds there
        magnitude = (tl.abs(y) + 24576.0) - 24576.0
        subnormal = tl.where(y < 0, -magnitude, magnitude)  # keeps the sign of a value that rounds to zero
        y = tl.where(tl.abs(y) < 0.015625, subnormal, normal)
    return y.to(tl.float8e4nv)


@device_kernel
@triton.jit
def _store_kv_kernel(k_ptr, v_ptr, k_cache_ptr, v_cache_ptr, slot_mapping_ptr,
                     stride_k_token, stride_v_token, stride_k_slot, stride_v_slot,
                     ROW: tl.constexpr, ROW_POW2: tl.constexpr,
                     k_scale_ptr, v_scale_ptr, KV_FP8: tl.constexpr, ROUND_FIRST: tl.constexpr):
    token = tl.program_id(0)
    slot = tl.load(slot_mapping_ptr + token).to(tl.int64)
    cols = tl.arange(0, ROW_POW2)
    row_len = tl.where(slot >= 0, ROW, 0)  # a negative slot marks a padding token: nothing is read or written
    mask = cols < row_len
    k = tl.load(k_ptr + token * stride_k_token + cols, mask=mask)
    v = tl.load(v_ptr + token * stride_v_token + cols, mask=mask)
    if KV_FP8:  # m13: an FP8 cache stores x / scale (one float32 scale per layer for K and for V)
        k = scaled_fp8(k, k_scale_ptr, ROUND_FIRST)
        v = scaled_fp8(v, v_scale_ptr, ROUND_FIRST)
    tl.store(k_cache_ptr + slot * stride_k_slot + cols, k, mask=mask)
    tl.store(v_cache_ptr + slot * stride_v_slot + cols, v, mask=mask)


def _row_stride(t: torch.Tensor, name: str) -> int:
    """The stride between rows of ``t`` viewed as ``[rows, kv_heads * head_dim]`` with contiguous rows (never a
    copy: the kernel writes the cache in place)."""
    try:
        rows = t.view(-1, t.shape[-2] * t.shape[-1])
    except RuntimeError:
        rows = None
    if rows is None or rows.stride(1) != 1:
        raise ValueError(f"{name} {tuple(t.shape)} must be contiguous over (kv_heads, head_dim) and viewable as "
                         "[rows, kv_heads * head_dim]")
    return rows.stride(0)


def _check(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
           slot_mapping: torch.Tensor) -> tuple[int, int, int, int]:
    """Shapes, dtypes and devices (never values); returns the row strides of k, v, k_cache and v_cache."""
    if k.dim() != 3 or v.shape != k.shape or k_cache.shape != v_cache.shape or k_cache.dim() not in (3, 4):
        raise ValueError(f"k, v must be [tokens, kv_heads, head_dim] and the caches [num_blocks, block_size, "
                         f"kv_heads, head_dim]; got k {tuple(k.shape)}, v {tuple(v.shape)}, "
                         f"k_cache {tuple(k_cache.shape)}, v_cache {tuple(v_cache.shape)}")
    if k_cache.shape[-2:] != k.shape[-2:]:
        raise ValueError(f"k has {tuple(k.shape[-2:])} (kv_heads, head_dim) per token, the cache "
                         f"{tuple(k_cache.shape[-2:])}")
    fp8_cache = k_cache.dtype == v_cache.dtype == torch.float8_e4m3fn
    if k.dtype not in SUPPORTED_DTYPES or v.dtype != k.dtype or not (fp8_cache or k_cache.dtype == v_cache.dtype
                                                                     == k.dtype):
        raise ValueError(f"k, v and the caches must share one of float32/float16/bfloat16 (or both caches "
                         f"float8_e4m3fn); got {k.dtype}, {v.dtype}, {k_cache.dtype}, {v_cache.dtype}")
    if slot_mapping.shape != (k.shape[0],) or slot_mapping.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"slot_mapping must be an int32/int64 [{k.shape[0]}] tensor; got "
                         f"{slot_mapping.dtype} {tuple(slot_mapping.shape)}")
    tensors = (k, v, k_cache, v_cache, slot_mapping)
    if any(t.device != k.device for t in tensors):
        raise ValueError(f"all tensors must be on one device; got {[str(t.device) for t in tensors]}")
    return (_row_stride(k, "k"), _row_stride(v, "v"), _row_stride(k_cache, "k_cache"),
            _row_stride(v_cache, "v_cache"))


_ROW_STRIDES: dict[tuple, tuple[int, int, int, int]] = {}  # _check's verdict per layout (as the decode wrapper's)
_MAX_LAYOUTS = 1024


def _meta(t: torch.Tensor) -> tuple:
    return t.shape, t.stride(), t.dtype, t.device


def store_kv(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
             slot_mapping: torch.Tensor, k_scale: torch.Tensor | None = None,
             v_scale: torch.Tensor | None = None) -> None:
    """``k_cache[slot_mapping[i]] = k[i]`` and the same for V, for every token i with a slot >= 0.

    With a float8_e4m3fn cache (m13) it stores ``k[i] / k_scale`` and ``v[i] / v_scale`` (one-element float32
    tensors, read on the device), clamped to +-448 and rounded to nearest."""
    key = (_meta(k), _meta(v), _meta(k_cache), _meta(v_cache), _meta(slot_mapping))
    strides = _ROW_STRIDES.get(key)
    if strides is None:  # first call with this layout: check it (every layer of a step then finds it here)
        strides = _check(k, v, k_cache, v_cache, slot_mapping)
        if len(_ROW_STRIDES) >= _MAX_LAYOUTS:
            _ROW_STRIDES.clear()
        _ROW_STRIDES[key] = strides
    kv_fp8 = k_cache.dtype == torch.float8_e4m3fn
    if kv_fp8 != (k_scale is not None) or kv_fp8 != (v_scale is not None):
        raise ValueError("k_scale and v_scale go with a float8_e4m3fn cache, and such a cache needs both; got a "
                         f"{k_cache.dtype} cache and k_scale {'given' if k_scale is not None else 'None'}, "
                         f"v_scale {'given' if v_scale is not None else 'None'}")
    if k.shape[0] == 0:
        return
    row = k.shape[-2] * k.shape[-1]
    # The kernel sees each tensor as rows of kv_heads * head_dim elements: _row_stride checked that it can.
    _store_kv_kernel[(k.shape[0],)](
        k, v, k_cache, v_cache, slot_mapping, *strides,
        ROW=row, ROW_POW2=1 << (row - 1).bit_length(), num_warps=4,
        k_scale_ptr=k_scale, v_scale_ptr=v_scale, KV_FP8=kv_fp8, ROUND_FIRST=kv_fp8 and runs_interpreted(k.device),
    )
