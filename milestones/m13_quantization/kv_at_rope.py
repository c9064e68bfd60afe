"""The new token's K and V written into the paged cache by the kernel that makes them, not by a launch after it.

Every layer of a decode step stores the token's K/V in the cache before attending (m08's ``store_kv``: one
launch a layer, a 2 KB row of K and one of V at batch 1 for Qwen3-8B). At batch 1 the step is a chain of
launches, each a few µs, and the store is one of them: 36 a step, about 1.2 µs of GPU time each (in a graph the
kernels follow each other with almost no gap, so that is what a kernel fewer saves).

q/k norm + RoPE over q/k/v's slices (``sliced_sums.py``) already holds each K head as it rotates it, and each V
head as it adds its slices; here it writes them at the token's slot of the cache instead of into k and v, and
the attention runs its decode kernel over the cache straight away::

    before:  q, k, v = rope(slices);  store_kv(k, v, cache, slots);  heads = decode(q, cache)
    here:    q = rope(slices), with k, v written at cache[slots];    heads = decode(q, cache)

The values are the same bits: each is rounded to the model's dtype as k and v would hold it, then stored as
``store_kv`` stores it (unchanged, or divided by an FP8 cache's scale with m08's ``scaled_fp8``); a negative
slot (a padding row of a graph) writes nothing, as there. ``epilogue_layers.py`` does this in a decode graph's
attention, where q/k/v left its slices (``ROPE_STORES_KV``). On the H200 the batch-1 step of Qwen3-8B's shape took
2.116 ms against 2.136 with the store's launch, 2.36x bf16's against 2.34x (call 99, the journal's seventeenth
guess): 20 µs, half what the cost model said, since RoPE's kernel took 6 µs more for the stores it took over.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from milestones.m08_triton_kernel.store_kv_kernel import scaled_fp8


@dataclass(frozen=True)
class CacheSlots:
    """Where a step's K/V go: one layer's caches ``[slots, kv_heads, dim]`` (or ``[blocks, block_size, kv_heads,
    dim]``), each token's slot (negative: a padding row, not written), and an FP8 cache's two scales."""

    k_cache: torch.Tensor
    v_cache: torch.Tensor
    slot_mapping: torch.Tensor
    k_scale: torch.Tensor | None = None
    v_scale: torch.Tensor | None = None

    def row_strides(self, tokens: int, kv_heads: int, head_dim: int, dtype: torch.dtype,
                    device: torch.device) -> tuple[int, int]:
        """The caches' strides from one slot to the next, after checking what the kernel assumes (never values)."""
        tensors = [self.k_cache, self.v_cache, self.slot_mapping, self.k_scale, self.v_scale]
        if any(t is not None and t.device != device for t in tensors):
            raise ValueError(f"the caches, slot_mapping and scales must be on {device}; got "
                             f"{[str(t.device) for t in tensors if t is not None]}")
        fp8 = self.k_cache.dtype == torch.float8_e4m3fn
        if self.k_cache.dtype != self.v_cache.dtype or not (fp8 or self.k_cache.dtype == dtype):
            raise ValueError(f"the caches must hold {dtype} (or both float8_e4m3fn); got {self.k_cache.dtype}, "
                             f"{self.v_cache.dtype}")
        if fp8 != (self.k_scale is not None) or fp8 != (self.v_scale is not None):
            raise ValueError("k_scale and v_scale go with a float8_e4m3fn cache, and such a cache needs both")
        if self.slot_mapping.shape != (tokens,) or self.slot_mapping.dtype not in (torch.int32, torch.int64):
            raise ValueError(f"slot_mapping must be an int32/int64 [{tokens}] tensor; got "
                             f"{self.slot_mapping.dtype} {tuple(self.slot_mapping.shape)}")
        strides = []
        for name, cache in (("k_cache", self.k_cache), ("v_cache", self.v_cache)):
            rows = None
            if cache.shape[-2:] == (kv_heads, head_dim) and cache.stride(-1) == 1 and cache.stride(-2) == head_dim:
                try:  # slots one stride apart: [slots, ...], or [blocks, block_size, ...] with the blocks dense
                    rows = cache.view(-1, kv_heads * head_dim)
                except RuntimeError:
                    pass
            if rows is None:
                raise ValueError(f"{name} {tuple(cache.shape)} must end in ({kv_heads}, {head_dim}), contiguous, "
                                 "its slots one stride apart")
            strides.append(rows.stride(0))
        return strides[0], strides[1]


@triton.jit
def store_head_at_slot(x1, x2, token, kv_head, cache_ptr, slot_ptr, stride_slot, scale_ptr, DIM: tl.constexpr,
                       HALF: tl.constexpr, KV_FP8: tl.constexpr, ROUND_FIRST: tl.constexpr):
    """One K or V head's halves, already in the model's dtype, at its token's slot as ``store_kv`` stores them."""
    first = tl.arange(0, HALF)
    slot = tl.load(slot_ptr + token).to(tl.int64)
    keep = first < tl.where(slot >= 0, HALF, 0)  # a negative slot marks a padding row: nothing is written
    if KV_FP8:
        x1 = scaled_fp8(x1, scale_ptr, ROUND_FIRST)
        x2 = scaled_fp8(x2, scale_ptr, ROUND_FIRST)
    out = cache_ptr + slot * stride_slot + kv_head * DIM
    tl.store(out + first, x1, mask=keep)
    tl.store(out + HALF + first, x2, mask=keep)
