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

from .device_kernel import device_kernel
from .paged_decode_kernel import SUPPORTED_DTYPES


@device_kernel
@triton.jit
def _store_kv_kernel(k_ptr, v_ptr, k_cache_ptr, v_cache_ptr, slot_mapping_ptr,
                     stride_k_token, stride_v_token, stride_k_slot, stride_v_slot,
                     ROW: tl.constexpr, ROW_POW2: tl.constexpr):
    token = tl.program_id(0)
    slot = tl.load(slot_mapping_ptr + token).to(tl.int64)
    cols = tl.arange(0, ROW_POW2)
    row_len = tl.where(slot >= 0, ROW, 0)  # a negative slot marks a padding token: nothing is read or written
    mask = cols < row_len
    k = tl.load(k_ptr + token * stride_k_token + cols, mask=mask)
    v = tl.load(v_ptr + token * stride_v_token + cols, mask=mask)
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
    if k.dtype not in SUPPORTED_DTYPES or {v.dtype, k_cache.dtype, v_cache.dtype} != {k.dtype}:
        raise ValueError(f"k, v and the caches must share one of float32/float16/bfloat16; got {k.dtype}, "
                         f"{v.dtype}, {k_cache.dtype}, {v_cache.dtype}")
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
             slot_mapping: torch.Tensor) -> None:
    """``k_cache[slot_mapping[i]] = k[i]`` and the same for V, for every token i with a slot >= 0."""
    key = (_meta(k), _meta(v), _meta(k_cache), _meta(v_cache), _meta(slot_mapping))
    strides = _ROW_STRIDES.get(key)
    if strides is None:  # first call with this layout: check it (every layer of a step then finds it here)
        strides = _check(k, v, k_cache, v_cache, slot_mapping)
        if len(_ROW_STRIDES) >= _MAX_LAYOUTS:
            _ROW_STRIDES.clear()
        _ROW_STRIDES[key] = strides
    if k.shape[0] == 0:
        return
    row = k.shape[-2] * k.shape[-1]
    # The kernel sees each tensor as rows of kv_heads * head_dim elements: _row_stride checked that it can.
    _store_kv_kernel[(k.shape[0],)](
        k, v, k_cache, v_cache, slot_mapping, *strides,
        ROW=row, ROW_POW2=1 << (row - 1).bit_length(), num_warps=4,
    )
