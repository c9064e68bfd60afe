"""int4 times x on the integer units: four products an instruction (the GEMV's ``unpack="dp4a"``).

The ``subnormal`` GEMV spends about two instructions a weight (a mask, a float multiply-add, a share of x's
scaling), and at one row of x the long int4 matmuls issue in 68-81% of the H200's cycles: its instructions, not
its bytes, are what they wait for (``docs/int4-gemv-journal.md``, "What the profiler says"). A GPU has an
instruction that does four products at once, on integers: ``dp4a`` adds the dot product of two words' four
bytes to a 32-bit integer. Its operands must be bytes, so x is turned into integers first:

    x, one row, group g of 128 inputs    s_x[g] = max |x| / 32767,  q = round(x * (32767 / max |x|))    (16 bits)
                                         q = 256 * hi + lo          (hi: signed byte, lo: unsigned byte)
    W's word of 8 nibbles u              u_lo = w & 0x0F0F0F0F      (inputs 4w .. 4w+3 of the group)
                                         u_hi = (w >> 4) & 0x0F0F0F0F   (inputs 64+4w .. 64+4w+3)
    sum_j (u_j - 8) q_j = 256 * (dp4a(u_lo, hi) + dp4a(u_hi, hi')) + dp4a(u_lo, lo) + dp4a(u_hi, lo') - 8 sum q

Three bit operations and four ``dp4a`` a word of eight weights, where ``subnormal`` takes eight multiply-adds and
about nine bit operations; each group's integer sums are converted to float once per four words (the GEMV's
``DP4A_WORDS_PER_FLOAT``) and scaled by ``s_x[g]`` times W's scale. The integers are exact; what changes is x: 16
bits against its group's largest input, finer than bf16's 8 for every input at least 1/128 of that largest
(smaller ones count for less than their rounding would).

On the H200 each batch-1 matmul of Qwen3-8B took 11-17% less time with x already in integers; the conversion,
a launch of 1.4 µs, takes most of that back at one row (the step 1.95x bf16 against 1.90x), not at two (1.68x
against 1.42x): ``docs/int4-gemv-journal.md``, "A tenth guess".

``int16_x`` writes each row of x in that form before a matmul (a small kernel of its own; where x comes from an
add + RMSNorm, the norm writes it instead: ``integer_norm.py``), as int32 words::

    [ hi bytes: K / 4 words | lo bytes: K / 4 words | s_x: K / 128 floats | sum q: K / 128 ints ]

``_dp4a`` is one PTX instruction in a compiled kernel; Triton's interpreter runs no PTX, so there it is the same
sum spelled out byte by byte (``PTX`` false), which the CPU tests compare against the float reference.
"""

from __future__ import annotations

import torch

import triton
import triton.language as tl

from milestones.m08_triton_kernel.device_kernel import device_kernel

from .quantize import GROUP_SIZE

X_INT_MAX = 32767  # x's integers: 16 bits, two bytes for dp4a
_X_INT_MAX = tl.constexpr(X_INT_MAX)
# int16_x: groups of 128 inputs a program converts (4 warps). On the H200, 36 conversions in a graph took 1.45 and
# 1.48 µs each at K = 4,096 and 12,288 with 4 groups, 1.60 and 1.62 with 8; the step 11 µs less at batch 1
# (results/h200/int16_x_grid.json, m13_step_times+dp4a-grid2.json).
GROUPS_PER_PROGRAM = 4


def int16_x_words(k: int) -> int:
    """int32 words per row of ``int16_x``'s output for ``k`` inputs."""
    return k // 2 + 2 * (k // GROUP_SIZE)


