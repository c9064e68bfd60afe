"""Quantized matmuls in Triton: ``out = x @ dequantize(W)^T`` with the weight widened in registers, never in memory.

``x`` is ``[M, K]`` (bfloat16, float16 or float32 activations), ``W`` is ``[N, K]`` stored as int8 with one scale
per row, or as int4 nibbles with a scale per row and 128-input group, stored in either order (``quantize.py``). Each
kernel reads every weight byte once from memory, turns it into a float in registers and multiplies it there:
the bytes read per step shrink 2x (int8) or ~3.8x (int4) against bf16, the arithmetic does not.

**gemv** (decode at batch 1-2, int4 1-4, ``_quantized_gemv_kernel``): one program per ``BLOCK_N`` output
rows (and per slice of K if N alone gives too few programs: split-K, the slices' sums added by whichever
program finishes last, in slice order). Each
loop step loads a ``[BLOCK_N, BLOCK_K]`` tile of weight bytes (int4: one ``[BLOCK_N, 64]`` tile per 128-input group;
contiguous along K, so 16-byte loads), unpacks it, and multiply-adds it with each of the ``M`` rows of ``x`` on the
CUDA cores, every tensor kept in the tile's own two-dimensional layout (no shared-memory shuffles), the next tiles'
loads in flight meanwhile (``tl.range``'s pipelining)::

    int8:  w = float(q)                                   acc[m, n] += sum_k x[m, k] * w[n, k]
    int4:  lo = float(b & 15) - 8, hi = float(b >> 4) - 8  (b: the bytes of one 128-input group, [BLOCK_N, 64])
           acc[m, n] += scale[n, g] * (sum_j x[m, 128g + j] * lo[n, j] + x[m, 128g + 64 + j] * hi[n, j])

How the bytes become floats inside these kernels, int4 read from packed rows or from tiles, and the three ways to
unpack a nibble (``convert``, ``magic``, and ``subnormal``: no conversion at all) are ``weight_unpacking.py``'s
lesson; the table's int4 GEMV makes no floats (``unpack="dp4a"``: x as 16-bit integers, four products an
instruction, ``integer_dots.py``; a float32 x keeps ``subnormal``).

**dot** (batch 3-16 in ``LAUNCH_TABLE``, ``_quantized_dot_kernel``): the classic tiled matmul
(``BLOCK_M`` rows of x by ``BLOCK_N`` rows of W, grouped so that tiles reuse W from L2), whose W tile is unpacked to
the activations' dtype and fed to ``tl.dot`` on the tensor cores. int8: the integers (exact in bf16) go into the dot
and each column's scale multiplies the float32 result at the end. int4: each group's scale is multiplied into the
unpacked tile before its dot (a bf16 rounding of 1/256, beside the format's own step of 1/14 of the range), so every
dot accumulates into one float32 tile; a separate product per group would double the registers the tile needs.

**swap_ab** (17-512 rows in ``LAUNCH_TABLE``): the tensor cores with the operands swapped,
``out^T = W x^T``, so that W's unpacked tile goes to them from registers (``swap_ab_matmul.py``).

**dequant** (beyond 512 rows in ``LAUNCH_TABLE``): W unpacked into a bf16 scratch a slice of
rows at a time, for cuBLAS (``dequant_matmul.py``).

The GEMV's finishing programs can also do the small kernel after the matmul (``gemv_epilogues.py``), through
``quantized_silu_and_mul`` and ``quantized_add_rms_norm`` (``epilogue_matmuls.py``).

Everything here decides from shapes and Python ints only (no tensor values), so the launches can be captured in
m10's CUDA graphs. On CPU tensors the kernels run in Triton's interpreter (m08's ``device_kernel``).
"""

from __future__ import annotations

from dataclasses import replace

import torch

import triton
import triton.language as tl

from milestones.m08_triton_kernel.device_kernel import device_kernel, runs_interpreted
from milestones.m08_triton_kernel.launch_config import sm_count

from .dequant_matmul import _dequant_then_cublas
from .gemv_epilogues import (ADD_RMS_NORM, DEFERRED_NORM, SILU_AND_MUL, _Epilogue, _norm_constants,
                             deferred_norm_when_last, epilogue_index, finish_row, norm_when_last, pair_rows, row_rstd)
from .launch_config import UNPACK_MODES, QuantMatmulConfig, choose_launch, choose_split_k, fits_method
from .quantize import GROUP_SIZE, QUANTIZATION_METHODS, TILE_ROWS
from .swap_ab_matmul import swap_ab_matmul
from .integer_dots import _int4_group_dp4a, int16_x, int16_x_words
from .weight_unpacking import (DP4A, MAGIC, SUBNORMAL, UNIT_DOWN, _int4_group_subnormal, _int4_products, _int4_rows,
                               _int8_to_float, _load_x, _unpack_int4)

ACTIVATION_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
MAX_SPLIT_K = 64  # slices of K a caller may ask for (the heuristic stays at launch_config.MAX_SPLIT_K)
MAX_DEFERRED_PER_THREAD = 64  # gemv: float32 partial sums a thread may carry across the loop (DEFER_SUM)
GEMV_MAX_ROWS = 4  # gemv: rows of x per launch (one accumulator each)
# gemv on dp4a: words whose int32 sums are added before one conversion to float (``_words_to_float``). On the H200
# the step took as long at one row with 1 word a conversion as with 4 (2.051 and 2.052 ms), 59 µs less with 4 at
# two rows and 183 at four (2.12x and 1.55x bf16's against 2.07x and 1.47x): results/h200/
# m13_step_times+words-per-float.json, int4_words_per_float.json
DP4A_WORDS_PER_FLOAT = 4


