"""One GPU call: int4 at batch 1-8 on the tensor cores, each lane unpacking exactly its own mma fragment.

m13's words GEMV issues 7.2 sm_90 instructions a weight byte (its whole loop) and streams at 2.2-2.9 TB/s; a
kernel that only streams the same bytes reaches 4.5. Triton's own tensor-core path at batch 1 issued 17.9 a byte
(`scratch/int4_tc.py` at a9c7203): its layout changes go through shared memory. This kernel skips Triton's layouts:

- the weights are stored in the order of ``mma.sync.m16n8k16``'s A fragments: the int32 word lane l loads for one
  k16 step of a 16-row block holds exactly the 8 nibbles that lane needs (rows g, g + 8; four inputs each);
- one ``lop3`` per register turns two nibbles into two bf16 values 128 + u (``(w >> 4q) & 0x000F000F |
  0x43004300``), so a word becomes an A fragment in 4 lop3 and 3 shifts, and one mma multiplies it by x;
- x is the B operand (column n: row n of x, so batch 1 to 8 costs the same); a second mma per k16 step with A = 136
  everywhere gives 136 * sum(x), which every row subtracts per group before its scale: sum((u - 8) x);
- the inputs of a k16 step are permuted (the same permutation in A and B) so that a lane's x for four k16 steps is
  one contiguous 32 bytes;
- every tensor is 1-D with one element per thread (32 * warps elements), so thread r is lane r % 32 of warp r // 32
  and the inline assembly (``tl.inline_asm_elementwise``) sees that lane's registers.

About 7 integer instructions and 1.25 mma per 4 bytes, against the words kernel's ~29 (its loop, 7.2 a byte).

Call 50 timed ``_int4_mma_kernel`` (K in slices across programs, as m13's GEMV, finished by the last program) at
8d20ea9; call 52 ``_int4_mma_warps_kernel``, whose warps split K inside one program.

    python3 scratch/int4_mma.py OUT.json      (on a GPU; the repository root on PYTHONPATH)
"""

from __future__ import annotations

import itertools
import json
import statistics
import subprocess
import sys
import tempfile
import time

import torch
import triton
import triton.language as tl

MASK = "0x000F000F"
MAGIC = "0x43004300"  # bf16 128.0 in both halves: | u gives 128 + u (u < 16)
CORRECTION = "0x43084308"  # bf16 136.0 = 128 + 8 in both halves


def _chunk_asm(correction: bool, blocks: int = 2) -> tuple[str, str]:
    """One 64-input chunk of one or two 16-row blocks (P, Q): 4 k16 steps, each an mma per block (and, with
    ``correction``, one with A = 136 everywhere: 136 * sum(x)). Outputs: P's, Q's (and the correction's)
    accumulators, 4 floats each (rows g, g + 8 x columns 2t, 2t + 1). Inputs: P's words (steps 0|1, 2|3 as two
    int64), Q's, x (step j: low half the B fragment's first register, high half its second), the accumulators."""
    outs = 4 * (blocks + correction)
    w0, x0 = outs, outs + 2 * blocks
    c0 = x0 + 4
    lines = ["{", ".reg .b32 w<8>, xa<4>, xb<4>, a<4>, t, m, mg, kc;", ".reg .f32 dA<4>, dB<4>, dC<4>;",
             f"mov.b32 m, {MASK};", f"mov.b32 mg, {MAGIC};", f"mov.b32 kc, {CORRECTION};"]
    lines += [f"mov.b64 {{w{2 * i}, w{2 * i + 1}}}, ${w0 + i};" for i in range(2 * blocks)]
    lines += [f"mov.b64 {{xa{j}, xb{j}}}, ${x0 + j};" for j in range(4)]
    mma = "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32"
    accs = (("dA", 0, c0), ("dB", 4, c0 + 4))[:blocks]
    if correction:
        accs += (("dC", None, c0 + 4 * blocks),)
    for j in range(4):
        for acc, first_word, before in accs:
            c = ", ".join(f"${before + i}" for i in range(4)) if j == 0 else ", ".join(f"{acc}{i}" for i in range(4))
            d = ", ".join(f"{acc}{i}" for i in range(4))
            if first_word is None:
                lines.append(f"{mma} {{{d}}}, {{kc, kc, kc, kc}}, {{xa{j}, xb{j}}}, {{{c}}};")
                continue
            word = f"w{first_word + j}"
            lines.append(f"lop3.b32 a0, {word}, m, mg, 0xEA;")
            for q in (1, 2, 3):
                lines.append(f"shr.u32 t, {word}, {4 * q};")
                lines.append(f"lop3.b32 a{q}, t, m, mg, 0xEA;")
            lines.append(f"{mma} {{{d}}}, {{a0, a1, a2, a3}}, {{xa{j}, xb{j}}}, {{{c}}};")
    for i, (acc, _, _) in enumerate(a for a in accs for _ in range(4)):
        lines.append(f"mov.f32 ${i}, {acc}{i % 4};")
    lines.append("}")
    constraints = ",".join(["=f"] * outs + ["l"] * (2 * blocks + 4) + ["f"] * outs)
    return "\n".join(lines), constraints


