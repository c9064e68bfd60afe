"""The decode kernel over only the splits that hold keys, and the combine inside its last program.

A captured decode graph serves every context up to ``max_model_len``, so m08's heuristic picks the split count
for the longest (Qwen3-8B at batch 1: 49 slices a K/V head), and each sequence cuts its own keys into that many
slices of whole 64-key tiles. At 512 keys 8 slices hold keys and 41 hold none, yet every one of the 392 programs
loads q, writes a zero partial row per query head and an lse of -inf, and m13's combine (``integer_heads.py``)
reads all 49 back: about 40 µs a step (call 84 capped the count at 8). Then the combine is a launch of its own,
36 a step, about 2.2 µs each (call 99's profile).

Both are m13's to change, through m08's seam ``split_kernel`` (m08's kernel body is the jit function
``decode_split``, and ``split_keys`` says which keys a split holds and how many splits hold any)::

    m08:   every split: decode its keys (maybe none), write (partial, lse)      then a launch: combine all splits
    here:  a split with keys: decode, write (partial, lse), count itself done;  the last to count: combine the
           splits with keys, write the heads and o_proj's integers, set the count back to zero

The program that counts itself last of its (sequence, K/V head) weighs the ``GROUP`` query heads' partial rows,
in chunks of ``SPLITS_CHUNK`` splits with a running maximum (the online softmax again, one level up: not m08's
order of additions, so not its bits), and writes the heads and their ``int16_x`` words. Its work is one chain of
latencies (the count, the loads, the stores) that nothing overlaps, the lesson of the norm epilogue (call 58):
on the H200 (call 100) the kernel took what the decode and the combine launch took together, 7.0 µs a layer, and
the step 19 µs less at one row and 38 at two (the launch's gap), 18 more at four: so up to ``LIVE_SPLITS_MAX_ROWS``.
Skipping the empty splits alone, with the combine launch after, was no faster at one row.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from milestones.m08_triton_kernel.device_kernel import device_kernel
from milestones.m08_triton_kernel.launch_config import DecodeKernelConfig
from milestones.m08_triton_kernel.paged_decode_kernel import decode_split, split_keys

from .integer_dots import int16_x_words, store_int16_groups
from .matmul_kernels import zeroed_counters
from .quantize import GROUP_SIZE

LIVE_SPLITS_MAX_ROWS = 2  # decode graphs up to this many rows decode so (0: never; m13_step_times+live-splits.json)
SPLITS_CHUNK = 16  # splits whose partial rows the combine loads at once: [GROUP, 16, head_dim] float32
# The launch of this kernel on a 16-bit cache (None: m08's table); an FP8 cache keeps m08's FP8 table.
LIVE_SPLITS_CONFIG: DecodeKernelConfig | None = None


def config_for(fp8: bool) -> dict:
    """``paged_decode_attention``'s ``config`` option for this kernel, if it has its own."""
    return {} if fp8 or LIVE_SPLITS_CONFIG is None else {"config": LIVE_SPLITS_CONFIG}


@triton.jit
def combine_when_last(partial_ptr, lse_ptr, heads_ptr, words_ptr, count_ptr, seq, kv_head, live, num_splits,
                      stride_heads_seq, stride_heads_head, stride_words, GROUP: tl.constexpr,
                      GROUP_POW2: tl.constexpr, HEAD_DIM: tl.constexpr, SPLITS_CHUNK: tl.constexpr,
                      WORD_GROUP: tl.constexpr):
    """After a split has written its partial rows: count it done on its (sequence, K/V head)'s counter (zero
    between launches); the last of the ``live`` splits weighs them into the ``GROUP`` heads, stores them and
    their ``int16_x`` words (``WORD_GROUP`` inputs a group), and sets the counter back to zero."""
    tl.debug_barrier()  # every thread's partial rows and lse are written before the count (release)
    counter = count_ptr + seq * tl.num_programs(1) + kv_head
    done_before = tl.atomic_add(counter, 1, sem="acq_rel")
    if done_before == live - 1:
        num_heads = tl.num_programs(1) * GROUP
        rows = tl.arange(0, GROUP_POW2)
        row_ok = rows < GROUP
        head_rows = seq * num_heads + kv_head * GROUP + rows  # rows of partial [B * heads, num_splits, dim]
        dims = tl.arange(0, HEAD_DIM)
        m = tl.full([GROUP_POW2], float("-inf"), tl.float32)  # the largest lse so far (base 2)
        l = tl.zeros([GROUP_POW2], tl.float32)  # sum of 2^(lse - m)
        acc = tl.zeros([GROUP_POW2, HEAD_DIM], tl.float32)  # sum of 2^(lse - m) * partial row
        for first in range(0, live, SPLITS_CHUNK):
            splits = first + tl.arange(0, SPLITS_CHUNK)
            used = row_ok[:, None] & (splits < live)[None, :]
            cell = head_rows[:, None] * num_splits + splits[None, :]
            lse = tl.load(lse_ptr + cell, mask=used, other=float("-inf"), cache_modifier=".cg")
            partial = tl.load(partial_ptr + (cell * HEAD_DIM)[:, :, None] + dims[None, None, :],
                              mask=used[:, :, None], other=0.0, cache_modifier=".cg")
            m_new = tl.maximum(m, tl.max(lse, 1))
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # every split so far empty: weights 0
            weight = tl.exp2(lse - m_safe[:, None])
            alpha = tl.exp2(m - m_safe)
            l = l * alpha + tl.sum(weight, 1)
            acc = acc * alpha[:, None] + tl.sum(weight[:, :, None] * partial, 1)
            m = m_new
        out = (acc / tl.where(l > 0, l, 1.0)[:, None]).to(heads_ptr.dtype.element_ty)
        heads = kv_head * GROUP + rows
        tl.store(heads_ptr + seq * stride_heads_seq + heads[:, None] * stride_heads_head + dims[None, :], out,
                 mask=row_ok[:, None])
        per_head: tl.constexpr = HEAD_DIM // WORD_GROUP
        groups = kv_head * GROUP * per_head + tl.arange(0, GROUP_POW2 * per_head)
        x = tl.reshape(out.to(tl.float32), [GROUP_POW2 * per_head, WORD_GROUP])  # as o_proj reads it
        store_int16_groups(x, groups, groups < (kv_head + 1) * GROUP * per_head, words_ptr + seq * stride_words,
                           num_heads * HEAD_DIM, GROUP_POW2 * per_head, WORD_GROUP)
        tl.atomic_xchg(counter, 0, sem="relaxed")  # ready for the next launch (or graph replay)


