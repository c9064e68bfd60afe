"""q/k norm + RoPE done by the decode kernel's own programs, not by a kernel before it.

At batch 1 a decode graph runs, per layer, q/k/v's GEMV, then q/k norm + RoPE over its slices (which also writes
the token's K/V into the cache, ``kv_at_rope.py``), then m08's decode kernel, then the combine. The RoPE kernel is
a chain of latencies (the slices' loads, the norm, the rotation, the stores): 2.0 µs a layer on the H200, and the
step without it would be 87 µs shorter (call 120's ceiling). Its work is small enough to repeat: each decode program
needs only its own K/V head's group of query heads, and only one program of each K/V head reads the new key::

    before:  q = rope(slices), K/V -> cache;          out = decode(q, cache)            two kernels
    here:    each (sequence, K/V head, split) program:
               q (its group: 4 query heads in Qwen3-8B) = rope(slices), in registers
               the split that holds the last key: K/V -> cache, then a barrier
               m08's loop over its keys with that q                                   one kernel

m08's kernel is three ``@triton.jit`` functions around a short kernel (``split_keys``, ``first_blocks``,
``decode_keys``), so this kernel calls the same code, with q made where m08 loads it. The slices' loads go out
with m08's first (the sequence's length), in every program: a split that holds no keys (41 of 49 at 512 keys, in
a graph that serves 4,096) makes a q it never uses, rather than every program waiting for the length before it
loads the slices.
``tl.debug_barrier()`` (``bar.sync``) orders the K/V stores of the program that makes them before any of its
threads loads the keys; no other program reads them.

The values are ``sliced_sums.py``'s arithmetic: the slices added in slice order, times the deferred 1 / rms,
rounded as the GEMV would have stored them, normalised and rotated with m12's ``qk_norm_rope_values`` (here on a
``[group, HALF]`` block of heads, whose squares a GPU may add in another order: q's last bit can differ), K/V
stored as ``store_head_at_slot`` stores them. ``epilogue_layers.py`` uses it where ``ROPE_IN_DECODE`` says.

What it buys is less than the ceiling: one kernel does what two did, one chain after the other. On the H200 the
fused kernel took 6.74 µs a layer against 4.79 + 2.04 for the two (call 126's profile, one run, of a version where
only the splits that hold keys made q), and the batch-1 step 22 µs less than with RoPE's kernel (2.46x bf16's
against 2.43x, call 128), 41 µs at two rows (the journal's twenty-third guess).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from milestones.m08_triton_kernel.device_kernel import device_kernel, runs_interpreted
from milestones.m08_triton_kernel.paged_decode_kernel import decode_keys, first_blocks, split_keys
from milestones.m10_cuda_graphs.graph_runner import GraphDecodeAttention
from milestones.m12_async_scheduling.fused_kernels import qk_norm_rope_values

from .kv_at_rope import CacheSlots, store_head_at_slot
from .sliced_sums import SlicedSums, head_from_slices


@device_kernel
@triton.jit(do_not_specialize=["num_splits", "max_blocks", "stride_table"])
def _rope_decode_kernel(
    # m08's _paged_decode_kernel's arguments, in its order (q_ptr: only its dtype is read, q is made here)
    q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, context_lens_ptr, out_ptr, lse_ptr,
    scale_log2, num_splits, max_blocks,
    stride_q_seq, stride_q_head,
    stride_k_block, stride_k_slot, stride_k_head,
    stride_v_block, stride_v_slot, stride_v_head,
    stride_table, stride_out_seq, stride_out_head, stride_out_split,
    GROUP: tl.constexpr, GROUP_ROWS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    TILE: tl.constexpr, SPLIT: tl.constexpr, DOT_FP32: tl.constexpr, IEEE: tl.constexpr,
    k_scale_ptr, v_scale_ptr, KV_FP8: tl.constexpr, FP8_WORDS: tl.constexpr, PTX: tl.constexpr,
    # and what q/k norm + RoPE over the slices reads (sliced_sums.py), and where K/V go (kv_at_rope.py)
    parts_ptr, weight_ptr, cos_ptr, sin_ptr, positions_ptr, slot_ptr, eps, rsq_ptr, x_eps, x_dim, stride_slice,
    stride_pm, stride_rope_table, stride_rsq, stride_k_row, stride_v_row,
    SLICES: tl.constexpr, HEADS: tl.constexpr, ROW_NORM_PARTS: tl.constexpr, ROW_NORM_POW2: tl.constexpr,
    GROUP_POW2: tl.constexpr, ROUND_FIRST: tl.constexpr,
):
    """One (sequence, K/V head, split): m08's program, its query rows made from the slices instead of loaded, and
    the new K/V stored first by the split whose keys hold the last one."""
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    token = seq.to(tl.int64)
    half: tl.constexpr = HEAD_DIM // 2
    dtype = q_ptr.dtype.element_ty
    # m08's first loads (the length, then the first tile's blocks) go out beside the slices'.
    start, end, context_len = split_keys(context_lens_ptr, seq, split, num_splits, max_blocks, BLOCK_SIZE, TILE,
                                         SPLIT)
    next_blocks = first_blocks(block_tables_ptr, seq, stride_table, start, end, BLOCK_SIZE, TILE)
    stores_kv = (start < end) & (end == context_len)  # the split that holds the last key
    rows = tl.arange(0, GROUP_POW2)[:, None]
    heads = kv_head * GROUP + tl.minimum(rows, GROUP - 1)  # padding rows repeat the last head (zeroed below)
    # Every split makes q, those without keys too: its loads then wait for nothing (only the length's would say
    # which splits hold keys; waiting for it cost 9 µs a step, call 128).
    x1, x2 = head_from_slices(parts_ptr, token, heads, stride_pm, stride_slice, rsq_ptr, stride_rsq, x_dim, x_eps,
                              dtype, True, SLICES, HEAD_DIM, half, ROW_NORM_PARTS, ROW_NORM_POW2)
    k_head = HEADS + kv_head
    k1, k2 = head_from_slices(parts_ptr, token, k_head, stride_pm, stride_slice, rsq_ptr, stride_rsq, x_dim, x_eps,
                              dtype, stores_kv, SLICES, HEAD_DIM, half, ROW_NORM_PARTS, ROW_NORM_POW2)
    v1, v2 = head_from_slices(parts_ptr, token, k_head + tl.num_programs(1), stride_pm, stride_slice, rsq_ptr,
                              stride_rsq, x_dim, x_eps, dtype, stores_kv, SLICES, HEAD_DIM, half, ROW_NORM_PARTS,
                              ROW_NORM_POW2)
    q1, q2 = qk_norm_rope_values(x1, x2, token, heads, weight_ptr, cos_ptr, sin_ptr, positions_ptr, eps,
                                 stride_rope_table, HEAD_DIM, half)
    # The halves side by side, rounded as q would be stored, the group repeated down m08's GROUP_ROWS (at least 16:
    # a dot's least M) and every row past the group zeroed, as m08 loads q.
    q = tl.reshape(tl.permute(tl.join(q1.to(dtype), q2.to(dtype)), (0, 2, 1)), [GROUP_POW2, HEAD_DIM])
    q = tl.reshape(tl.broadcast_to(q[None, :, :], [GROUP_ROWS // GROUP_POW2, GROUP_POW2, HEAD_DIM]),
                   [GROUP_ROWS, HEAD_DIM])
    q = tl.where((tl.arange(0, GROUP_ROWS) < GROUP)[:, None], q, tl.zeros_like(q))
    if stores_kv:
        rotated1, rotated2 = qk_norm_rope_values(k1, k2, token, k_head, weight_ptr, cos_ptr, sin_ptr, positions_ptr,
                                                 eps, stride_rope_table, HEAD_DIM, half)
        store_head_at_slot(rotated1.to(dtype), rotated2.to(dtype), token, kv_head, k_cache_ptr, slot_ptr,
                           stride_k_row, k_scale_ptr, HEAD_DIM, half, KV_FP8, ROUND_FIRST)
        store_head_at_slot(v1, v2, token, kv_head, v_cache_ptr, slot_ptr, stride_v_row, v_scale_ptr, HEAD_DIM, half,
                           KV_FP8, ROUND_FIRST)
        tl.debug_barrier()  # every thread's stores, before any thread of the program loads the keys
    decode_keys(q, start, end, next_blocks, k_cache_ptr, v_cache_ptr, block_tables_ptr, out_ptr, lse_ptr,
                scale_log2, num_splits, stride_k_block, stride_k_slot, stride_k_head, stride_v_block, stride_v_slot,
                stride_v_head, stride_table, stride_out_seq, stride_out_head, stride_out_split, GROUP, GROUP_ROWS,
                HEAD_DIM, BLOCK_SIZE, TILE, SPLIT, DOT_FP32, IEEE, k_scale_ptr, v_scale_ptr, KV_FP8, FP8_WORDS, PTX)


def rope_decode_attention(attention: GraphDecodeAttention, layer: int, qkv: SlicedSums, num_heads: int,
                          num_kv_heads: int, head_dim: int, norm_weight: torch.Tensor, cos: torch.Tensor,
                          signed_sin: torch.Tensor, positions: torch.Tensor, eps: float) -> torch.Tensor:
    """``attention.decode_stored(layer, q)`` after ``sliced_qk_norm_rope(qkv, ..., slots)`` as one launch: the
    attention's heads ``[B, heads, dim]``, the step's K/V written into the cache at its slots."""
    slices, tokens, width = qkv.parts.shape
    if width < (num_heads + 2 * num_kv_heads) * head_dim or qkv.parts.stride(-1) != 1:
        raise ValueError(f"q/k/v's slices must hold {(num_heads + 2 * num_kv_heads) * head_dim} outputs a row, "
                         f"contiguous; got {tuple(qkv.parts.shape)}")
    cache = attention.cache
    slots = CacheSlots(cache.k[layer], cache.v[layer], attention.slot_mapping, **cache.kernel_scales(layer))
    row_strides = slots.row_strides(tokens, num_kv_heads, head_dim, qkv.dtype, qkv.parts.device)
    q_like = torch.empty((tokens, num_heads, head_dim), dtype=qkv.dtype, device=qkv.parts.device)  # never written
    squares = qkv.row_squares
    parts = 0 if squares is None else squares.shape[1]
    rope_args = dict(
        parts_ptr=qkv.parts, weight_ptr=norm_weight, cos_ptr=cos, sin_ptr=signed_sin, positions_ptr=positions,
        slot_ptr=slots.slot_mapping, eps=eps, rsq_ptr=qkv.parts if squares is None else squares, x_eps=qkv.eps,
        x_dim=qkv.x_dim, stride_slice=qkv.parts.stride(0), stride_pm=qkv.parts.stride(1),
        stride_rope_table=cos.stride(0), stride_rsq=0 if squares is None else squares.stride(0),
        stride_k_row=row_strides[0], stride_v_row=row_strides[1], SLICES=slices, HEADS=num_heads,
        ROW_NORM_PARTS=parts, ROW_NORM_POW2=triton.next_power_of_2(max(parts, 1)),
        GROUP_POW2=triton.next_power_of_2(num_heads // num_kv_heads),
        ROUND_FIRST=slots.k_cache.dtype == torch.float8_e4m3fn and runs_interpreted(qkv.parts.device))
    return attention.decode(layer, q_like, kernel=_rope_decode_kernel, kernel_args=rope_args,
                            **cache.kernel_scales(layer))