ASM_ONE, CONSTRAINTS_ONE = (tl.constexpr(v) for v in _chunk_asm(True, blocks=1))
ASM_CORRECTION, CONSTRAINTS_CORRECTION = (tl.constexpr(v) for v in _chunk_asm(True))
ASM_PLAIN, CONSTRAINTS_PLAIN = (tl.constexpr(v) for v in _chunk_asm(False))


@triton.jit
def _pairs(ptr, mask=None):
    """Two adjacent values per thread (``ptr``: one pointer per thread) -> two 1-D tensors: one vector load."""
    if mask is None:
        v = tl.load(ptr[:, None] + tl.arange(0, 2)[None, :])
    else:
        v = tl.load(ptr[:, None] + tl.arange(0, 2)[None, :], mask=mask[:, None], other=0)
    return tl.split(v)


@triton.jit
def _chunk_with_correction(p01, p23, q01, q23, x0, x1, x2, x3, cP0, cP1, cP2, cP3, cQ0, cQ1, cQ2, cQ3,
                           cC0, cC1, cC2, cC3):
    return tl.inline_asm_elementwise(ASM_CORRECTION, CONSTRAINTS_CORRECTION,
                                     [p01, p23, q01, q23, x0, x1, x2, x3, cP0, cP1, cP2, cP3, cQ0, cQ1, cQ2, cQ3,
                                      cC0, cC1, cC2, cC3], dtype=(tl.float32,) * 12, is_pure=True, pack=1)


@triton.jit
def _chunk_plain(p01, p23, q01, q23, x0, x1, x2, x3, cP0, cP1, cP2, cP3, cQ0, cQ1, cQ2, cQ3):
    return tl.inline_asm_elementwise(ASM_PLAIN, CONSTRAINTS_PLAIN,
                                     [p01, p23, q01, q23, x0, x1, x2, x3, cP0, cP1, cP2, cP3, cQ0, cQ1, cQ2, cQ3],
                                     dtype=(tl.float32,) * 8, is_pure=True, pack=1)


@triton.jit
def _store4(ptr, stride_m, M, row_lo, t, v0, v1, v2, v3):
    """A lane's 4 accumulators: rows row_lo and row_lo + 8, columns (rows of x) 2t and 2t + 1."""
    c0 = 2 * t
    c1 = c0 + 1
    tl.store(ptr + c0 * stride_m + row_lo, v0, mask=c0 < M)
    tl.store(ptr + c1 * stride_m + row_lo, v1, mask=c1 < M)
    tl.store(ptr + c0 * stride_m + row_lo + 8, v2, mask=c0 < M)
    tl.store(ptr + c1 * stride_m + row_lo + 8, v3, mask=c1 < M)


@triton.jit
def _load4(ptr, stride_m, M, row_lo, t):
    c0 = 2 * t
    c1 = c0 + 1
    return (tl.load(ptr + c0 * stride_m + row_lo, mask=c0 < M, other=0.0, cache_modifier=".cg"),
            tl.load(ptr + c1 * stride_m + row_lo, mask=c1 < M, other=0.0, cache_modifier=".cg"),
            tl.load(ptr + c0 * stride_m + row_lo + 8, mask=c0 < M, other=0.0, cache_modifier=".cg"),
            tl.load(ptr + c1 * stride_m + row_lo + 8, mask=c1 < M, other=0.0, cache_modifier=".cg"))


@triton.jit
def _finish(out_ptr, part_ptr, M, N, stride_om, row, t, a0, a1, a2, a3, pid_k, SPLIT: tl.constexpr):
    """Store a block's sums (SPLIT: this slice's float32 sums, into its plane of ``part_ptr``)."""
    if SPLIT:
        _store4(part_ptr + pid_k * M * N, N, M, row, t, a0, a1, a2, a3)
    else:
        ty = out_ptr.dtype.element_ty
        _store4(out_ptr, stride_om, M, row, t, a0.to(ty), a1.to(ty), a2.to(ty), a3.to(ty))


@triton.jit
def _add_planes(out_ptr, part_ptr, M, N, stride_om, row, t, slices):
    a0, a1, a2, a3 = _load4(part_ptr, N, M, row, t)
    for s in range(1, slices):
        b0, b1, b2, b3 = _load4(part_ptr + s * M * N, N, M, row, t)
        a0 += b0
        a1 += b1
        a2 += b2
        a3 += b3
    ty = out_ptr.dtype.element_ty
    _store4(out_ptr, stride_om, M, row, t, a0.to(ty), a1.to(ty), a2.to(ty), a3.to(ty))