@device_kernel
@triton.jit(do_not_specialize=["num_splits", "max_blocks", "stride_table"])
def _live_splits_decode_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, context_lens_ptr, partial_ptr, lse_ptr,
    scale_log2, num_splits, max_blocks,
    stride_q_seq, stride_q_head,
    stride_k_block, stride_k_slot, stride_k_head,
    stride_v_block, stride_v_slot, stride_v_head,
    stride_table, stride_partial_seq, stride_partial_head, stride_partial_split,
    heads_ptr, words_ptr, count_ptr, stride_heads_seq, stride_heads_head, stride_words,
    GROUP: tl.constexpr, GROUP_ROWS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    TILE: tl.constexpr, SPLIT: tl.constexpr, DOT_FP32: tl.constexpr, IEEE: tl.constexpr,
    k_scale_ptr, v_scale_ptr, KV_FP8: tl.constexpr, FP8_WORDS: tl.constexpr, PTX: tl.constexpr,
    GROUP_POW2: tl.constexpr, SPLITS_CHUNK: tl.constexpr, WORD_GROUP: tl.constexpr,
):
    """m08's decode program, run only where its split holds keys, then ``combine_when_last``."""
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    _, _, live = split_keys(context_lens_ptr, seq, split, num_splits, max_blocks, BLOCK_SIZE, TILE, SPLIT)
    if split < live:  # a sequence of no keys keeps split 0, which writes its zero rows
        decode_split(q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, context_lens_ptr, partial_ptr, lse_ptr,
                     scale_log2, num_splits, max_blocks, stride_q_seq, stride_q_head, stride_k_block,
                     stride_k_slot, stride_k_head, stride_v_block, stride_v_slot, stride_v_head, stride_table,
                     stride_partial_seq, stride_partial_head, stride_partial_split, GROUP, GROUP_ROWS, HEAD_DIM,
                     BLOCK_SIZE, TILE, SPLIT, DOT_FP32, IEEE, k_scale_ptr, v_scale_ptr, KV_FP8, FP8_WORDS, PTX,
                     seq, kv_head, split)
        combine_when_last(partial_ptr, lse_ptr, heads_ptr, words_ptr, count_ptr, seq, kv_head, live, num_splits,
                          stride_heads_seq, stride_heads_head, stride_words, GROUP, GROUP_POW2, HEAD_DIM,
                          SPLITS_CHUNK, WORD_GROUP)


def decode_live_splits(grid: tuple[int, int, int], arguments: tuple, keywords: dict, partial: torch.Tensor,
                       lse: torch.Tensor, heads: torch.Tensor) -> torch.Tensor:
    """m08's ``split_kernel`` seam: the decode over the splits that hold keys, the heads weighed into ``heads`` in
    its last program; returns their ``int16_x`` words."""
    batch, kv_heads, num_splits = grid
    words = torch.empty((batch, int16_x_words(heads.shape[1] * heads.shape[2])), dtype=torch.int32,
                        device=heads.device)
    _live_splits_decode_kernel[grid](
        *arguments, heads, words, zeroed_counters(heads.device, batch * kv_heads), heads.stride(0), heads.stride(1),
        words.stride(0), **keywords, GROUP_POW2=triton.next_power_of_2(keywords["GROUP"]),
        SPLITS_CHUNK=min(SPLITS_CHUNK, triton.next_power_of_2(num_splits)), WORD_GROUP=GROUP_SIZE)
    return words
