"""Paged decode attention in Triton: read each sequence's K/V in place through its block table.

A decode step has one new query token per sequence and must attend to every key that sequence has cached.
m04 gathered those keys into a dense ``[B, S, kv_heads, head_dim]`` copy every layer of every step and then ran
``scaled_dot_product_attention``: the copy costs as much memory traffic as the attention itself (more, counting
the write). This kernel reads the paged pool directly:

    k_cache, v_cache  [num_blocks, block_size, kv_heads, head_dim]    one layer's view of the pool
    block_tables      [B, max_blocks]     block_tables[b, i] = physical block of sequence b's i-th page
    context_lens      [B]                 keys of sequence b, the new token's included (already stored)

    key t of sequence b lives at  k_cache[block_tables[b, t // block_size], t % block_size]

**One program per (sequence, K/V head, split).** With grouped-query attention (Qwen3-0.6B: 16 query heads,
8 K/V heads) the ``group = heads / kv_heads`` query heads that share a K/V head are computed by the *same*
program, as the rows of a small ``[group, head_dim]`` matrix: every K/V byte is read from memory exactly once
(padded to 16 rows, the smallest ``tl.dot``; the extra rows cost tensor-core time, never memory traffic).

**Tiles of several pages.** Each loop iteration takes ``TILE`` consecutive keys (64 = four 16-token pages):
it looks up their blocks in the table, loads a ``[TILE, head_dim]`` tile of K and of V (each key row is
``head_dim`` contiguous elements: 256 bytes in bf16, loaded 16 bytes at a time), and folds them into the
running result with the **online softmax**: keep, per query row, the running maximum ``m``, the running
denominator ``l`` and the un-normalised output ``acc`` (all float32); a new tile with a larger maximum
rescales the old ``l`` and ``acc`` by ``2^(m_old - m_new)``. Keys past the sequence's length are masked out
of the loads, so unwritten slots and garbage table entries are never read.

**Split-K (flash-decoding).** A batch of 1 has only ``kv_heads`` = 8 programs: 8 of the H200's 132 SMs would
stream the whole context while the rest idle. So long contexts at small batch are cut into ``num_splits``
slices, each its own program writing a partial ``(o, lse)`` = (normalised output, log-sum-exp) of its slice;
a second small kernel combines the slices: ``o = sum_s 2^(lse_s - lse_max) o_s / sum_s 2^(lse_s - lse_max)``.
``choose_num_splits`` picks the count from ``B * kv_heads`` against the SM count and the context length, and
``launch_config.py`` holds the tile size, warps and pipelining depth of each regime (split or direct).

**Capturable in a CUDA graph.** The wrapper reads no tensor values on the host: every decision it makes uses
shapes and Python ints (``max_context_len`` is a bound the caller knows, by default the table's width times
``block_size``), and each program finds its own sequence's length on the device and skips the work past it.

**An FP8 cache is read as 16-bit words** (m13). Its ``[TILE, head_dim]`` tile of single bytes would reach the dots'
registers through scalar byte reads of shared memory; viewed as ``[TILE, head_dim / 2]`` int16 words (two values
each) it takes bf16's path there (``ldmatrix``), and the dots take the even and the odd dims apart:
``q . k = q_even . k_even + q_odd . k_odd``, and ``p V`` is ``[p V_even, p V_odd]`` interleaved back.

Without a GPU the kernels run in Triton's interpreter (numpy on the CPU): slow, but exact, which is how the
tests check them on a laptop. Each kernel chooses at launch, from its tensors' device (``device_kernel.py``).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import triton
import triton.language as tl

from .device_kernel import device_kernel, runs_interpreted
from .launch_config import (DEFAULT_CONFIG, FP8_LAUNCH_TABLE, LAUNCH_TABLE, MAX_SPLITS,  # noqa: F401
                            DecodeKernelConfig, choose_launch, choose_num_splits, sm_count)

SUPPORTED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
FP8_DTYPE = torch.float8_e4m3fn  # an FP8 cache (m13): read with a per-layer float32 scale for K and for V
INDEX_DTYPES = (torch.int32, torch.int64)  # of block_tables and context_lens
MIN_GROUP_ROWS = 16  # tl.dot needs M >= 16: the query-head group is padded to this many rows
MIN_DOT_K = 16  # and an inner dimension K >= 16 on a GPU
LOG2_E = math.log2(math.e)  # scores are kept in base 2: exp(x) = exp2(x * log2(e))


# --------------------------------------------------------------------------- the kernels


@triton.jit
def _widen_q(q, scale_log2, k_scale_ptr, KV_FP8: tl.constexpr, DOT_FP32: tl.constexpr):
    """q in the dots' dtype (float32, or fp16 beside an FP8 cache, whose tiles are widened to fp16), and the
    scores' scale with an FP8 cache's K scale folded in."""
    if DOT_FP32:
        q = q.to(tl.float32)
    elif KV_FP8:
        q = q.to(tl.float16)
    if KV_FP8:
        scale_log2 = scale_log2 * tl.load(k_scale_ptr)
    return q, scale_log2


@triton.jit
def _load_kv_tile(k_head, v_head, block, slot, dims, valid, stride_k_block, stride_k_slot, stride_v_block,
                  stride_v_slot, KV_FP8: tl.constexpr, DOT_FP32: tl.constexpr):
    """A ``[TILE, head_dim]`` tile of K and of V, key ``i`` at slot ``slot[i]`` of block ``block[i]`` (rows not
    ``valid`` read as 0), widened for the dots: an FP8 cache's values to fp16 (one instruction a pair on Hopper;
    to bf16 it is two), everything to float32 where the dots run in float32. m12's prefill kernel reads it so;
    the decode kernel reads an FP8 cache as words (``_load_fp8_words``)."""
    k = tl.load(k_head + (block * stride_k_block + slot * stride_k_slot)[:, None] + dims[None, :],
                mask=valid[:, None], other=0.0)
    v = tl.load(v_head + (block * stride_v_block + slot * stride_v_slot)[:, None] + dims[None, :],
                mask=valid[:, None], other=0.0)
    if KV_FP8:
        k = k.to(tl.float16)
        v = v.to(tl.float16)
    if DOT_FP32:
        k = k.to(tl.float32)
        v = v.to(tl.float32)
    return k, v


@triton.jit
def _fp8_words_to_fp16(w, PTX: tl.constexpr):
    """The two float8_e4m3 values of each int16 word of ``w`` as fp16 (exactly: e4m3's 3 mantissa bits and
    2^-9..448 fit fp16's 10 bits and 2^-24..65504): ``(even, odd)``, the word's low byte (dim ``2j`` of the cache:
    little-endian) and its high byte (dim ``2j + 1``).

    ``PTX`` (compiled kernels): Triton's ``.to`` below works byte by byte (4.3 instructions a byte for the whole
    loop); here each 32-bit register of two words ``a, b`` is one byte permute to ``(a_lo, b_lo, a_hi, b_hi)`` and
    one hardware conversion of each half (``cvt.rn.f16x2.e4m3x2``, sm_89 on: two values), straight into the even
    and the odd fp16 pairs: 3 instructions for 4 values (2.5 a byte for the loop, sm_90 assembly). The
    interpreter runs no PTX.
    """
    if PTX:
        return tl.inline_asm_elementwise(
            asm="""{
            .reg .b16 lo, hi;
            .reg .b32 bytes;
            prmt.b32 bytes, $2, 0, 0x3120;
            mov.b32 {lo, hi}, bytes;
            cvt.rn.f16x2.e4m3x2 $0, lo;
            cvt.rn.f16x2.e4m3x2 $1, hi;
            }""", constraints="=r,=r,r", args=[w], dtype=(tl.float16, tl.float16), is_pure=True, pack=2)
    even = (w & 0xFF).to(tl.uint8).to(tl.float8e4nv, bitcast=True).to(tl.float16)
    odd = ((w >> 8) & 0xFF).to(tl.uint8).to(tl.float8e4nv, bitcast=True).to(tl.float16)
    return even, odd


@triton.jit
def _load_fp8_words(head, block, slot, words, valid, stride_block, stride_slot, DOT_FP32: tl.constexpr,
                    PTX: tl.constexpr):
    """A ``[TILE, head_dim / 2]`` tile of an FP8 cache's int16 words (``head`` and the strides in words; rows not
    ``valid`` read as 0) as its even dims and its odd dims in fp16, float32 where the dots run in float32."""
    w = tl.load(head + (block * stride_block + slot * stride_slot)[:, None] + words[None, :],
                mask=valid[:, None], other=0)
    even, odd = _fp8_words_to_fp16(w, PTX)
    if DOT_FP32:
        even = even.to(tl.float32)
        odd = odd.to(tl.float32)
    return even, odd


@triton.jit
def _dot(a, b, acc, IEEE: tl.constexpr):
    """``acc + a @ b``; ``IEEE``: float32 data, full-precision dots (not tf32)."""
    if IEEE:
        return tl.dot(a, b, acc, input_precision="ieee")
    return tl.dot(a, b, acc)


@triton.jit
def _softmax_weights(scores, visible, scale_log2, m, l):
    """A tile's scores ``[rows, TILE]`` against the running ``(m, l)``: in base 2, keys a row may not see
    (``visible`` false) at -inf. Returns the weights ``p = 2^(score - m_new)``, the factor ``2^(m - m_new)`` that
    rescales what came before, and the new ``(m, l)``."""
    scores = tl.where(visible, scores * scale_log2, float("-inf"))
    m_new = tl.maximum(m, tl.max(scores, 1))
    alpha = tl.exp2(m - m_new)
    p = tl.exp2(scores - m_new[:, None])
    return p, alpha, m_new, l * alpha + tl.sum(p, 1)


@triton.jit
def _online_softmax_step(q, k, v, visible, scale_log2, m, l, acc, IEEE: tl.constexpr):
    """Fold one tile of keys into the running ``(m, l, acc)`` of the rows of ``q``."""
    zeros = tl.zeros([q.shape[0], k.shape[0]], tl.float32)
    p, alpha, m, l = _softmax_weights(_dot(q, tl.trans(k), zeros, IEEE), visible, scale_log2, m, l)
    pv = _dot(p.to(v.dtype), v, tl.zeros([q.shape[0], v.shape[1]], tl.float32), IEEE)
    return m, l, acc * alpha[:, None] + pv


@triton.jit
def _online_softmax_step_words(q_even, q_odd, k_even, k_odd, v_even, v_odd, visible, scale_log2, m, l, acc_even,
                               acc_odd, IEEE: tl.constexpr):
    """``_online_softmax_step`` on a tile split into even and odd dims (an FP8 cache read as words): the scores
    sum a dot over each half, and each half of the output takes ``p`` times its half of V."""
    scores = _dot(q_even, tl.trans(k_even), tl.zeros([q_even.shape[0], k_even.shape[0]], tl.float32), IEEE)
    p, alpha, m, l = _softmax_weights(_dot(q_odd, tl.trans(k_odd), scores, IEEE), visible, scale_log2, m, l)
    acc_even = _dot(p.to(v_even.dtype), v_even, acc_even * alpha[:, None], IEEE)
    acc_odd = _dot(p.to(v_odd.dtype), v_odd, acc_odd * alpha[:, None], IEEE)
    return m, l, acc_even, acc_odd


@triton.jit
def split_keys(context_lens_ptr, seq, split, num_splits, max_blocks, BLOCK_SIZE: tl.constexpr, TILE: tl.constexpr,
               SPLIT: tl.constexpr):
    """The keys ``[start, end)`` one program reads, and the sequence's length (a seam: m13 stores the new key in
    the program whose keys hold it)."""
    # A table holds max_blocks pages, so clamp to what it can address. Lengths may come as int64 (the engine's
    # metadata): int32 here, or the loop's key indices would turn int64 inside the loop while starting as int32,
    # which the compiler rejects (tests/compile_for_gpu.py checks it).
    context_len = tl.minimum(tl.load(context_lens_ptr + seq).to(tl.int32), max_blocks * BLOCK_SIZE)
    if SPLIT:
        # Every sequence is cut into num_splits slices of whole tiles, sized by its own length.
        split_len = tl.cdiv(tl.cdiv(context_len, num_splits), TILE) * TILE
        start = split * split_len
        end = tl.minimum(start + split_len, context_len)
    else:
        start = 0
        end = context_len
    return start, end, context_len


@triton.jit
def first_blocks(block_tables_ptr, seq, stride_table, start, end, BLOCK_SIZE: tl.constexpr, TILE: tl.constexpr):
    """The block ids of a program's first tile (``decode_keys`` loads each next tile's one iteration ahead)."""
    keys = start + tl.arange(0, TILE)
    return tl.load(block_tables_ptr + seq * stride_table + keys // BLOCK_SIZE, mask=keys < end, other=0)


@triton.jit
def decode_keys(q, start, end, next_blocks, k_cache_ptr, v_cache_ptr, block_tables_ptr, out_ptr, lse_ptr,
                scale_log2, num_splits, stride_k_block, stride_k_slot, stride_k_head, stride_v_block, stride_v_slot,
                stride_v_head, stride_table, stride_out_seq, stride_out_head, stride_out_split, GROUP: tl.constexpr,
                GROUP_ROWS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr, TILE: tl.constexpr,
                SPLIT: tl.constexpr, DOT_FP32: tl.constexpr, IEEE: tl.constexpr, k_scale_ptr, v_scale_ptr,
                KV_FP8: tl.constexpr, FP8_WORDS: tl.constexpr, PTX: tl.constexpr):
    """The program's body once it holds its query rows ``q`` ``[GROUP_ROWS, HEAD_DIM]`` (padding rows 0), its
    keys ``[start, end)`` and their first tile's blocks: the loop over its tiles, and its output (a seam: m13's
    programs make q from a matmul's slices instead of loading it)."""
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    num_heads = tl.num_programs(1) * GROUP
    rows = tl.arange(0, GROUP_ROWS)
    dims = tl.arange(0, HEAD_DIM)
    heads = kv_head * GROUP + rows
    q, scale_log2 = _widen_q(q, scale_log2, k_scale_ptr, KV_FP8, DOT_FP32)
    m = tl.full([GROUP_ROWS], float("-inf"), tl.float32)  # running max of the scores (base-2 units)
    l = tl.zeros([GROUP_ROWS], tl.float32)  # running sum of 2^(score - m)
    if FP8_WORDS:  # word j of a key holds its dims 2j (low byte) and 2j + 1: q and the output split alike
        words = tl.arange(0, HEAD_DIM // 2)
        q_even, q_odd = tl.split(tl.reshape(q, [GROUP_ROWS, HEAD_DIM // 2, 2]))
        acc_even = tl.zeros([GROUP_ROWS, HEAD_DIM // 2], tl.float32)  # running sum of 2^(score - m) * v_even
        acc_odd = tl.zeros([GROUP_ROWS, HEAD_DIM // 2], tl.float32)
    else:
        acc = tl.zeros([GROUP_ROWS, HEAD_DIM], tl.float32)  # running sum of 2^(score - m) * v
    table_row = block_tables_ptr + seq * stride_table
    if FP8_WORDS:  # the same bytes, two values a word
        k_cache_ptr = k_cache_ptr.to(tl.pointer_type(tl.int16), bitcast=True)
        v_cache_ptr = v_cache_ptr.to(tl.pointer_type(tl.int16), bitcast=True)
    k_head = k_cache_ptr + kv_head * stride_k_head
    v_head = v_cache_ptr + kv_head * stride_v_head
    # The block ids of a tile are loaded one iteration ahead (the first tile's before the loop, ``first_blocks``:
    # hoisted out of the K/V address chain): the K/V loads then depend on no load of their own iteration, so
    # Triton's pipeliner can keep num_stages - 1 tiles of K and V in flight while the current one is computed.
    for tile_start in range(start, end, TILE):
        keys = tile_start + tl.arange(0, TILE)
        valid = keys < end  # never read a table entry or a slot past the sequence's last key
        block = next_blocks.to(tl.int64)
        next_keys = keys + TILE
        next_blocks = tl.load(table_row + next_keys // BLOCK_SIZE, mask=next_keys < end, other=0)
        # Each tile holds at least one valid key, so m stays finite and the exponents are well defined.
        if FP8_WORDS:
            k_even, k_odd = _load_fp8_words(k_head, block, keys % BLOCK_SIZE, words, valid, stride_k_block,
                                            stride_k_slot, DOT_FP32, PTX)
            v_even, v_odd = _load_fp8_words(v_head, block, keys % BLOCK_SIZE, words, valid, stride_v_block,
                                            stride_v_slot, DOT_FP32, PTX)
            m, l, acc_even, acc_odd = _online_softmax_step_words(q_even, q_odd, k_even, k_odd, v_even, v_odd,
                                                                 valid[None, :], scale_log2, m, l, acc_even,
                                                                 acc_odd, IEEE)
        else:
            k, v = _load_kv_tile(k_head, v_head, block, keys % BLOCK_SIZE, dims, valid, stride_k_block,
                                 stride_k_slot, stride_v_block, stride_v_slot, KV_FP8, DOT_FP32)
            m, l, acc = _online_softmax_step(q, k, v, valid[None, :], scale_log2, m, l, acc, IEEE)

    if FP8_WORDS:
        acc = tl.reshape(tl.join(acc_even, acc_odd), [GROUP_ROWS, HEAD_DIM])  # dims 2j, 2j + 1 side by side
    has_keys = l > 0  # false only for an empty split, or a padding row with context length 0
    out = acc / tl.where(has_keys, l, 1.0)[:, None]
    if KV_FP8:
        out = out * tl.load(v_scale_ptr)
    out_rows = out_ptr + seq * stride_out_seq + heads[:, None] * stride_out_head + split * stride_out_split
    row_mask = (rows < GROUP)[:, None]
    if SPLIT:
        tl.store(out_rows + dims[None, :], out, mask=row_mask)
        lse = tl.where(has_keys, m + tl.log2(tl.where(has_keys, l, 1.0)), float("-inf"))
        tl.store(lse_ptr + (seq * num_heads + heads) * num_splits + split, lse, mask=rows < GROUP)
    else:
        tl.store(out_rows + dims[None, :], out.to(out_ptr.dtype.element_ty), mask=row_mask)


@device_kernel
@triton.jit(do_not_specialize=["num_splits", "max_blocks", "stride_table"])
def _paged_decode_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, context_lens_ptr, out_ptr, lse_ptr,
    scale_log2, num_splits, max_blocks,
    stride_q_seq, stride_q_head,
    stride_k_block, stride_k_slot, stride_k_head,
    stride_v_block, stride_v_slot, stride_v_head,
    stride_table, stride_out_seq, stride_out_head, stride_out_split,
    GROUP: tl.constexpr, GROUP_ROWS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    TILE: tl.constexpr, SPLIT: tl.constexpr, DOT_FP32: tl.constexpr, IEEE: tl.constexpr,
    k_scale_ptr, v_scale_ptr, KV_FP8: tl.constexpr, FP8_WORDS: tl.constexpr, PTX: tl.constexpr,
):
    """One (sequence, K/V head, split): the ``GROUP`` query heads of that K/V head against its keys.

    ``KV_FP8`` (m13): the cache holds float8_e4m3 values ``x / scale`` with one float32 scale per layer for K
    and one for V (``k_scale_ptr``, ``v_scale_ptr``). ``FP8_WORDS``: read as int16 words (``[..., head_dim / 2]``,
    the strides given in words), widened to fp16 in registers (``_fp8_words_to_fp16``; ``PTX``: with Hopper's
    conversion, off in the interpreter), the dots in fp16 on the even and the odd dims; otherwise (a head_dim
    under 32) byte by byte. K's scale multiplies the scores (through ``scale_log2``) and V's the output."""
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    start, end, _ = split_keys(context_lens_ptr, seq, split, num_splits, max_blocks, BLOCK_SIZE, TILE, SPLIT)
    next_blocks = first_blocks(block_tables_ptr, seq, stride_table, start, end, BLOCK_SIZE, TILE)
    rows = tl.arange(0, GROUP_ROWS)  # query head kv_head * GROUP + row; rows >= GROUP are padding
    dims = tl.arange(0, HEAD_DIM)
    heads = kv_head * GROUP + rows
    q = tl.load(q_ptr + seq * stride_q_seq + heads[:, None] * stride_q_head + dims[None, :],
                mask=(rows < GROUP)[:, None], other=0.0)
    decode_keys(q, start, end, next_blocks, k_cache_ptr, v_cache_ptr, block_tables_ptr, out_ptr, lse_ptr,
                scale_log2, num_splits, stride_k_block, stride_k_slot, stride_k_head, stride_v_block, stride_v_slot,
                stride_v_head, stride_table, stride_out_seq, stride_out_head, stride_out_split, GROUP, GROUP_ROWS,
                HEAD_DIM, BLOCK_SIZE, TILE, SPLIT, DOT_FP32, IEEE, k_scale_ptr, v_scale_ptr, KV_FP8, FP8_WORDS, PTX)


@triton.jit
def combine_splits(partial_ptr, lse_ptr, row, num_splits, HEAD_DIM: tl.constexpr, SPLITS_POW2: tl.constexpr):
    """Row ``row`` (a sequence's query head) of the slices' partial outputs, weighted by each slice's share of
    the softmax denominator: ``[HEAD_DIM]`` float32. (m13 calls it too, in a combine that also writes the row as
    the integers its next matmul reads.)"""
    splits = tl.arange(0, SPLITS_POW2)
    dims = tl.arange(0, HEAD_DIM)
    used = splits < num_splits
    lse = tl.load(lse_ptr + row * num_splits + splits, mask=used, other=float("-inf"))
    partial = tl.load(partial_ptr + (row * num_splits + splits)[:, None] * HEAD_DIM + dims[None, :],
                      mask=used[:, None], other=0.0)
    lse_max = tl.max(lse, 0)
    lse_max = tl.where(lse_max == float("-inf"), 0.0, lse_max)  # every split empty: weights 0, output 0
    weight = tl.exp2(lse - lse_max)  # empty splits have lse = -inf: weight 0
    total = tl.sum(weight, 0)
    return tl.sum(weight[:, None] * partial, 0) / tl.where(total > 0, total, 1.0)


@device_kernel
@triton.jit(do_not_specialize=["num_splits"])
def _combine_splits_kernel(
    partial_ptr, lse_ptr, out_ptr, num_splits, stride_out_seq, stride_out_head,
    HEAD_DIM: tl.constexpr, SPLITS_POW2: tl.constexpr,
):
    """One (sequence, query head): weight each split's output by its share of the softmax denominator."""
    seq = tl.program_id(0)
    head = tl.program_id(1)
    out = combine_splits(partial_ptr, lse_ptr, seq * tl.num_programs(1) + head, num_splits, HEAD_DIM, SPLITS_POW2)
    dims = tl.arange(0, HEAD_DIM)
    tl.store(out_ptr + seq * stride_out_seq + head * stride_out_head + dims, out.to(out_ptr.dtype.element_ty))


# --------------------------------------------------------------------------- the host side


def _check(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
           context_lens: torch.Tensor, out: torch.Tensor | None) -> None:
    """Shapes, dtypes and devices only: nothing here reads a tensor's values (no host synchronisation)."""
    if q.dim() != 3 or k_cache.dim() != 4:
        raise ValueError(f"q must be [batch, heads, head_dim] and the caches [num_blocks, block_size, kv_heads, "
                         f"head_dim]; got q {tuple(q.shape)}, k_cache {tuple(k_cache.shape)}")
    if v_cache.shape != k_cache.shape:
        raise ValueError(f"k_cache {tuple(k_cache.shape)} and v_cache {tuple(v_cache.shape)} differ in shape")
    batch, num_heads, head_dim = q.shape
    _, block_size, num_kv_heads, cache_head_dim = k_cache.shape
    fp8_cache = k_cache.dtype == v_cache.dtype == FP8_DTYPE
    if q.dtype not in SUPPORTED_DTYPES or not (fp8_cache or k_cache.dtype == v_cache.dtype == q.dtype):
        raise ValueError(f"q, k_cache and v_cache must share one of float32/float16/bfloat16 (or both caches "
                         f"float8_e4m3fn); got {q.dtype}, {k_cache.dtype}, {v_cache.dtype}")
    if cache_head_dim != head_dim or num_heads % num_kv_heads:
        raise ValueError(f"q has {num_heads} heads of {head_dim}; the cache {num_kv_heads} K/V heads of "
                         f"{cache_head_dim} (heads must be a multiple of K/V heads, head_dim equal)")
    if head_dim < 16 or head_dim & (head_dim - 1) or block_size & (block_size - 1):
        raise ValueError(f"head_dim must be a power of two >= 16 and block_size a power of two; got "
                         f"{head_dim}, {block_size}")
    if q.stride(-1) != 1 or k_cache.stride(-1) != 1 or v_cache.stride(-1) != 1:
        raise ValueError("q, k_cache and v_cache must be contiguous along head_dim")
    if block_tables.dim() != 2 or block_tables.shape[0] != batch or block_tables.dtype not in INDEX_DTYPES:
        raise ValueError(f"block_tables must be an int32 or int64 [batch={batch}, max_blocks] tensor; got "
                         f"{block_tables.dtype} {tuple(block_tables.shape)}")
    if context_lens.shape != (batch,) or context_lens.dtype not in INDEX_DTYPES:
        raise ValueError(f"context_lens must be an int32 or int64 [batch={batch}] tensor; got "
                         f"{context_lens.dtype} {tuple(context_lens.shape)}")
    if out is not None and (out.shape != q.shape or out.dtype != q.dtype or out.stride(-1) != 1):
        raise ValueError(f"out must be a {q.dtype} {tuple(q.shape)} tensor contiguous along head_dim; got "
                         f"{out.dtype} {tuple(out.shape)}")
    tensors = (q, k_cache, v_cache, block_tables, context_lens) + (() if out is None else (out,))
    if any(t.device != q.device for t in tensors):
        raise ValueError(f"all tensors must be on one device; got {[str(t.device) for t in tensors]}")


class _Layout:
    """What the wrapper derives from its tensors' shapes, strides, dtypes and devices, never from their values.

    An eager decode step calls the wrapper once per layer with tensors laid out alike (28 times for Qwen3-0.6B),
    so ``_layout`` checks and derives this once per layout and then finds it in a dictionary: the Python cost
    of a call drops from the checks plus some forty attribute reads to one tuple of them (about half: see
    benchmarks/KERNEL_NOTES.md, section 9.3).
    """

    def __init__(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
                 out: torch.Tensor | None) -> None:
        self.batch, self.num_heads, self.head_dim = q.shape
        _, self.block_size, self.num_kv_heads, _ = k_cache.shape
        self.max_blocks = block_tables.shape[1]
        self.num_sms = sm_count(q.device)
        # the kernel's stride arguments after scale_log2, num_splits and max_blocks, in its order; an FP8 cache's
        # in int16 words where the kernel reads it so (a cache whose strides are not all even is refused here)
        # Words need head_dim >= 32: each half of a key is a dot's inner dimension, at least 16 on a GPU; a smaller
        # head (the tests' tiny models) takes the FP8 tile byte by byte, as m12's prefill kernel does.
        self.fp8_words = k_cache.dtype == FP8_DTYPE and self.head_dim >= 2 * MIN_DOT_K
        if self.fp8_words:
            k_cache, v_cache = k_cache.view(torch.int16), v_cache.view(torch.int16)
        self.strides = (q.stride(0), q.stride(1), *k_cache.stride()[:3], *v_cache.stride()[:3], block_tables.stride(0))
        self.ptx = not runs_interpreted(q.device)  # the kernel's PTX widening of an FP8 cache (none interpreted)
        self.out_strides = (out.stride(0), out.stride(1)) if out is not None else (self.num_heads * self.head_dim,
                                                                                   self.head_dim)
        group = self.num_heads // self.num_kv_heads
        self.is_fp32 = q.dtype == torch.float32
        # Triton's interpreter computes bfloat16 dots wrongly: there, bf16 tiles go through the float32 dot path.
        self.dots_in_fp32 = self.is_fp32 or (runs_interpreted(q.device) and q.dtype == torch.bfloat16)
        self.constexprs = dict(GROUP=group, GROUP_ROWS=max(MIN_GROUP_ROWS, triton.next_power_of_2(group)),
                               HEAD_DIM=self.head_dim, BLOCK_SIZE=self.block_size, IEEE=self.is_fp32)


_LAYOUTS: dict[tuple, _Layout] = {}
_MAX_LAYOUTS = 1024  # batch sizes x table widths an engine meets; emptied when full (a miss only re-checks)


def _meta(t: torch.Tensor) -> tuple:
    return t.shape, t.stride(), t.dtype, t.device


def _layout(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
            context_lens: torch.Tensor, out: torch.Tensor | None) -> _Layout:
    """``_check`` and ``_Layout`` once per combination of shapes, strides, dtypes and devices (everything
    ``_check`` looks at), then a dictionary lookup."""
    key = (_meta(q), _meta(k_cache), _meta(v_cache), _meta(block_tables), _meta(context_lens),
           None if out is None else _meta(out))
    layout = _LAYOUTS.get(key)
    if layout is None:
        _check(q, k_cache, v_cache, block_tables, context_lens, out)
        if len(_LAYOUTS) >= _MAX_LAYOUTS:
            _LAYOUTS.clear()
        layout = _LAYOUTS[key] = _Layout(q, k_cache, v_cache, block_tables, out)
    return layout


def paged_decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                           block_tables: torch.Tensor, context_lens: torch.Tensor, scale: float, *,
                           max_context_len: int | None = None, num_splits: int | None = None,
                           out: torch.Tensor | None = None,
                           config: DecodeKernelConfig | None = None, k_scale: torch.Tensor | None = None,
                           v_scale: torch.Tensor | None = None, combine: Callable | None = None,
                           kernel: Callable | None = None, kernel_args: dict | None = None) -> torch.Tensor:
    """Attention of one new query token per sequence over its paged K/V; returns ``[B, heads, head_dim]``.

    ``q`` ``[B, heads, head_dim]`` (RoPE applied); ``k_cache``/``v_cache`` ``[num_blocks, block_size, kv_heads,
    head_dim]`` of q's dtype; ``block_tables`` ``[B, max_blocks]`` int32 or int64 (entries past a sequence's last
    block are never read); ``context_lens`` ``[B]`` int32 or int64, keys per sequence including the new one (a
    length of 0, e.g. a padding row of a captured graph, reads nothing and gives zeros). ``max_context_len``: a
    host-side upper bound on ``context_lens`` for the split heuristic (default: ``max_blocks * block_size``);
    ``num_splits`` overrides the heuristic; ``out`` receives the result if given. ``config``: by default
    ``LAUNCH_TABLE``'s entry for the regime (split or direct); a given config serves both regimes.
    ``k_scale`` / ``v_scale`` (one-element float32 tensors, read on the device): a float8_e4m3fn cache's scales
    (m13), required with such a cache and refused without one. ``combine(partial, lse, out, num_splits)``, where
    K is split: launches what weighs the slices into ``out`` instead of ``_combine_splits_kernel`` (m13's seam).
    ``kernel``: launched instead of ``_paged_decode_kernel``, with its arguments and ``kernel_args`` besides (m13's
    seam: a kernel whose programs make q before they decode).
    """
    layout = _layout(q, k_cache, v_cache, block_tables, context_lens, out)
    kv_fp8 = k_cache.dtype == FP8_DTYPE
    if kv_fp8 != (k_scale is not None) or kv_fp8 != (v_scale is not None):
        raise ValueError("k_scale and v_scale go with a float8_e4m3fn cache, and such a cache needs both; got a "
                         f"{k_cache.dtype} cache and k_scale {'given' if k_scale is not None else 'None'}, "
                         f"v_scale {'given' if v_scale is not None else 'None'}")
    if out is None:
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    if layout.batch == 0:
        return out
    table = FP8_LAUNCH_TABLE if kv_fp8 else LAUNCH_TABLE
    if num_splits is None:
        bound = layout.max_blocks * layout.block_size if max_context_len is None else max_context_len
        if config is None:
            config, num_splits = choose_launch(layout.batch, layout.num_kv_heads, max(1, bound), layout.num_sms,
                                               table)
        else:
            num_splits = choose_num_splits(layout.batch, layout.num_kv_heads, max(1, bound), layout.num_sms, config)
    elif not 1 <= num_splits <= MAX_SPLITS:
        raise ValueError(f"num_splits must be in [1, {MAX_SPLITS}], got {num_splits}")
    elif config is None:
        config = table["split" if num_splits > 1 else "direct"]

    batch, num_heads, head_dim = layout.batch, layout.num_heads, layout.head_dim
    split = num_splits > 1
    if split:
        partial = torch.empty((batch, num_heads, num_splits, head_dim), dtype=torch.float32, device=q.device)
        lse = torch.empty((batch, num_heads, num_splits), dtype=torch.float32, device=q.device)
        target, target_strides = partial, (num_heads * num_splits * head_dim, num_splits * head_dim, head_dim)
    else:
        lse = out  # unused by the direct path
        target, target_strides = out, (*layout.out_strides, 0)
    (kernel or _paged_decode_kernel)[(batch, layout.num_kv_heads, num_splits)](
        q, k_cache, v_cache, block_tables, context_lens, target, lse,
        scale * LOG2_E, num_splits, layout.max_blocks, *layout.strides, *target_strides,
        TILE=config.tile_tokens, SPLIT=split, DOT_FP32=layout.dots_in_fp32 or config.dot_in_fp32,
        k_scale_ptr=k_scale, v_scale_ptr=v_scale, KV_FP8=kv_fp8, FP8_WORDS=layout.fp8_words,
        PTX=layout.fp8_words and layout.ptx,
        num_warps=config.num_warps, num_stages=config.num_stages, **layout.constexprs, **(kernel_args or {}),
    )
    if split and combine is not None:
        combine(partial, lse, out, num_splits)
    elif split:
        _combine_splits_kernel[(batch, num_heads)](
            partial, lse, out, num_splits, *layout.out_strides,
            HEAD_DIM=head_dim, SPLITS_POW2=1 << (num_splits - 1).bit_length(), num_warps=4,  # next power of 2
        )
    return out


def paged_decode_attention_reference(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                                     block_tables: torch.Tensor, context_lens: torch.Tensor,
                                     scale: float, k_scale: torch.Tensor | float = 1.0,
                                     v_scale: torch.Tensor | float = 1.0) -> torch.Tensor:
    """The same result in plain torch, one sequence at a time in float32: the definition the kernel must meet
    (an FP8 cache's values times its ``k_scale`` / ``v_scale``)."""
    batch, num_heads, head_dim = q.shape
    _, block_size, num_kv_heads, _ = k_cache.shape
    group = num_heads // num_kv_heads
    out = torch.zeros_like(q)
    for b in range(batch):
        length = int(context_lens[b])
        if length == 0:
            continue
        blocks = block_tables[b, : -(-length // block_size)].long()
        keys = k_cache[blocks].reshape(-1, num_kv_heads, head_dim)[:length].float() * k_scale
        values = v_cache[blocks].reshape(-1, num_kv_heads, head_dim)[:length].float() * v_scale
        keys, values = keys.repeat_interleave(group, dim=1), values.repeat_interleave(group, dim=1)
        scores = torch.einsum("hd,thd->ht", q[b].float(), keys) * scale
        out[b] = torch.einsum("ht,thd->hd", scores.softmax(dim=-1), values).to(q.dtype)
    return out