@triton.jit
def _int4_mma_kernel(x_ptr, w_ptr, s_ptr, out_ptr, part_ptr, count_ptr, M, N, K, groups_per_split, stride_xm,
                     stride_om, WARPS: tl.constexpr, BLOCKS: tl.constexpr, STAGES: tl.constexpr,
                     SPLIT: tl.constexpr):
    """Each warp: ``BLOCKS`` (2 or 4) 16-row blocks over a slice of K, one 128-input group per loop step."""
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    r = tl.arange(0, 32 * WARPS)
    lane = r % 32
    g = lane // 4
    t = lane % 4
    blk = ((pid_n * WARPS + r // 32) * BLOCKS).to(tl.int64)  # this warp's first 16-row block
    chunks = K // 64
    groups = K // 128
    w_blk = chunks * 64  # int64 words a block holds: [N / 16, K / 64, 32 lanes, 4 words]
    wp = w_ptr + blk * w_blk + lane * 2  # lane l's 16 bytes of a chunk
    x_ok = g < M
    xp = x_ptr + g * stride_xm + t * 4  # x as int64 [M, K / 4]: lane (g, t)'s 4 of a chunk at 16c + 4t
    s_blk = groups * 16  # scales: [N / 16, K / 128, 8, 2]: rows g and g + 8 of a block side by side
    sp = s_ptr + blk * s_blk + 2 * g
    zero = tl.zeros([32 * WARPS], tl.float32)
    aP0 = zero
    aP1 = zero
    aP2 = zero
    aP3 = zero
    aQ0 = zero
    aQ1 = zero
    aQ2 = zero
    aQ3 = zero
    aR0 = zero
    aR1 = zero
    aR2 = zero
    aR3 = zero
    aS0 = zero
    aS1 = zero
    aS2 = zero
    aS3 = zero
    g0 = pid_k * groups_per_split
    for grp in tl.range(g0, g0 + groups_per_split, num_stages=STAGES):
        cP0 = zero
        cP1 = zero
        cP2 = zero
        cP3 = zero
        cQ0 = zero
        cQ1 = zero
        cQ2 = zero
        cQ3 = zero
        cR0 = zero
        cR1 = zero
        cR2 = zero
        cR3 = zero
        cS0 = zero
        cS1 = zero
        cS2 = zero
        cS3 = zero
        cC0 = zero
        cC1 = zero
        cC2 = zero
        cC3 = zero
        for h in tl.static_range(2):
            c = 2 * grp + h
            x0, x1 = _pairs(xp + c * 16, x_ok)
            x2, x3 = _pairs(xp + c * 16 + 2, x_ok)
            p01, p23 = _pairs(wp + c * 64)
            q01, q23 = _pairs(wp + w_blk + c * 64)
            cP0, cP1, cP2, cP3, cQ0, cQ1, cQ2, cQ3, cC0, cC1, cC2, cC3 = _chunk_with_correction(
                p01, p23, q01, q23, x0, x1, x2, x3, cP0, cP1, cP2, cP3, cQ0, cQ1, cQ2, cQ3, cC0, cC1, cC2, cC3)
            if BLOCKS == 4:
                r01, r23 = _pairs(wp + 2 * w_blk + c * 64)
                s01, s23 = _pairs(wp + 3 * w_blk + c * 64)
                cR0, cR1, cR2, cR3, cS0, cS1, cS2, cS3 = _chunk_plain(
                    r01, r23, s01, s23, x0, x1, x2, x3, cR0, cR1, cR2, cR3, cS0, cS1, cS2, cS3)
        sc_plo, sc_phi = _pairs(sp + grp * 16)
        sc_qlo, sc_qhi = _pairs(sp + s_blk + grp * 16)
        aP0 += sc_plo * (cP0 - cC0)
        aP1 += sc_plo * (cP1 - cC1)
        aP2 += sc_phi * (cP2 - cC2)
        aP3 += sc_phi * (cP3 - cC3)
        aQ0 += sc_qlo * (cQ0 - cC0)
        aQ1 += sc_qlo * (cQ1 - cC1)
        aQ2 += sc_qhi * (cQ2 - cC2)
        aQ3 += sc_qhi * (cQ3 - cC3)
        if BLOCKS == 4:
            sc_rlo, sc_rhi = _pairs(sp + 2 * s_blk + grp * 16)
            sc_slo, sc_shi = _pairs(sp + 3 * s_blk + grp * 16)
            aR0 += sc_rlo * (cR0 - cC0)
            aR1 += sc_rlo * (cR1 - cC1)
            aR2 += sc_rhi * (cR2 - cC2)
            aR3 += sc_rhi * (cR3 - cC3)
            aS0 += sc_slo * (cS0 - cC0)
            aS1 += sc_slo * (cS1 - cC1)
            aS2 += sc_shi * (cS2 - cC2)
            aS3 += sc_shi * (cS3 - cC3)
    row = blk * 16 + g
    _finish(out_ptr, part_ptr, M, N, stride_om, row, t, aP0, aP1, aP2, aP3, pid_k, SPLIT)
    _finish(out_ptr, part_ptr, M, N, stride_om, row + 16, t, aQ0, aQ1, aQ2, aQ3, pid_k, SPLIT)
    if BLOCKS == 4:
        _finish(out_ptr, part_ptr, M, N, stride_om, row + 32, t, aR0, aR1, aR2, aR3, pid_k, SPLIT)
        _finish(out_ptr, part_ptr, M, N, stride_om, row + 48, t, aS0, aS1, aS2, aS3, pid_k, SPLIT)
    if SPLIT:  # the program that counts itself done last adds the slices' sums in slice order
        tl.debug_barrier()
        done_before = tl.atomic_add(count_ptr + pid_n, 1, sem="acq_rel")
        if done_before == tl.num_programs(1) - 1:
            slices = tl.num_programs(1)
            _add_planes(out_ptr, part_ptr, M, N, stride_om, row, t, slices)
            _add_planes(out_ptr, part_ptr, M, N, stride_om, row + 16, t, slices)
            if BLOCKS == 4:
                _add_planes(out_ptr, part_ptr, M, N, stride_om, row + 32, t, slices)
                _add_planes(out_ptr, part_ptr, M, N, stride_om, row + 48, t, slices)
            tl.atomic_xchg(count_ptr + pid_n, 0, sem="relaxed")


@triton.jit
def _chunk_one(p01, p23, x0, x1, x2, x3, cP0, cP1, cP2, cP3, cC0, cC1, cC2, cC3):
    return tl.inline_asm_elementwise(ASM_ONE, CONSTRAINTS_ONE,
                                     [p01, p23, x0, x1, x2, x3, cP0, cP1, cP2, cP3, cC0, cC1, cC2, cC3],
                                     dtype=(tl.float32,) * 8, is_pure=True, pack=1)


@triton.jit
def _across_warps(v, WARPS: tl.constexpr):
    """[32 * WARPS] (element r: lane r % 32 of warp r // 32) -> [32]: each lane's values summed over the warps."""
    if WARPS > 1:
        v = tl.sum(tl.reshape(v, [WARPS, 32]), axis=0)
    return v


@triton.jit
def _store_block(out_ptr, stride_om, M, row, t, a0, a1, a2, a3, WARPS: tl.constexpr):
    ty = out_ptr.dtype.element_ty
    _store4(out_ptr, stride_om, M, row, t, _across_warps(a0, WARPS).to(ty), _across_warps(a1, WARPS).to(ty),
            _across_warps(a2, WARPS).to(ty), _across_warps(a3, WARPS).to(ty))


@triton.jit
def _int4_mma_warps_kernel(x_ptr, w_ptr, s_ptr, out_ptr, M, N, K, stride_xm, stride_om, WARPS: tl.constexpr,
                           BLOCKS: tl.constexpr, STAGES: tl.constexpr, GROUPED: tl.constexpr = False):
    """(call 52) K split inside a program: its ``WARPS`` warps share the same ``BLOCKS`` (1, 2 or 4) 16-row blocks,
    warp w taking groups [w G / WARPS, (w + 1) G / WARPS); their sums are added through shared memory at the end
    (``tl.sum`` across the warp axis). No slices of K across programs: no partial sums in memory, no counter, no
    program that finishes the others' work. ``GROUPED`` (call 53): the weights of a program's blocks stored chunk by
    chunk (``mma_words_grouped``), so that each loop step of a warp reads one contiguous piece."""
    pid = tl.program_id(0)
    r = tl.arange(0, 32 * WARPS)
    lane = r % 32
    g = lane // 4
    t = lane % 4
    blk = (pid * BLOCKS).to(tl.int64)
    chunks = K // 64
    groups = K // 128
    per_warp = groups // WARPS
    first = (r // 32) * per_warp  # this warp's first group
    if GROUPED:  # [N / 16B, K / 64, B, 32, 4] words and [N / 16B, K / 128, B, 8, 2] scales
        w_blk = 64
        w_chunk = BLOCKS * 64
        s_blk = 16
        s_grp = BLOCKS * 16
    else:  # [N / 16, K / 64, 32, 4] and [N / 16, K / 128, 8, 2]
        w_blk = chunks * 64
        w_chunk = 64
        s_blk = groups * 16
        s_grp = 16
    wp = w_ptr + blk * (chunks * 64) + lane * 2
    x_ok = g < M
    xp = x_ptr + g * stride_xm + t * 4
    sp = s_ptr + blk * (groups * 16) + 2 * g
    zero = tl.zeros([32 * WARPS], tl.float32)
    aP0 = zero
    aP1 = zero
    aP2 = zero
    aP3 = zero
    aQ0 = zero
    aQ1 = zero
    aQ2 = zero
    aQ3 = zero
    aR0 = zero
    aR1 = zero
    aR2 = zero
    aR3 = zero
    aS0 = zero
    aS1 = zero
    aS2 = zero
    aS3 = zero
    for it in tl.range(0, per_warp, num_stages=STAGES):
        grp = first + it
        cP0 = zero
        cP1 = zero
        cP2 = zero
        cP3 = zero
        cQ0 = zero
        cQ1 = zero
        cQ2 = zero
        cQ3 = zero
        cR0 = zero
        cR1 = zero
        cR2 = zero
        cR3 = zero
        cS0 = zero
        cS1 = zero
        cS2 = zero
        cS3 = zero
        cC0 = zero
        cC1 = zero
        cC2 = zero
        cC3 = zero
        for h in tl.static_range(2):
            c = 2 * grp + h
            x0, x1 = _pairs(xp + c * 16, x_ok)
            x2, x3 = _pairs(xp + c * 16 + 2, x_ok)
            p01, p23 = _pairs(wp + c * w_chunk)
            if BLOCKS == 1:
                cP0, cP1, cP2, cP3, cC0, cC1, cC2, cC3 = _chunk_one(
                    p01, p23, x0, x1, x2, x3, cP0, cP1, cP2, cP3, cC0, cC1, cC2, cC3)
            else:
                q01, q23 = _pairs(wp + w_blk + c * w_chunk)
                cP0, cP1, cP2, cP3, cQ0, cQ1, cQ2, cQ3, cC0, cC1, cC2, cC3 = _chunk_with_correction(
                    p01, p23, q01, q23, x0, x1, x2, x3, cP0, cP1, cP2, cP3, cQ0, cQ1, cQ2, cQ3, cC0, cC1, cC2, cC3)
            if BLOCKS == 4:
                r01, r23 = _pairs(wp + 2 * w_blk + c * w_chunk)
                s01, s23 = _pairs(wp + 3 * w_blk + c * w_chunk)
                cR0, cR1, cR2, cR3, cS0, cS1, cS2, cS3 = _chunk_plain(
                    r01, r23, s01, s23, x0, x1, x2, x3, cR0, cR1, cR2, cR3, cS0, cS1, cS2, cS3)
        sc_plo, sc_phi = _pairs(sp + grp * s_grp)
        aP0 += sc_plo * (cP0 - cC0)
        aP1 += sc_plo * (cP1 - cC1)
        aP2 += sc_phi * (cP2 - cC2)
        aP3 += sc_phi * (cP3 - cC3)
        if BLOCKS > 1:
            sc_qlo, sc_qhi = _pairs(sp + s_blk + grp * s_grp)
            aQ0 += sc_qlo * (cQ0 - cC0)
            aQ1 += sc_qlo * (cQ1 - cC1)
            aQ2 += sc_qhi * (cQ2 - cC2)
            aQ3 += sc_qhi * (cQ3 - cC3)
        if BLOCKS == 4:
            sc_rlo, sc_rhi = _pairs(sp + 2 * s_blk + grp * s_grp)
            sc_slo, sc_shi = _pairs(sp + 3 * s_blk + grp * s_grp)
            aR0 += sc_rlo * (cR0 - cC0)
            aR1 += sc_rlo * (cR1 - cC1)
            aR2 += sc_rhi * (cR2 - cC2)
            aR3 += sc_rhi * (cR3 - cC3)
            aS0 += sc_slo * (cS0 - cC0)
            aS1 += sc_slo * (cS1 - cC1)
            aS2 += sc_shi * (cS2 - cC2)
            aS3 += sc_shi * (cS3 - cC3)
    lanes = tl.arange(0, 32)
    row = blk * 16 + lanes // 4
    t32 = lanes % 4
    _store_block(out_ptr, stride_om, M, row, t32, aP0, aP1, aP2, aP3, WARPS)
    if BLOCKS > 1:
        _store_block(out_ptr, stride_om, M, row + 16, t32, aQ0, aQ1, aQ2, aQ3, WARPS)
    if BLOCKS == 4:
        _store_block(out_ptr, stride_om, M, row + 32, t32, aR0, aR1, aR2, aR3, WARPS)
        _store_block(out_ptr, stride_om, M, row + 48, t32, aS0, aS1, aS2, aS3, WARPS)


def int4_mma_warps_matmul(x: torch.Tensor, words: torch.Tensor, scales: torch.Tensor, n: int, *, warps: int = 4,
                          blocks: int = 1, stages: int = 3, out: torch.Tensor | None = None,
                          grouped: bool = False) -> torch.Tensor:
    m, k = x.shape
    assert 1 <= m <= 8 and k % 128 == 0 and n % (16 * blocks) == 0 and (k // 128) % warps == 0
    x64 = x.view(torch.int64)
    out = x.new_empty((m, n)) if out is None else out
    _int4_mma_warps_kernel[(n // (16 * blocks),)](
        x64, words.view(torch.int64), scales, out, m, n, k, x64.stride(0), out.stride(0), WARPS=warps,
        BLOCKS=blocks, STAGES=stages, GROUPED=grouped, num_warps=warps)
    return out


@triton.jit
def _stream_kernel(w_ptr, x_ptr, out_ptr, n_words, iters, STAGES: tl.constexpr, BLOCK: tl.constexpr):
    """Call 27's floor: each program streams its contiguous share of int32 words, one multiply-add a word."""
    pid = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    acc = tl.zeros([BLOCK], tl.float32)
    base = pid * iters * BLOCK
    for i in tl.range(0, iters, num_stages=STAGES):
        idx = base + i * BLOCK + offs
        w = tl.load(w_ptr + idx, mask=idx < n_words, other=0)
        acc += w.to(tl.float32, bitcast=True) * tl.load(x_ptr + offs).to(tl.float32)
    tl.store(out_ptr + pid, tl.sum(acc))


# ----------------------------------------------------------------------------------------------- formats


def nibbles_from_packed(packed: torch.Tensor) -> torch.Tensor:
    """m13's packed rows ``[N, K / 2]`` (byte j of group g: inputs 128g + j low, 128g + 64 + j high) -> u ``[N, K]``."""
    n, half = packed.shape
    b = packed.view(n, half // 64, 64).to(torch.int32)
    return torch.cat([b & 15, b >> 4], dim=2).reshape(n, 2 * half)


def mma_words(u: torch.Tensor) -> torch.Tensor:
    """u ``[N, K]`` (0..15) -> int32 ``[N / 16, K / 64, 32, 4]``: per 16-row block and 64-input chunk, lane l's
    words for its four k16 steps (16 bytes). Row 16R + 8h + g, input 64c + 16t + 4j + 2kk + e sits in
    lane 4g + t's word j as nibble (h + 2kk) + 4e."""
    n, k = u.shape
    v = u.to(torch.int64).reshape(n // 16, 2, 8, k // 64, 4, 4, 2, 2)  # R, h, g, c, t, j, kk, e
    v = v.permute(0, 3, 2, 4, 5, 1, 6, 7)  # R, c, g, t, j, h, kk, e
    shifts = torch.tensor([[[0, 16], [8, 24]], [[4, 20], [12, 28]]], dtype=torch.int64, device=u.device)  # h,kk,e
    words = (v << shifts).sum(dim=(-3, -2, -1))  # R, c, g, t, j: 32-bit patterns in int64
    words = torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)
    return words.reshape(n // 16, k // 64, 32, 4).contiguous()  # R, c, lane, j: a lane's 16 bytes together


def mma_words_grouped(words: torch.Tensor, blocks: int) -> torch.Tensor:
    """``mma_words`` reordered so that the ``blocks`` 16-row blocks of one program sit chunk by chunk:
    ``[N / 16B, K / 64, B, 32, 4]``: a warp's loop step (2 chunks of B blocks) is one contiguous 1-4 KiB."""
    r, c = words.shape[:2]
    return words.reshape(r // blocks, blocks, c, 32, 4).permute(0, 2, 1, 3, 4).contiguous()


def mma_scales_grouped(scales: torch.Tensor, blocks: int) -> torch.Tensor:
    r, g = scales.shape[:2]
    return scales.reshape(r // blocks, blocks, g, 8, 2).permute(0, 2, 1, 3, 4).contiguous()


def mma_scales(scales: torch.Tensor) -> torch.Tensor:
    n, groups = scales.shape
    return scales.float().reshape(n // 16, 2, 8, groups).permute(0, 3, 2, 1).contiguous()  # R, G, g, h


def int4_mma_matmul(x: torch.Tensor, words: torch.Tensor, scales: torch.Tensor, n: int, *, warps: int = 2,
                    split: int = 1, stages: int = 3, blocks: int = 2, part: torch.Tensor | None = None,
                    counters: torch.Tensor | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
    m, k = x.shape
    rows = 16 * blocks * warps
    assert 1 <= m <= 8 and k % 128 == 0 and n % rows == 0 and (k // 128) % split == 0
    x64 = x.view(torch.int64)
    out = x.new_empty((m, n)) if out is None else out
    if split > 1:
        part = torch.empty((split, m, n), dtype=torch.float32, device=x.device) if part is None else part
        counters = torch.zeros(n // rows, dtype=torch.int32, device=x.device) if counters is None else counters
    else:
        part = counters = out
    _int4_mma_kernel[(n // rows, split)](
        x64, words.view(torch.int64), scales, out, part, counters, m, n, k, (k // 128) // split, x64.stride(0),
        out.stride(0), WARPS=warps, BLOCKS=blocks, STAGES=stages, SPLIT=split > 1, num_warps=warps)
    return out


# ----------------------------------------------------------------------------------------------- the GPU call

LAYER = ((6144, 4096), (4096, 4096), (24576, 4096), (4096, 12288))
HEAD = (151936, 4096)
SHAPES = {"qkv": LAYER[0], "o": LAYER[1], "gate_up": LAYER[2], "down": LAYER[3], "lm_head": HEAD}


def graphed(fn, count=1):
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(count):
            fn()
    return graph


def median_ms(graph, replays=20):
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(replays):
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def _fresh(dev, n, k):
    packed = torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, device=dev)
    scales = torch.rand(n, k // 128, device=dev) * 0.01 + 0.001
    return packed, scales


def check() -> dict:
    """Every shape at 1, 2, 4 and 8 rows against the float reference (m13's definition, on its packed rows)."""
    from milestones.m13_quantization.matmul_kernels import quantized_matmul_reference

    dev = torch.device("cuda")
    errors = {}
    for name, (n, k) in SHAPES.items():
        packed, scales = _fresh(dev, n, k)
        words, ms = mma_words(nibbles_from_packed(packed)), mma_scales(scales)
        for m in (1, 2, 4, 8):
            x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
            ref = quantized_matmul_reference(x.float(), packed, scales, "int4")
            for warps, split, blocks in ((2, 1, 2), (1, 4, 2), (4, 2, 4), (1, 1, 4), (2, 16, 4)):
                if n % (16 * blocks * warps) or (k // 128) % split:
                    continue
                got = int4_mma_matmul(x, words, ms, n, warps=warps, split=split, blocks=blocks).float()
                errors[f"{name} M={m} warps={warps} split={split} blocks={blocks}"] = ((got - ref).norm()
                                                                                       / ref.norm()).item()
            for warps, blocks in ((1, 1), (4, 1), (8, 2), (16, 2), (2, 4)):  # call 52: K split across warps
                if n % (16 * blocks) or (k // 128) % warps:
                    continue
                got = int4_mma_warps_matmul(x, words, ms, n, warps=warps, blocks=blocks).float()
                errors[f"{name} M={m} warps-kernel warps={warps} blocks={blocks}"] = ((got - ref).norm()
                                                                                      / ref.norm()).item()
                if blocks > 1:
                    got = int4_mma_warps_matmul(x, mma_words_grouped(words, blocks), mma_scales_grouped(ms, blocks),
                                                n, warps=warps, blocks=blocks, grouped=True).float()
                    errors[f"{name} M={m} grouped warps={warps} blocks={blocks}"] = ((got - ref).norm()
                                                                                     / ref.norm()).item()
    worst = max(errors.values())
    print(f"check: {len(errors)} launches, worst relative error {worst:.2e}", flush=True)
    return {"errors": errors, "worst": worst, "ok": worst < 2e-2}


def sweep(name: str) -> dict:
    """One shape: every launch, 20 launches (distinct weights) a graph, interleaved with m13's GEMV."""
    from milestones.m13_quantization.matmul_kernels import quantized_matmul
    from milestones.m13_quantization.quantize import tile_int4

    dev = torch.device("cuda")
    n, k = SHAPES[name]
    reps = max(2, min(20, int(2e9 // (n * k // 2))))
    weights = [_fresh(dev, n, k) for _ in range(reps)]
    m13_w = [(tile_int4(p), s) for p, s in weights]
    mma_w = [(mma_words(nibbles_from_packed(p)), mma_scales(s)) for p, s in weights]
    del weights
    grouped_w = {b: [(mma_words_grouped(w, b), mma_scales_grouped(s, b)) for w, s in mma_w] for b in (2, 4)}
    x = torch.randn(1, k, device=dev, dtype=torch.bfloat16)
    keep = []  # every buffer a captured graph writes, alive as long as the graphs

    def warps_graph(xm, warps, stages, blocks, grouped=False):
        m = xm.shape[0]
        ws = grouped_w[blocks] if grouped else mma_w
        outs = [torch.empty((m, n), dtype=torch.bfloat16, device=dev) for _ in ws]
        keep.append(outs)
        graph = graphed(lambda: [int4_mma_warps_matmul(xm, w, s, n, warps=warps, stages=stages, blocks=blocks,
                                                       out=o, grouped=grouped) for (w, s), o in zip(ws, outs)])
        graph.replay()
        torch.cuda.synchronize()
        return graph

    # the floor of a kernel per matmul at this shape: a kernel that only streams the same int4 words (call 27's)
    stream_words = [w.reshape(-1) for w, _ in mma_w]
    sink = torch.zeros(4 * 132, device=dev)
    x_words = torch.randn(1024, device=dev)

    def stream():
        for words in stream_words:
            iters = triton.cdiv(words.numel(), sink.numel() * 1024)
            _stream_kernel[(triton.cdiv(words.numel(), iters * 1024),)](words, x_words, sink, words.numel(), iters,
                                                                       STAGES=3, BLOCK=1024, num_warps=4)

    graphs = {"m13": graphed(lambda: [quantized_matmul(x, w, s, "int4") for w, s in m13_w]), "stream": graphed(stream)}
    configs = {}
    errors = {}
    for warps, blocks, stages, grouped in itertools.product((2, 4, 8), (1, 2, 4), (2, 3), (False, True)):
        if n % (16 * blocks) or (k // 128) % warps or (grouped and blocks == 1) or (stages == 2 and not grouped):
            continue
        label = f"kw{warps} b{blocks} st{stages}" + (" grouped" if grouped else "")
        print(f"  {name} {label}", flush=True)
        try:
            graphs[label] = warps_graph(x, warps, stages, blocks, grouped)
            configs[label] = (warps, stages, blocks, grouped)
        except Exception as error:  # noqa: BLE001 - a launch that cannot compile (shared memory): reported
            errors[label] = f"{type(error).__name__}: {error}"[:300]
    times = {label: [] for label in graphs}
    for _ in range(3):
        for label, graph in graphs.items():
            times[label].append(median_ms(graph, 10) / reps * 1e3)
    us = {label: statistics.median(v) for label, v in times.items()}
    best = min((v, label) for label, v in us.items() if label not in ("m13", "stream"))
    nbytes = n * k // 2 + n * (k // 128) * 4
    result = {"n": n, "k": k, "bytes": nbytes, "reps": reps, "us": us, "best": configs[best[1]], "errors": errors,
              "best_label": best[1], "best_tb_per_s": nbytes / best[0] / 1e6, "m13_tb_per_s": nbytes / us["m13"] / 1e6}
    result["stream_tb_per_s"] = nbytes / us["stream"] / 1e6
    print(f"{name}: stream {us['stream']:.1f} us, m13 {us['m13']:.1f} us ({nbytes / us['m13'] / 1e6:.2f} TB/s), "
          f"best ungrouped {min(v for lb, v in us.items() if lb.startswith('kw') and 'grouped' not in lb):.1f} us, "
          f"best mma {best[1]} "
          f"{best[0]:.1f} us ({nbytes / best[0] / 1e6:.2f} TB/s)", flush=True)
    # the best launch at 2, 4 and 8 rows of x, against m13 at those rows (its GEMV, then its tl.dot)
    warps, stages, blocks, grouped = configs[best[1]]
    result["rows_us"] = {}
    for m in (2, 4, 8):
        xm = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
        pair = {"m13": graphed(lambda: [quantized_matmul(xm, w, s, "int4") for w, s in m13_w]),
                "mma": warps_graph(xm, warps, stages, blocks, grouped)}
        result["rows_us"][m] = {label: statistics.median([median_ms(gr, 10) / reps * 1e3 for _ in range(3)])
                                for label, gr in pair.items()}
        print(f"  {name} M={m}: m13 {result['rows_us'][m]['m13']:.1f} us, mma {result['rows_us'][m]['mma']:.1f} us",
              flush=True)
    return result


def chain(launches: dict) -> dict:
    """The step's 145 matmuls chained in one graph: cuBLAS bf16, m13's GEMVs, the mma kernel (a launch per shape)."""
    from milestones.m13_quantization.matmul_kernels import quantized_matmul
    from milestones.m13_quantization.quantize import tile_int4

    dev = torch.device("cuda")
    shapes = [s for _ in range(36) for s in LAYER] + [HEAD]
    names = [n for _ in range(36) for n in ("qkv", "o", "gate_up", "down")] + ["lm_head"]
    m13_w, mma_w, bufs = [], [], []
    for (n, k), name in zip(shapes, names):
        p, s = _fresh(dev, n, k)
        m13_w.append((tile_int4(p), s))
        w, sc = mma_words(nibbles_from_packed(p)), mma_scales(s)
        warps, stages, blocks, grouped = launches[name]
        mma_w.append((mma_words_grouped(w, blocks), mma_scales_grouped(sc, blocks)) if grouped else (w, sc))
        bufs.append(torch.empty((1, n), dtype=torch.bfloat16, device=dev))
    bf16 = [torch.empty(n, k, dtype=torch.bfloat16, device=dev).normal_(0, 0.02) for n, k in shapes]
    x0 = torch.randn(1, 4096, dtype=torch.bfloat16, device=dev)

    def mma(i, h):
        warps, stages, blocks, grouped = launches[names[i]]
        return int4_mma_warps_matmul(h, mma_w[i][0], mma_w[i][1], shapes[i][0], warps=warps, stages=stages,
                                     blocks=blocks, out=bufs[i], grouped=grouped)

    def run_chain(fn):
        def run():
            h = x0
            for i, (n, k) in enumerate(shapes):
                h = fn(i, h[:, :k])
        return run

    fns = {"cublas-bf16": run_chain(lambda i, h: torch.nn.functional.linear(h, bf16[i])),
           "m13-int4": run_chain(lambda i, h: quantized_matmul(h, m13_w[i][0], m13_w[i][1], "int4")),
           "mma-int4": run_chain(mma)}
    graphs = {label: graphed(fn) for label, fn in fns.items()}
    times = {label: [] for label in graphs}
    for round_ in range(5):
        for label, graph in graphs.items():
            times[label].append(median_ms(graph, 20))
        print(f"round {round_ + 1}: " + ", ".join(f"{n} {t[-1]:.3f}" for n, t in times.items()), flush=True)
    summary = {label: {"median_ms": statistics.median(v), "min_ms": min(v), "max_ms": max(v)}
               for label, v in times.items()}
    for label, s in summary.items():
        print(f"chain {label}: {s['median_ms']:.3f} ms ({s['min_ms']:.3f}-{s['max_ms']:.3f})", flush=True)
    return {"launches": launches, "ms": times, "summary": summary}


def _in_child(args: list[str], timeout: float) -> dict | str:
    """Run one part in a fresh process (a fault in one launch must not take the others' results with it)."""
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        path = f.name
    proc = subprocess.run([sys.executable, __file__, *args, path], timeout=timeout)
    if proc.returncode:
        return f"exit {proc.returncode}"
    with open(path) as f:
        return json.load(f)


def main(path: str) -> None:
    from benchmarks.env import environment

    began = time.perf_counter()
    result = {"name": "int4_mma_grouped", "env": environment("cuda"), "check": check(), "shapes": {}}
    default = (4, 3, 1, False)
    launches = {}
    for name in SHAPES:
        result["shapes"][name] = _in_child(["--sweep", name], 120)
        ok = isinstance(result["shapes"][name], dict)
        launches[name] = tuple(result["shapes"][name]["best"]) if ok else default
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(launches, f)
    result["chain"] = _in_child(["--chain", f.name], 150)
    result["total_s"] = time.perf_counter() - began
    with open(path, "w") as f:
        json.dump(result, f, indent=1, default=str)
    print(f"-> {path}")


if __name__ == "__main__":
    if sys.argv[1] == "--sweep":
        out = sweep(sys.argv[2])
    elif sys.argv[1] == "--chain":
        with open(sys.argv[2]) as f:
            out = chain({name: tuple(v) for name, v in json.load(f).items()})
    else:
        main(sys.argv[1])
        sys.exit(0)
    with open(sys.argv[3], "w") as f:
        json.dump(out, f, indent=1, default=str)