@triton.jit
def _dp4a(a, b, c, B_SIGNED: tl.constexpr, PTX: tl.constexpr):
    """``c + sum_i a.byte[i] * b.byte[i]`` for int32 words, ``a``'s bytes unsigned, ``b``'s signed or not."""
    if PTX:
        if B_SIGNED:
            return tl.inline_asm_elementwise("dp4a.u32.s32 $0, $1, $2, $3;", "=r,r,r,r", [a, b, c],
                                             dtype=tl.int32, is_pure=True, pack=1)
        return tl.inline_asm_elementwise("dp4a.u32.u32 $0, $1, $2, $3;", "=r,r,r,r", [a, b, c],
                                         dtype=tl.int32, is_pure=True, pack=1)
    total = c
    for i in tl.static_range(4):
        b_byte = (b >> (8 * i)) & 0xFF
        if B_SIGNED:
            b_byte = b_byte - ((b_byte & 0x80) << 1)
        total = total + ((a >> (8 * i)) & 0xFF) * b_byte
    return total


@triton.jit
def _int4_group_dp4a(words, x_row_ptr, K, kg, k_end, WORDS: tl.constexpr, PTX: tl.constexpr):
    """One row of x (``int16_x``'s form) times one 128-input group of W held as ``[BLOCK_N, WORDS]`` int32 words:
    ``(sum_j (u_j - 8) q_j`` per word as int32, ``s_x`` of the group). The group's ``-8 sum q`` rides in word 0's
    first ``dp4a`` (its starting value), so it costs no instruction per row. ``k_end``: where this program's
    slice of K ends (None: whole tiles, no mask)."""
    j = tl.arange(0, WORDS)
    hi_ptr = x_row_ptr + kg // 4 + j  # the words of inputs 4w .. 4w+3
    lo_ptr = hi_ptr + K // 4
    stats = x_row_ptr + K // 2 + tl.minimum(kg, K - 128) // 128  # a group past K (masked off) reads the last
    s_x = tl.load(stats).to(tl.float32, bitcast=True)
    q_sum = tl.load(stats + K // 128)
    if k_end is None:
        hi_a = tl.load(hi_ptr)
        hi_b = tl.load(hi_ptr + WORDS)  # inputs 64 + 4w ..
        lo_a = tl.load(lo_ptr)
        lo_b = tl.load(lo_ptr + WORDS)
    else:  # the group is in this slice of K or not at all: x's words 0 and no -8 sum q
        ok = kg + 0 * j < k_end
        hi_a = tl.load(hi_ptr, mask=ok, other=0)
        hi_b = tl.load(hi_ptr + WORDS, mask=ok, other=0)
        lo_a = tl.load(lo_ptr, mask=ok, other=0)
        lo_b = tl.load(lo_ptr + WORDS, mask=ok, other=0)
        q_sum = tl.where(kg < k_end, q_sum, 0)
    u_lo = words & 0x0F0F0F0F
    u_hi = (words >> 4) & 0x0F0F0F0F
    # dp4a's operands broadcast along W's rows (inline assembly takes tensors of one shape)
    _, offset = tl.broadcast(words, tl.where(j == 0, -8 * q_sum, 0)[None, :])
    _, hi_a = tl.broadcast(words, hi_a[None, :])
    _, hi_b = tl.broadcast(words, hi_b[None, :])
    _, lo_a = tl.broadcast(words, lo_a[None, :])
    _, lo_b = tl.broadcast(words, lo_b[None, :])
    high = _dp4a(u_hi, hi_b, _dp4a(u_lo, hi_a, tl.zeros_like(words), True, PTX), True, PTX)
    low = _dp4a(u_hi, lo_b, _dp4a(u_lo, lo_a, offset, False, PTX), False, PTX)
    return high * 256 + low, s_x


@device_kernel
@triton.jit
def _int16_x_kernel(x_ptr, out_ptr, K, stride_xm, stride_om, GROUPS: tl.constexpr, GROUP: tl.constexpr):
    """``GROUPS`` groups of one row of x -> their hi and lo bytes (packed four to a word), ``s_x`` and ``sum q``."""
    row = tl.program_id(0)
    groups = tl.program_id(1) * GROUPS + tl.arange(0, GROUPS)
    group_ok = groups < K // GROUP
    cols = groups[:, None] * GROUP + tl.arange(0, GROUP)[None, :]
    x = tl.load(x_ptr + row * stride_xm + cols, mask=group_ok[:, None], other=0.0).to(tl.float32)
    store_int16_groups(x, groups, group_ok, out_ptr + row * stride_om, K, GROUPS, GROUP)


@triton.jit
def store_int16_groups(x, groups, group_ok, out_row_ptr, K, GROUPS: tl.constexpr, GROUP: tl.constexpr):
    """x ``[GROUPS, GROUP]`` float32, groups ``groups`` of a row of ``K`` inputs -> that row's words (the
    layout above), where ``group_ok``."""
    biggest = tl.max(tl.abs(x), axis=1)
    # Two IEEE divisions a group (a compiled "/" is an approximate one), then a multiply per input: a division
    # per input made the norm that converts its row 0.24 µs slower at 16 warps, 1.0 at 4
    # (results/h200/integer_norm_warps.json). The integers are int16_x_reference's to the bit.
    s_x = tl.where(biggest > 0, tl.math.div_rn(biggest, tl.full(biggest.shape, _X_INT_MAX, tl.float32)), 1.0)
    top = tl.full(biggest.shape, _X_INT_MAX, tl.float32)
    inverse = tl.math.div_rn(top, tl.where(biggest > 0, biggest, top))  # an all-zero group: 1
    q = _round(x * inverse[:, None])
    q = tl.minimum(tl.maximum(q, -_X_INT_MAX), _X_INT_MAX)
    hi = (q >> 8) & 0xFF
    lo = q & 0xFF
    shifts = (tl.arange(0, 4) * 8)[None, None, :]
    hi_words = tl.sum(tl.reshape(hi, [GROUPS, GROUP // 4, 4]) << shifts, axis=2)
    lo_words = tl.sum(tl.reshape(lo, [GROUPS, GROUP // 4, 4]) << shifts, axis=2)
    words = groups[:, None] * (GROUP // 4) + tl.arange(0, GROUP // 4)[None, :]
    tl.store(out_row_ptr + words, hi_words, mask=group_ok[:, None])
    tl.store(out_row_ptr + K // 4 + words, lo_words, mask=group_ok[:, None])
    tl.store(out_row_ptr + K // 2 + groups, s_x.to(tl.int32, bitcast=True), mask=group_ok)
    tl.store(out_row_ptr + K // 2 + K // GROUP + groups, tl.sum(q, axis=1), mask=group_ok)


@triton.jit
def _round(v):
    """Round to the nearest integer, halves away from zero (any fixed rule will do: x's step is 1/32767 of the
    group's largest input)."""
    return tl.where(v >= 0, v + 0.5, v - 0.5).to(tl.int32)


def int16_x(x: torch.Tensor) -> torch.Tensor:
    """x ``[M, K]`` -> ``[M, int16_x_words(K)]`` int32: each 128-input group as 16-bit integers and its scale."""
    m, k = x.shape
    out = torch.empty((m, int16_x_words(k)), dtype=torch.int32, device=x.device)
    groups = k // GROUP_SIZE
    _int16_x_kernel[(m, triton.cdiv(groups, GROUPS_PER_PROGRAM))](
        x, out, k, x.stride(0), out.stride(0), GROUPS=GROUPS_PER_PROGRAM, GROUP=GROUP_SIZE, num_warps=4)
    return out


def int16_x_reference(x: torch.Tensor) -> torch.Tensor:
    """What ``int16_x`` computes, in torch: the float x its integers stand for, ``[M, K]`` float32."""
    m, k = x.shape
    groups = x.float().view(m, k // GROUP_SIZE, GROUP_SIZE)
    biggest = groups.abs().amax(dim=2, keepdim=True)
    s_x = torch.where(biggest > 0, biggest / X_INT_MAX, torch.ones_like(biggest))
    v = groups * torch.where(biggest > 0, X_INT_MAX / biggest, torch.ones_like(biggest))
    q = torch.where(v >= 0, v + 0.5, v - 0.5).trunc().clamp(-X_INT_MAX, X_INT_MAX)
    return (q * s_x).view(m, k)