@triton.jit
def _fold(acc, products, DEFER_SUM: tl.constexpr):
    """Add a step's ``[BLOCK_N, width]`` products: elementwise (summed across K once, after the loop) or summed
    across the step's inputs now."""
    if DEFER_SUM:
        acc = acc + products
    else:
        acc = acc + tl.sum(products, axis=1)
    return acc


@triton.jit
def _words_to_float(part, BLOCK_N: tl.constexpr, WIDTH: tl.constexpr, SUMMED: tl.constexpr):
    """dp4a's ``[BLOCK_N, WIDTH]`` int32 sums of one group as float32, ``SUMMED`` neighbouring words added as
    integers first (exact: at most ~5e7), so one int-to-float conversion stands for ``8 * SUMMED`` weights. A
    conversion runs at an eighth of a float multiply-add's rate on compute capability 9.0 (16 a clock an SM against
    128, the CUDA guide's throughput table)."""
    if SUMMED > 1:  # a thread's own neighbouring words (its 16-byte load): no shuffle
        part = tl.sum(tl.reshape(part, [BLOCK_N, WIDTH // SUMMED, SUMMED]), axis=2)
    return part.to(tl.float32)


@triton.jit
def _row_sums(acc, scale, DEFER_SUM: tl.constexpr, SCALE: tl.constexpr):
    """A program's ``[BLOCK_N]`` sums for one row of x (its slice of K only, when K is split)."""
    if DEFER_SUM:
        acc = tl.sum(acc, axis=1)
    if SCALE:
        acc = acc * scale
    return acc


@triton.jit
def _add_slices(part_ptr, lanes, ok, stride_part, SLICES: tl.constexpr):
    """The finishing program of a split: the slices' float32 sums of one row, added in slice order. ``SLICES`` is
    known when compiled, so the loads go out together (a loop over a count read at run time waits for each)."""
    total = tl.load(part_ptr + lanes, mask=ok, other=0.0, cache_modifier=".cg")
    for s in tl.static_range(1, SLICES):
        total += tl.load(part_ptr + s * stride_part + lanes, mask=ok, other=0.0, cache_modifier=".cg")
    return total


@device_kernel
@triton.jit
def _quantized_gemv_kernel(
    x_ptr, w_ptr, s_ptr, out_ptr, part_ptr, count_ptr, res_ptr, norm_w_ptr, sq_ptr, words_ptr, rsq_ptr,
    N, K, k_per_split, eps,
    stride_xm, stride_wn, stride_sn, stride_sg, stride_om, stride_rm, stride_wm, stride_rsq,
    INT4: tl.constexpr, ROWS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP: tl.constexpr, UNPACK: tl.constexpr, SPLIT: tl.constexpr, EVEN: tl.constexpr, DEFER_SUM: tl.constexpr,
    NUM_STAGES: tl.constexpr, TILED: tl.constexpr, EPILOGUE: tl.constexpr, NORM_N: tl.constexpr,
    NORM_WHOLE: tl.constexpr, BLOCKS_N: tl.constexpr, X_WORDS: tl.constexpr, PTX: tl.constexpr,
    FINISH: tl.constexpr = True, ROW_NORM_PARTS: tl.constexpr = 0, ROW_NORM_POW2: tl.constexpr = 1,
    SUMMED: tl.constexpr = 1, FINISH_SLICES: tl.constexpr = 0,
):
    """One program: output rows [pid_n * BLOCK_N, +BLOCK_N) for the ``ROWS`` (1-4) rows of x, over its slice of K.

    Every tensor in the loop is two-dimensional in the layout of the weight tile it loads (``[BLOCK_N, width]``,
    contiguous along K): x's rows are 1-D vectors broadcast along N, and each row of x has its own accumulator
    (``acc0`` .. ``acc3``, those past ``ROWS`` never built). A 3-D ``[rows, N, K]`` product would need the tile in
    another layout, a round trip through shared memory every step. The loop is a ``tl.range`` with
    ``NUM_STAGES``: Triton pipelines loads that feed no ``tl.dot`` only when asked, so the next tiles' bytes are
    in flight while one is unpacked. ``EVEN``: N and every K slice are whole tiles, so the loads need no mask.
    ``DEFER_SUM``: products accumulate elementwise and are summed across K once at the end, instead of a
    cross-thread reduction in every step. ``SUMMED`` (``dp4a``): the int32 sums of that many neighbouring words are
    added before one conversion to float (``_words_to_float``).

    ``SPLIT`` (K in slices, ``program_id(1)``): each program writes its float32 sums to its slice of ``part_ptr``
    (``[slices, ROWS, N]``) and counts itself done on its row block's counter (``count_ptr``, zero between
    launches); the program that counts last adds the slices in slice order, stores the output and sets the
    counter back to zero. No zeroed output, no cast afterwards, and the same sum whichever program finishes.
    Without ``FINISH`` the slices' sums are left for the kernel that reads them to add (``sliced_sums.py``).
    ``ROW_NORM_PARTS``: x's words are a deferred norm's (``deferred_norm.py``), and each row's finished sums are
    multiplied by its 1 / rms, from its parts of the sum of squares at ``rsq_ptr``, before the epilogue.

    ``EPILOGUE`` (``gemv_epilogues.py``): what the finishing program does with a block's sums, the output stored
    as it is, as ``silu(gate) * up`` (then W's rows are gate/up pairs and N counts the pairs), or added into the
    residual stream ``res_ptr`` and normalised with ``norm_w_ptr`` once every block is in (``sq_ptr``: the
    blocks' sums of squares; the count after the row blocks' own in ``count_ptr``). ``X_WORDS``: SiLU * up's
    outputs, one whole group of ``int16_x`` a program, are also written as its words at ``words_ptr``. Or the
    deferred norm, by the last of each group's programs (``deferred_norm_when_last``, over ``FINISH_SLICES``
    slices: the launch's K slices, known when compiled, as for the finish that adds them)."""
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    lanes = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)  # this program's sums (the slices' index)
    if EPILOGUE == SILU_AND_MUL:
        cols, col_ok = pair_rows(lanes, N, BLOCK_N)  # W's rows behind each lane
    else:
        cols = lanes
        col_ok = cols < N
    k_start = pid_k * k_per_split
    k_end = tl.minimum(k_start + k_per_split, K)
    WORDS: tl.constexpr = INT4 and UNPACK >= SUBNORMAL  # int4 read as int32 words of 8 nibbles (w_ptr: int32)
    # what one load reads of a weight row: int4 words of a group, int4 bytes of a group, or int8 bytes of a step
    WIDTH: tl.constexpr = GROUP // 8 if WORDS else GROUP // 2 if INT4 else BLOCK_K
    j = tl.arange(0, WIDTH)
    if INT4:
        w_rows, group_stride = _int4_rows(w_ptr, cols, stride_wn, K, TILED, WIDTH, GROUP)
    else:
        w_rows = w_ptr + cols[:, None] * stride_wn
    if DEFER_SUM:  # dp4a's products come SUMMED words to a float (_words_to_float)
        acc0 = tl.zeros([BLOCK_N, WIDTH // SUMMED if WORDS and UNPACK == DP4A else WIDTH], tl.float32)
    else:
        acc0 = tl.zeros([BLOCK_N], tl.float32)
    acc1 = acc0
    acc2 = acc0
    acc3 = acc0
    for k0 in tl.range(k_start, k_end, BLOCK_K, num_stages=NUM_STAGES):
        k0 = tl.multiple_of(k0, BLOCK_K)  # k_per_split is whole steps: 16-byte loads need the compiler to know
        if INT4:
            HALF: tl.constexpr = GROUP // 2
            for t in tl.static_range(BLOCK_K // GROUP):  # one 128-input group (64 bytes per row) at a time
                kg = k0 + t * GROUP
                kb = tl.multiple_of((kg // GROUP) * group_stride, WIDTH)  # the group's first byte (or word)
                if EVEN:
                    b = tl.load(w_rows + (kb + j)[None, :])  # [BLOCK_N, WIDTH]: bytes (uint8) or words (int32)
                    scale = tl.load(s_ptr + cols * stride_sn + (kg // GROUP) * stride_sg)  # [BLOCK_N]
                    x_ok = None
                else:
                    x_ok = kg + j < k_end  # K and k_end are whole groups: all true or all false
                    b = tl.load(w_rows + (kb + j)[None, :], mask=col_ok[:, None] & x_ok[None, :], other=0)
                    # a group past k_end has x = 0: any finite scale will do, read from a valid address
                    scale = tl.load(s_ptr + cols * stride_sn + (tl.minimum(kg, K - GROUP) // GROUP) * stride_sg,
                                    mask=col_ok, other=0.0)
                if WORDS and UNPACK == DP4A:  # x_ptr: int16_x's words (integer_dots.py)
                    group_end = None if EVEN else k_end
                    part, s_x = _int4_group_dp4a(b, x_ptr, K, kg, group_end, WIDTH, PTX)
                    acc0 = _fold(acc0, _words_to_float(part, BLOCK_N, WIDTH, SUMMED) * (scale * s_x)[:, None],
                                 DEFER_SUM)
                    if ROWS > 1:
                        part, s_x = _int4_group_dp4a(b, x_ptr + stride_xm, K, kg, group_end, WIDTH, PTX)
                        acc1 = _fold(acc1, _words_to_float(part, BLOCK_N, WIDTH, SUMMED) * (scale * s_x)[:, None],
                                     DEFER_SUM)
                    if ROWS > 2:
                        part, s_x = _int4_group_dp4a(b, x_ptr + 2 * stride_xm, K, kg, group_end, WIDTH, PTX)
                        acc2 = _fold(acc2, _words_to_float(part, BLOCK_N, WIDTH, SUMMED) * (scale * s_x)[:, None],
                                     DEFER_SUM)
                    if ROWS > 3:
                        part, s_x = _int4_group_dp4a(b, x_ptr + 3 * stride_xm, K, kg, group_end, WIDTH, PTX)
                        acc3 = _fold(acc3, _words_to_float(part, BLOCK_N, WIDTH, SUMMED) * (scale * s_x)[:, None],
                                     DEFER_SUM)
                elif WORDS:
                    x_group = x_ptr + kg
                    if not EVEN:  # the whole group is in this slice of K, or none of it
                        x_ok = kg + tl.arange(0, HALF) < k_end
                    acc0 = _fold(acc0, _int4_group_subnormal(b, x_group, x_ok, HALF, WIDTH) * scale[:, None],
                                 DEFER_SUM)
                    if ROWS > 1:
                        acc1 = _fold(acc1, _int4_group_subnormal(b, x_group + stride_xm, x_ok, HALF, WIDTH)
                                     * scale[:, None], DEFER_SUM)
                    if ROWS > 2:
                        acc2 = _fold(acc2, _int4_group_subnormal(b, x_group + 2 * stride_xm, x_ok, HALF, WIDTH)
                                     * scale[:, None], DEFER_SUM)
                    if ROWS > 3:
                        acc3 = _fold(acc3, _int4_group_subnormal(b, x_group + 3 * stride_xm, x_ok, HALF, WIDTH)
                                     * scale[:, None], DEFER_SUM)
                else:
                    b = b.to(tl.int32)  # bytes 0..255
                    lo, hi = _unpack_int4(b, UNPACK)  # [BLOCK_N, 64]: inputs kg + j and kg + 64 + j
                    x_lo = x_ptr + kg + j
                    acc0 = _fold(acc0, _int4_products(lo, hi, x_lo, x_ok, HALF, scale), DEFER_SUM)
                    if ROWS > 1:
                        acc1 = _fold(acc1, _int4_products(lo, hi, x_lo + stride_xm, x_ok, HALF, scale),
                                     DEFER_SUM)
                    if ROWS > 2:
                        acc2 = _fold(acc2, _int4_products(lo, hi, x_lo + 2 * stride_xm, x_ok, HALF, scale),
                                     DEFER_SUM)
                    if ROWS > 3:
                        acc3 = _fold(acc3, _int4_products(lo, hi, x_lo + 3 * stride_xm, x_ok, HALF, scale),
                                     DEFER_SUM)
        else:
            ks = k0 + j
            if EVEN:
                q = tl.load(w_rows + ks[None, :])  # int8 [BLOCK_N, BLOCK_K]
                x_ok = None
            else:
                x_ok = ks < k_end
                q = tl.load(w_rows + ks[None, :], mask=col_ok[:, None] & x_ok[None, :], other=0)
            w = _int8_to_float(q, UNPACK)
            x_row = x_ptr + ks
            acc0 = _fold(acc0, w * _load_x(x_row, x_ok).to(tl.float32)[None, :], DEFER_SUM)
            if ROWS > 1:
                x = _load_x(x_row + stride_xm, x_ok).to(tl.float32)
                acc1 = _fold(acc1, w * x[None, :], DEFER_SUM)
            if ROWS > 2:
                x = _load_x(x_row + 2 * stride_xm, x_ok).to(tl.float32)
                acc2 = _fold(acc2, w * x[None, :], DEFER_SUM)
            if ROWS > 3:
                x = _load_x(x_row + 3 * stride_xm, x_ok).to(tl.float32)
                acc3 = _fold(acc3, w * x[None, :], DEFER_SUM)
    if INT4:  # the groups' scales are in the sums already; SUBNORMAL's products are in units of 2^-85
        row_scale = UNIT_DOWN if UNPACK == SUBNORMAL else 1.0
    else:  # int8: one scale per row of W
        row_scale = tl.load(s_ptr + cols, mask=col_ok, other=0.0)
    SCALE: tl.constexpr = not INT4 or UNPACK == SUBNORMAL
    acc0 = _row_sums(acc0, row_scale, DEFER_SUM, SCALE)
    if ROWS > 1:
        acc1 = _row_sums(acc1, row_scale, DEFER_SUM, SCALE)
    if ROWS > 2:
        acc2 = _row_sums(acc2, row_scale, DEFER_SUM, SCALE)
    if ROWS > 3:
        acc3 = _row_sums(acc3, row_scale, DEFER_SUM, SCALE)
    blocks = tl.num_programs(0)
    if SPLIT:
        num_slices = tl.num_programs(1)
        part_n = blocks * BLOCK_N
        part = part_ptr + pid_k * ROWS * part_n  # this slice's [ROWS, blocks * BLOCK_N] of float32 sums
        tl.store(part + lanes, acc0, mask=col_ok)
        if ROWS > 1:
            tl.store(part + part_n + lanes, acc1, mask=col_ok)
        if ROWS > 2:
            tl.store(part + 2 * part_n + lanes, acc2, mask=col_ok)
        if ROWS > 3:
            tl.store(part + 3 * part_n + lanes, acc3, mask=col_ok)
        if EPILOGUE == DEFERRED_NORM:
            deferred_norm_when_last(part_ptr, part_n, count_ptr, res_ptr, stride_rm, norm_w_ptr, sq_ptr, words_ptr,
                                    stride_wm, N, ROWS, BLOCK_N, GROUP, FINISH_SLICES)
        elif FINISH:
            # Every thread's sums are written before the program counts itself done (the barrier), and the count is
            # an acquire-release atomic: the program that counts last sees every slice's sums.
            tl.debug_barrier()
            done_before = tl.atomic_add(count_ptr + pid_n, 1, sem="acq_rel")
            if done_before == num_slices - 1:
                for r in tl.static_range(ROWS):
                    total = _add_slices(part_ptr + r * part_n, lanes, col_ok, ROWS * part_n, FINISH_SLICES)
                    if ROW_NORM_PARTS > 0:
                        total = total * row_rstd(rsq_ptr + r * stride_rsq, ROW_NORM_PARTS, ROW_NORM_POW2, K, eps)
                    finish_row(total, r, lanes, col_ok, N, out_ptr, stride_om, res_ptr, stride_rm, sq_ptr, words_ptr,
                               stride_wm, EPILOGUE, BLOCK_N, X_WORDS)
                tl.atomic_xchg(count_ptr + pid_n, 0, sem="relaxed")  # ready for the next launch (or graph replay)
                if EPILOGUE == ADD_RMS_NORM:
                    norm_when_last(out_ptr, stride_om, res_ptr, stride_rm, norm_w_ptr, sq_ptr, count_ptr + blocks, N,
                                   eps, ROWS, NORM_N, NORM_WHOLE, BLOCKS_N)
    else:
        if ROW_NORM_PARTS > 0:  # each row's deferred 1 / rms
            acc0 = acc0 * row_rstd(rsq_ptr, ROW_NORM_PARTS, ROW_NORM_POW2, K, eps)
            if ROWS > 1:
                acc1 = acc1 * row_rstd(rsq_ptr + stride_rsq, ROW_NORM_PARTS, ROW_NORM_POW2, K, eps)
            if ROWS > 2:
                acc2 = acc2 * row_rstd(rsq_ptr + 2 * stride_rsq, ROW_NORM_PARTS, ROW_NORM_POW2, K, eps)
            if ROWS > 3:
                acc3 = acc3 * row_rstd(rsq_ptr + 3 * stride_rsq, ROW_NORM_PARTS, ROW_NORM_POW2, K, eps)
        finish_row(acc0, 0, lanes, col_ok, N, out_ptr, stride_om, res_ptr, stride_rm, sq_ptr, words_ptr,
                   stride_wm, EPILOGUE, BLOCK_N, X_WORDS)
        if ROWS > 1:
            finish_row(acc1, 1, lanes, col_ok, N, out_ptr, stride_om, res_ptr, stride_rm, sq_ptr, words_ptr,
                       stride_wm, EPILOGUE, BLOCK_N, X_WORDS)
        if ROWS > 2:
            finish_row(acc2, 2, lanes, col_ok, N, out_ptr, stride_om, res_ptr, stride_rm, sq_ptr, words_ptr,
                       stride_wm, EPILOGUE, BLOCK_N, X_WORDS)
        if ROWS > 3:
            finish_row(acc3, 3, lanes, col_ok, N, out_ptr, stride_om, res_ptr, stride_rm, sq_ptr, words_ptr,
                       stride_wm, EPILOGUE, BLOCK_N, X_WORDS)
        if EPILOGUE == ADD_RMS_NORM:
            norm_when_last(out_ptr, stride_om, res_ptr, stride_rm, norm_w_ptr, sq_ptr, count_ptr + blocks, N, eps,
                           ROWS, NORM_N, NORM_WHOLE, BLOCKS_N)


@device_kernel
@triton.jit
def _quantized_dot_kernel(
    x_ptr, w_ptr, s_ptr, out_ptr,
    M, N, K,
    stride_xm, stride_wn, stride_sn, stride_sg, stride_om,
    INT4: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP: tl.constexpr, GROUP_M: tl.constexpr, DOT_FP32: tl.constexpr, IEEE: tl.constexpr, EVEN_K: tl.constexpr,
    TILED: tl.constexpr,
):
    """One program: the ``[BLOCK_M, BLOCK_N]`` tile of the output; W's tile unpacked and fed to ``tl.dot``.
    ``EVEN_K``: K is whole tiles, so int8's loads need no mask along K."""
    pid = tl.program_id(0)
    num_m = tl.cdiv(M, BLOCK_M)
    num_n = tl.cdiv(N, BLOCK_N)
    # Tiles in groups of GROUP_M row blocks, column after column: the GROUP_M programs that run together read
    # the same W tile, so W comes from memory about once per group instead of once per row block.
    per_group = GROUP_M * num_n
    first_m = (pid // per_group) * GROUP_M
    size_m = tl.minimum(num_m - first_m, GROUP_M)
    pid_m = first_m + (pid % per_group) % size_m
    pid_n = (pid % per_group) // size_m
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < M
    col_ok = cols < N
    compute_dtype = tl.float32 if DOT_FP32 else x_ptr.dtype.element_ty
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    if INT4:
        HALF: tl.constexpr = GROUP // 2
        j = tl.arange(0, HALF)
        w_rows, group_stride = _int4_rows(w_ptr, cols, stride_wn, K, TILED, HALF, GROUP)
        for k0 in range(0, K, BLOCK_K):
            for t in tl.static_range(BLOCK_K // GROUP):  # K is a multiple of GROUP, BLOCK_K of GROUP
                kg = k0 + t * GROUP
                kb = tl.multiple_of((kg // GROUP) * group_stride, HALF)  # the group's first byte
                group_ok = (kg + j) < K  # [HALF]: all true or all false (whole groups)
                b = tl.load(w_rows + (kb + j)[None, :],
                            mask=col_ok[:, None] & group_ok[None, :], other=0).to(tl.int32)  # [BLOCK_N, HALF]
                # a group past K (the last step of a K that BLOCK_K does not divide) has x = 0: any finite scale
                # will do, read from a valid address
                scale = tl.load(s_ptr + cols * stride_sn + tl.minimum(kg // GROUP, K // GROUP - 1) * stride_sg,
                                mask=col_ok,
                                other=0.0)[:, None]
                # the group's scale goes into the unpacked tile (one rounding to the dot's dtype), so the dots
                # accumulate straight into acc: no second [BLOCK_M, BLOCK_N] accumulator to hold in registers
                lo, hi = _unpack_int4(b, MAGIC)  # no int-to-float conversions (quarter rate): see the gemv
                lo = (lo * scale).to(compute_dtype)
                hi = (hi * scale).to(compute_dtype)
                x_mask = row_ok[:, None] & group_ok[None, :]
                x_lo = tl.load(x_ptr + rows[:, None] * stride_xm + (kg + j)[None, :], mask=x_mask,
                               other=0.0).to(compute_dtype)
                x_hi = tl.load(x_ptr + rows[:, None] * stride_xm + (kg + HALF + j)[None, :], mask=x_mask,
                               other=0.0).to(compute_dtype)
                if IEEE:
                    acc = tl.dot(x_lo, tl.trans(lo), acc, input_precision="ieee")
                    acc = tl.dot(x_hi, tl.trans(hi), acc, input_precision="ieee")
                else:
                    acc = tl.dot(x_lo, tl.trans(lo), acc)
                    acc = tl.dot(x_hi, tl.trans(hi), acc)
    else:
        ks = tl.arange(0, BLOCK_K)
        for k0 in range(0, K, BLOCK_K):
            w_ptrs = w_ptr + cols[:, None] * stride_wn + (k0 + ks)[None, :]
            x_ptrs = x_ptr + rows[:, None] * stride_xm + (k0 + ks)[None, :]
            if EVEN_K:
                q = tl.load(w_ptrs, mask=col_ok[:, None], other=0)
                x = tl.load(x_ptrs, mask=row_ok[:, None], other=0.0).to(compute_dtype)
            else:
                k_ok = k0 + ks < K
                q = tl.load(w_ptrs, mask=col_ok[:, None] & k_ok[None, :], other=0)
                x = tl.load(x_ptrs, mask=row_ok[:, None] & k_ok[None, :], other=0.0).to(compute_dtype)
            w = _int8_to_float(q, MAGIC).to(compute_dtype)  # -127..127: exact in bf16
            if IEEE:
                acc = tl.dot(x, tl.trans(w), acc, input_precision="ieee")
            else:
                acc = tl.dot(x, tl.trans(w), acc)
        acc = acc * tl.load(s_ptr + cols, mask=col_ok, other=0.0)[None, :]
    out = out_ptr + rows[:, None] * stride_om + cols[None, :]
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & col_ok[None, :])


# --------------------------------------------------------------------------- the host side


def _check(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, method: str) -> tuple[int, int, int]:
    """Shapes, dtypes and devices (never values); returns (M, N, K). int4's qweight may be packed rows
    ``[N, K // 2]`` or tiles ``[N // 16, K // 128, 16, 64]`` (``quantize.tile_int4``)."""
    if method not in QUANTIZATION_METHODS:
        raise ValueError(f"unknown quantization method {method!r}: use {' or '.join(QUANTIZATION_METHODS)}")
    tiled = method == "int4" and qweight.dim() == 4
    if x.dim() != 2 or (qweight.dim() != 2 and not tiled):
        raise ValueError(f"x must be [M, K] and qweight [N, K] (int8), [N, K // 2] or [N // {TILE_ROWS}, K // "
                         f"{GROUP_SIZE}, {TILE_ROWS}, {GROUP_SIZE // 2}] (int4); got x {tuple(x.shape)}, qweight "
                         f"{tuple(qweight.shape)}")
    m, k = x.shape
    n = qweight.shape[0] * (TILE_ROWS if tiled else 1)
    if x.dtype not in ACTIVATION_DTYPES:
        raise ValueError(f"x must be float32, float16 or bfloat16, got {x.dtype}")
    if method == "int8":
        expected = ((n, k), torch.int8, (n,))
    else:
        if k % GROUP_SIZE:
            raise ValueError(f"int4 needs K (the inputs, {k}) to be a multiple of its group size {GROUP_SIZE}")
        shape = (n // TILE_ROWS, k // GROUP_SIZE, TILE_ROWS, GROUP_SIZE // 2) if tiled else (n, k // 2)
        expected = (shape, torch.uint8, (n, k // GROUP_SIZE))
    shape, dtype, scale_shape = expected
    if tuple(qweight.shape) != shape or qweight.dtype != dtype:
        raise ValueError(f"{method} qweight for x {tuple(x.shape)} must be {dtype} {shape}, got {qweight.dtype} "
                         f"{tuple(qweight.shape)}")
    if tuple(scales.shape) != scale_shape or scales.dtype != torch.float32:
        raise ValueError(f"{method} scales must be float32 {scale_shape}, got {scales.dtype} {tuple(scales.shape)}")
    scales_ok = scales.stride(-1) == 1 or (scales.dim() == 2 and scales.stride(0) == 1)  # int4: either order
    contiguous = x.stride(-1) == 1 and qweight.stride(-1) == 1 and scales_ok
    if not contiguous or (tiled and not qweight.is_contiguous()):
        raise ValueError("x and qweight must be contiguous along their last dimension, scales along one of theirs "
                         "(int4 tiles: contiguous)")
    if not (x.device == qweight.device == scales.device):
        raise ValueError(f"all tensors must be on one device; got {x.device}, {qweight.device}, {scales.device}")
    return m, n, k


_CHECKED: dict[tuple, tuple[int, int, int]] = {}
_MAX_LAYOUTS = 1024


def _meta(t: torch.Tensor) -> tuple:
    return t.shape, t.stride(), t.dtype, t.device


def _plan(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, method: str,
          config: QuantMatmulConfig | None, split_k: int | None) -> tuple[int, int, int, QuantMatmulConfig, int]:
    """(M, N, K, the launch's config, its slices of K): the layout checked once per layout, the table's entry."""
    key = (_meta(x), _meta(qweight), _meta(scales), method)
    shape = _CHECKED.get(key)
    if shape is None:  # first call with this layout: check it (every later layer of a step finds it here)
        shape = _check(x, qweight, scales, method)
        if len(_CHECKED) >= _MAX_LAYOUTS:
            _CHECKED.clear()
        _CHECKED[key] = shape
    m, n, k = shape
    num_sms = sm_count(x.device)
    if config is None:
        config, heuristic_split = choose_launch(method, m, n, k, num_sms)
    else:
        if not fits_method(config, method):
            raise ValueError(f"int4 needs block_k to be a multiple of {GROUP_SIZE}, got {config.block_k}")
        heuristic_split = choose_split_k(m, n, k, num_sms, config)
    return m, n, k, config, heuristic_split if split_k is None else split_k


def quantized_matmul(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, method: str, *,
                     config: QuantMatmulConfig | None = None, split_k: int | None = None,
                     x_words: torch.Tensor | None = None) -> torch.Tensor:
    """``x [M, K] @ dequantize(qweight, scales)^T`` -> ``[M, N]`` in ``x``'s dtype.

    ``config``: by default ``launch_config.LAUNCH_TABLE``'s entry for ``M``'s regime; ``split_k`` (gemv and
    swap_ab) overrides the heuristic's number of K slices. ``x_words``: x already in ``int16_x``'s form
    (``integer_norm.py`` writes it), used where the launch multiplies on ``dp4a`` instead of converting x.
    """
    m, n, k, config, split_k = _plan(x, qweight, scales, method, config, split_k)
    if m == 0:
        return x.new_empty((0, n))
    int4 = method == "int4"
    if config.kernel == "gemv":
        return _gemv(x, qweight, scales, m, n, k, int4, config, split_k, x_words=x_words)
    if config.kernel == "dot":
        return _dot(x, qweight, scales, m, n, k, int4, config)
    if config.kernel == "swap_ab":
        return swap_ab_matmul(x, qweight, scales, m, n, k, int4, config, split_k)
    return _dequant_then_cublas(x, qweight, scales, n, k, int4, config)


def _gemv(x, qweight, scales, m, n, k, int4, config, split_k, epilogue: _Epilogue = _Epilogue(),
          x_words: torch.Tensor | None = None, leave_slices: bool = False) -> torch.Tensor:
    """The GEMV's launch; returns ``[M, N]`` (``[M, N // 2]`` after SiLU * up), or with ``leave_slices`` the
    slices' float32 sums unadded (one or more), ``[slices, M, N rounded up to whole blocks]``."""
    if not 1 <= split_k <= MAX_SPLIT_K:
        raise ValueError(f"split_k must be in [1, {MAX_SPLIT_K}], got {split_k}")
    if leave_slices and (epilogue.name != "none" or epilogue.row_squares is not None or m > GEMV_MAX_ROWS):
        raise ValueError("a GEMV leaves its slices unadded only without an epilogue and with at most "
                         f"{GEMV_MAX_ROWS} rows of x, got {m}")
    if m > GEMV_MAX_ROWS:  # the kernel holds one accumulator per row of x: a few rows per launch
        if epilogue.name != "none" or epilogue.row_squares is not None:
            raise ValueError(f"a GEMV epilogue takes at most {GEMV_MAX_ROWS} rows of x, got {m}")
        return torch.cat([_gemv(x[i:i + GEMV_MAX_ROWS], qweight, scales, min(GEMV_MAX_ROWS, m - i), n, k, int4,
                                config, split_k, x_words=None if x_words is None else x_words[i:i + GEMV_MAX_ROWS])
                          for i in range(0, m, GEMV_MAX_ROWS)])
    k_per_split = -(-k // (split_k * config.block_k)) * config.block_k
    split_k = -(-k // k_per_split)  # slices that hold at least one step of K
    silu = epilogue.name == "silu_and_mul"
    outputs = n // 2 if silu else n  # silu_and_mul: W's rows are gate/up pairs, one output each
    per_block = config.block_n // 2 if silu else config.block_n
    blocks = triton.cdiv(outputs, per_block)
    out = x.new_empty((m, outputs))
    partial_sums = counters = squares = words_out = out  # not read unless split, normalised or writing words
    deferred_norm = epilogue.name == "deferred_norm"  # its finish reads the slices back: even one slice's
    if split_k > 1 or leave_slices or deferred_norm:  # each slice's float32 sums (a GEMV leaving them, too)
        partial_sums = torch.empty((split_k, m, blocks * config.block_n), dtype=torch.float32, device=x.device)
    x_words_out = silu and epilogue.words is not None  # SiLU * up's outputs as 16-bit integers too
    if x_words_out:
        words_out = _checked_words(epilogue.words, m, outputs, x.device)
        if per_block != GROUP_SIZE or outputs % GROUP_SIZE:
            raise ValueError(f"silu_and_mul writes words only where each program makes one group of {GROUP_SIZE} "
                             f"outputs ({per_block} outputs a program, {outputs} outputs)")
    # a counter per row block where a finishing program adds the slices; after them the norm's
    if (split_k > 1 and not leave_slices) or epilogue.name in ("add_rms_norm", "deferred_norm"):
        counters = _split_counters(x.device, blocks + 1)
    residual = norm_weight = out
    if epilogue.name == "add_rms_norm":
        residual, norm_weight = epilogue.residual, epilogue.norm_weight
        squares = torch.empty((m, blocks), dtype=torch.float32, device=x.device)
    if deferred_norm:  # the caller's words and squares (epilogue_matmuls.quantized_deferred_add_norm checks them)
        residual, norm_weight, words_out, squares = (epilogue.residual, epilogue.norm_weight, epilogue.words,
                                                     epilogue.squares)
    even = outputs % per_block == 0 and k % config.block_k == 0 and k_per_split % config.block_k == 0
    if config.unpack == "dp4a" and x.dtype == torch.float32:  # 16-bit x is finer than bf16's, not float32's
        config = replace(config, unpack="subnormal")
    if epilogue.row_squares is not None and not (int4 and config.unpack == "dp4a" and x_words is not None):
        raise ValueError("a deferred norm's rows are multiplied as words, by int4's GEMV on dp4a only")
    words = int4 and config.unpack in ("subnormal", "dp4a")
    if words:  # the kernel reads int4 as int32 words of 8 nibbles (rows of K // 2 bytes: whole words)
        qweight = qweight.view(torch.int32)
    x_in = x
    if int4 and config.unpack == "dp4a":  # x as 16-bit integers (integer_dots.py), converted here or before
        x_in = int16_x(x) if x_words is None else _checked_words(x_words, m, k, x.device)
    width = GROUP_SIZE // 8 if words else GROUP_SIZE // 2 if int4 else config.block_k  # elements a row load reads
    if int4 and config.unpack == "dp4a":  # the deferred sums: a float per DP4A_WORDS_PER_FLOAT words
        width //= DP4A_WORDS_PER_FLOAT
    per_thread = m * config.block_n * width // (32 * config.num_warps)  # the deferred sums' registers
    row_squares = out if epilogue.row_squares is None else epilogue.row_squares
    norm_parts = 0 if epilogue.row_squares is None else row_squares.shape[1]
    if norm_parts and (row_squares.shape[0] != m or row_squares.dtype != torch.float32 or row_squares.stride(1) != 1):
        raise ValueError(f"row_squares must be float32 [{m}, parts], contiguous along its rows; got "
                         f"{row_squares.dtype} {tuple(row_squares.shape)}")
    _quantized_gemv_kernel[(blocks, split_k)](
        x_in, qweight, scales, out, partial_sums, counters, residual, norm_weight, squares, words_out, row_squares,
        outputs, k, k_per_split, epilogue.eps, x_in.stride(0), qweight.stride(0), scales.stride(0), scales.stride(-1),
        out.stride(0), residual.stride(0), words_out.stride(0), row_squares.stride(0),
        INT4=int4, ROWS=m, BLOCK_N=config.block_n, BLOCK_K=config.block_k, GROUP=GROUP_SIZE,
        UNPACK=UNPACK_MODES.index(config.unpack), SPLIT=split_k > 1 or leave_slices or deferred_norm, EVEN=even,
        DEFER_SUM=config.defer_sum and per_thread <= MAX_DEFERRED_PER_THREAD,
        NUM_STAGES=config.num_stages, TILED=qweight.dim() == 4, EPILOGUE=epilogue_index(epilogue.name),
        **_norm_constants(epilogue.name, outputs, blocks, m), X_WORDS=x_words_out,
        PTX=not runs_interpreted(x.device), FINISH=not leave_slices, ROW_NORM_PARTS=norm_parts,
        ROW_NORM_POW2=triton.next_power_of_2(max(norm_parts, 1)), SUMMED=DP4A_WORDS_PER_FLOAT,
        FINISH_SLICES=split_k if (split_k > 1 and not leave_slices) or deferred_norm else 0,
        num_warps=config.num_warps,
    )
    return partial_sums if leave_slices else out


def _checked_words(words: torch.Tensor, m: int, k: int, device: torch.device) -> torch.Tensor:
    if (words.dtype != torch.int32 or tuple(words.shape) != (m, int16_x_words(k)) or words.stride(-1) != 1
            or words.device != device):
        raise ValueError(f"x_words must be int16_x's form of x: int32 [{m}, {int16_x_words(k)}] on {device}, "
                         f"contiguous along its rows; got {words.dtype} {tuple(words.shape)} on {words.device}")
    return words


_COUNTERS: dict[torch.device, torch.Tensor] = {}
_OUTGROWN: list[torch.Tensor] = []  # counters a graph captured earlier may still point at: never freed
MIN_COUNTERS = 1 << 14  # row blocks one split launch may have before its device's counters are reallocated


def _split_counters(device: torch.device, row_blocks: int) -> torch.Tensor:
    """A device's GEMV counters (int32, zero between launches): one per row block for split-K (its finishing
    program sets it back), and one after them for the add + norm epilogue (its last block sets it back). Kept
    across launches and shared by them, so a captured CUDA graph needs no fill before
    each matmul; one set per device, since the step's kernels run on it one launch after another.

    They are allocated outside any CUDA graph capture (an engine's eager warm-up before each capture does it):
    allocated inside one, they would come from the graphs' shared memory pool, where another graph's
    temporaries could overwrite them, and only the first graph would hold their zero fill."""
    counters = _COUNTERS.get(device)
    if counters is None or counters.numel() < row_blocks:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise RuntimeError("quantized_matmul: split-K and the norm epilogue need their counters before a CUDA "
                               "graph is captured: run this matmul once eagerly first (as an engine's warm-up does)")
        if counters is not None:
            _OUTGROWN.append(counters)
        counters = torch.zeros(max(row_blocks, MIN_COUNTERS), dtype=torch.int32, device=device)
        _COUNTERS[device] = counters
    return counters


def _dot_fp32(x: torch.Tensor) -> bool:
    # Triton's interpreter computes bfloat16 dots wrongly (m08's kernel notes it too): upcast the tiles there.
    return x.dtype == torch.float32 or (runs_interpreted(x.device) and x.dtype == torch.bfloat16)


def _dot(x, qweight, scales, m, n, k, int4, config) -> torch.Tensor:
    out = x.new_empty((m, n))
    block_k = max(config.block_k, GROUP_SIZE) if int4 else config.block_k
    grid = (triton.cdiv(m, config.block_m) * triton.cdiv(n, config.block_n),)
    _quantized_dot_kernel[grid](
        x, qweight, scales, out, m, n, k, x.stride(0), qweight.stride(0), scales.stride(0), scales.stride(-1),
        out.stride(0),
        INT4=int4, BLOCK_M=config.block_m, BLOCK_N=config.block_n, BLOCK_K=block_k, GROUP=GROUP_SIZE,
        GROUP_M=config.group_m, DOT_FP32=_dot_fp32(x), IEEE=x.dtype == torch.float32, EVEN_K=k % block_k == 0,
        TILED=qweight.dim() == 4, num_warps=config.num_warps, num_stages=config.num_stages,
    )
    return out
