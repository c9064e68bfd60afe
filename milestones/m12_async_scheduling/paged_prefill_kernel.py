"""Paged prefill attention in Triton: every prompt chunk of a step in one launch, reading K/V in place.

m05's torch path attends a step's prompt chunks in groups of similar length: for each group it gathers every
sequence's keys and values into a dense copy, scatters the queries into a padded batch, builds a causal mask and
runs ``scaled_dot_product_attention``; then the outputs are gathered back. Per layer that is some fifteen launches
per group, and a step with chunks of many lengths has several groups: with m12's pieces replayed from graphs,
these launches (28 layers of them) are most of what a mixed step costs the host, and the GPU waits for them.

This kernel does the same attention in one launch per layer, whatever the chunks' lengths:

    q        [T, heads, head_dim]          the step's packed queries (RoPE applied); a chunk's rows are
                                           [query_start_loc[s], query_start_loc[s + 1])
    k/v      [num_blocks, block_size, kv_heads, head_dim]   one layer's pool, read through block_tables[s]

    query i of a chunk of q_len new tokens sits at position  context_len - q_len + i  of its sequence
    and sees keys 0 .. that position (the cached prefix, earlier chunks, and its own chunk causally).

**One program per (query tile, K/V head).** The host cuts each chunk into tiles of ``BLOCK_Q`` queries (a list
``(sequence, first query)`` per tile, built once per step; a tile of sequence -1 does nothing); the ``group = heads / kv_heads`` query heads of a
K/V head are rows of the same tile, so a tile is ``BLOCK_Q x group`` rows of q against keys read once per tile.
The loop runs over the keys up to the tile's last position, in tiles of ``TILE`` keys looked up through the
block table, with m08's tile loads and online softmax (``_load_kv_tile``, ``_online_softmax_step``); the causal mask is ``key <= position`` per row. Rows past a chunk's end
repeat its last query (finite) and are never stored. The output is written straight into the chunk's rows of the
step's packed output: no scatter, no gather.

FP8 caches (m13): as in m08's decode kernel, tiles are widened in registers, K's scale multiplies the scores and
V's the output. Without a GPU the kernel runs in Triton's interpreter (``device_kernel``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from milestones.m08_triton_kernel.device_kernel import device_kernel, runs_interpreted
from milestones.m08_triton_kernel.paged_decode_kernel import (FP8_DTYPE, LOG2_E, MIN_GROUP_ROWS, SUPPORTED_DTYPES,
                                                               _load_kv_tile, _online_softmax_step, _widen_q)

TILE_ROWS = 64  # rows of q per program: BLOCK_Q queries x the group's heads (padded to a power of two)
TILE_KEYS = 64  # keys per loop step (four 16-token pages)


@device_kernel
# Not specialised on what an eager step's values decide (a compiled kernel's signature is the same for every step,
# eager or in a graph, as in m08's decode kernel): the block tables' width (a step's longest sequence; 1 or a
# multiple of 16 would otherwise compile kernels of their own) and the tile list's second row (16-byte aligned
# only when the number of tiles is a multiple of 4).
@triton.jit(do_not_specialize=["max_blocks", "stride_table"], do_not_specialize_on_alignment=["tile_first_ptr"])
def _paged_prefill_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, out_ptr, block_tables_ptr, context_lens_ptr, query_start_ptr,
    tile_seq_ptr, tile_first_ptr, scale_log2, max_blocks,
    stride_q_tok, stride_q_head,
    stride_k_block, stride_k_slot, stride_k_head,
    stride_v_block, stride_v_slot, stride_v_head,
    stride_o_tok, stride_o_head, stride_table,
    k_scale_ptr, v_scale_ptr,
    GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, BLOCK_Q: tl.constexpr, HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, TILE: tl.constexpr, DOT_FP32: tl.constexpr, IEEE: tl.constexpr,
    KV_FP8: tl.constexpr,
):
    """One tile of one chunk (``BLOCK_Q`` queries from ``tile_first``) for one K/V head's ``GROUP`` query heads."""
    tile = tl.program_id(0)
    kv_head = tl.program_id(1)
    seq = tl.load(tile_seq_ptr + tile)
    if seq < 0:  # a tile a captured grid holds beyond this step's (full_graphs.py)
        return
    first = tl.load(tile_first_ptr + tile)
    q_start = tl.load(query_start_ptr + seq).to(tl.int32)
    q_len = tl.load(query_start_ptr + seq + 1).to(tl.int32) - q_start
    context_len = tl.minimum(tl.load(context_lens_ptr + seq).to(tl.int32), max_blocks * BLOCK_SIZE)

    ROWS: tl.constexpr = BLOCK_Q * GROUP_PAD
    r = tl.arange(0, ROWS)
    query = first + r // GROUP_PAD  # which query of the chunk
    head_in_group = r % GROUP_PAD
    row_ok = (query < q_len) & (head_in_group < GROUP)
    query = tl.minimum(query, q_len - 1)  # padding rows repeat a real query: finite scores, never stored
    head = kv_head * GROUP + tl.minimum(head_in_group, GROUP - 1)
    position = context_len - q_len + query  # [ROWS]: this row sees keys 0 .. position
    dims = tl.arange(0, HEAD_DIM)
    q = tl.load(q_ptr + (q_start + query)[:, None] * stride_q_tok + head[:, None] * stride_q_head + dims[None, :])
    q, scale_log2 = _widen_q(q, scale_log2, k_scale_ptr, KV_FP8, DOT_FP32)

    m = tl.full([ROWS], float("-inf"), tl.float32)
    l = tl.zeros([ROWS], tl.float32)
    acc = tl.zeros([ROWS, HEAD_DIM], tl.float32)
    table_row = block_tables_ptr + seq * stride_table
    k_head = k_cache_ptr + kv_head * stride_k_head
    v_head = v_cache_ptr + kv_head * stride_v_head
    # keys up to the tile's last query's position; key 0 is in every row's view, so every row's m is finite
    # after the first step, and a later step whose keys a row may not see adds exp2(-inf) = 0 to it
    end = context_len - q_len + tl.minimum(first + BLOCK_Q, q_len)
    for key_start in range(0, end, TILE):
        keys = key_start + tl.arange(0, TILE)
        in_range = keys < end
        block = tl.load(table_row + keys // BLOCK_SIZE, mask=in_range, other=0).to(tl.int64)
        k, v = _load_kv_tile(k_head, v_head, block, keys % BLOCK_SIZE, dims, in_range, stride_k_block, stride_k_slot,
                             stride_v_block, stride_v_slot, KV_FP8, DOT_FP32)
        visible = in_range[None, :] & (keys[None, :] <= position[:, None])  # causal, within the sequence
        m, l, acc = _online_softmax_step(q, k, v, visible, scale_log2, m, l, acc, IEEE)

    out = acc / l[:, None]
    if KV_FP8:
        out = out * tl.load(v_scale_ptr)
    out_rows = out_ptr + (q_start + query)[:, None] * stride_o_tok + head[:, None] * stride_o_head + dims[None, :]
    tl.store(out_rows, out.to(out_ptr.dtype.element_ty), mask=row_ok[:, None])


def queries_per_tile(num_heads: int, num_kv_heads: int) -> int:
    """``BLOCK_Q``: queries per program, so that queries x the group's heads (a power of two) make ``TILE_ROWS``
    rows (at least 16, the smallest ``tl.dot``)."""
    group_pad = triton.next_power_of_2(num_heads // num_kv_heads)
    return max(1, TILE_ROWS // group_pad, MIN_GROUP_ROWS // group_pad)


def prefill_tiles(query_lens: list[int], sequences: list[int], block_q: int) -> tuple[list[int], list[int]]:
    """``(sequence, first query)`` of every tile: each chunk of ``sequences`` cut into tiles of ``block_q``."""
    seqs, firsts = [], []
    for s in sequences:
        for first in range(0, query_lens[s], block_q):
            seqs.append(s)
            firsts.append(first)
    return seqs, firsts


def paged_prefill_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, out: torch.Tensor,
                            block_tables: torch.Tensor, context_lens: torch.Tensor, query_start_loc: torch.Tensor,
                            tile_seqs: torch.Tensor, tile_firsts: torch.Tensor, scale: float, *,
                            k_scale: torch.Tensor | None = None, v_scale: torch.Tensor | None = None) -> torch.Tensor:
    """Causal attention of every tiled chunk's queries over its paged K/V, written into ``out``'s rows of them.

    ``q``/``out`` ``[T, heads, head_dim]``; ``block_tables`` ``[B, max_blocks]``, ``context_lens`` ``[B]`` and
    ``query_start_loc`` ``[B + 1]`` index the step's sequences; ``tile_seqs`` / ``tile_firsts`` (int32, from
    ``prefill_tiles`` with ``queries_per_tile``'s size) say which queries each program takes. Rows of sequences
    without a tile are left as they were. ``k_scale`` / ``v_scale``: an FP8 cache's per-layer scales (m13).
    """
    num_heads, head_dim = q.shape[1:]
    _, block_size, num_kv_heads, _ = k_cache.shape
    if q.dtype not in SUPPORTED_DTYPES or out.shape != q.shape or out.dtype != q.dtype:
        raise ValueError(f"q and out must be one float32/float16/bfloat16 [T, heads, head_dim] shape; got "
                         f"{q.dtype} {tuple(q.shape)} and {out.dtype} {tuple(out.shape)}")
    kv_fp8 = k_cache.dtype == FP8_DTYPE
    if kv_fp8 != (k_scale is not None) or (not kv_fp8 and k_cache.dtype != q.dtype):
        raise ValueError(f"a {k_cache.dtype} cache with {q.dtype} queries needs "
                         f"{'k_scale and v_scale' if kv_fp8 else 'the same dtype (or FP8 with scales)'}")
    if num_heads % num_kv_heads or head_dim < 16 or head_dim & (head_dim - 1):
        raise ValueError(f"{num_heads} heads over {num_kv_heads} K/V heads of {head_dim}: heads must be a multiple "
                         "of K/V heads and head_dim a power of two >= 16")
    if len(tile_seqs) == 0:
        return out
    group = num_heads // num_kv_heads
    fp32 = q.dtype == torch.float32
    _paged_prefill_kernel[(len(tile_seqs), num_kv_heads)](
        q, k_cache, v_cache, out, block_tables, context_lens, query_start_loc, tile_seqs, tile_firsts,
        scale * LOG2_E, block_tables.shape[1],
        q.stride(0), q.stride(1), *k_cache.stride()[:3], *v_cache.stride()[:3], out.stride(0), out.stride(1),
        block_tables.stride(0), k_scale, v_scale,
        GROUP=group, GROUP_PAD=triton.next_power_of_2(group), BLOCK_Q=queries_per_tile(num_heads, num_kv_heads),
        HEAD_DIM=head_dim, BLOCK_SIZE=block_size, TILE=TILE_KEYS,
        # Triton's interpreter computes bfloat16 dots wrongly (m08's kernel notes it): float32 tiles there
        DOT_FP32=fp32 or (runs_interpreted(q.device) and q.dtype == torch.bfloat16), IEEE=fp32, KV_FP8=kv_fp8,
        num_warps=4, num_stages=2,
    )
    return out
