"""What the batch-1 GEMV does with its sums before it stores them: the small kernels after a matmul, folded in.

At batch 1 a decode step is ~400 kernels, and each small one (an add and a norm over 4,096 values, a SiLU over
12,288) costs 1-3 µs however little it reads: its launch, its first loads' latency, and the wait for the kernel
before it. The int4 GEMV already ends in a *finishing program* per block of outputs (the last of its K slices to
finish adds the slices' sums: ``matmul_kernels.py``), which holds those outputs in registers. So the work of the
kernel after it can be done there, with no launch of its own:

* ``silu_and_mul`` (after ``gate_up_proj``): a program takes a run of W's gate rows ``i ..`` and the run of up
  rows ``N/2 + i ..`` beside it, so each output ``silu(gate_i) * up_i`` is finished in the program that computed
  both. Nothing is reordered in memory: the program's rows are simply two runs (``pair_rows``). The gate and up
  values are rounded to the activations' dtype first, as the unfused path stores them: in bf16 or fp16 the result is the
  same to the bit (in float32 a compiler may contract a product into a fused multiply-add differently).
  Where down_proj multiplies its x as 16-bit integers (``dp4a``), the outputs are also written as ``int16_x``'s
  words. Each program takes 256 rows of W, so it makes one whole group of 128 outputs and converts it from
  registers (``launch_config.SILU_WORDS_GEMV``). Programs of 64 rows, four a group, needed the last of them to
  count itself done, read the group back and convert it: a chain at the kernel's end, 1.0 µs a launch more on the
  H200 (``docs/int4-gemv-journal.md``, "A twenty-first guess"; that path is at commit ``15913f7``).
* ``add_rms_norm`` (after ``o_proj`` and ``down_proj``): the norm needs every output, so it is finished in two
  parts. Each finishing program adds its block into the residual stream (in place, rounded as the unfused
  addition is) and writes its block's sum of squares; then it counts itself done, and the last to count (an
  acquire-release atomic, as for the slices) adds the blocks' sums of squares in a fixed order and writes the
  normalised row. Only the order of that sum differs from m12's kernel, so the result may differ in the last
  bit.
* the deferred norm (``deferred_norm.py``) after ``o_proj`` and ``down_proj``: every part of it is local to a group
  of 128 outputs, so it waits once. Each program stores its slice's sums and counts itself done on its group's
  counter; the last adds the group's slices (their loads together: their count is known when compiled) and the
  residual, and writes the group's integers and sum of squares (``deferred_norm_when_last``). On the H200 the
  batch-1 step took 65-68 µs less than with the norm's own launches (``docs/int4-gemv-journal.md``, "A twenty-fourth
  guess").

vLLM fuses the same neighbours in its own way (``fused_add_rms_norm`` and ``silu_and_mul`` are single kernels
there, and its compile passes fuse a norm into the quantization before a matmul); folding them into the GEMV's
finish is what a batch-1 step, made of launches, asks for.

The host's side of it is here too: ``_Epilogue`` (which epilogue a launch runs, with the norm's tensors),
``epilogue_index`` and ``_norm_constants`` (what the kernel is compiled with); the calls that launch it are
``epilogue_matmuls.py``'s.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from .integer_dots import store_int16_groups

SILU_AND_MUL = tl.constexpr(1)
ADD_RMS_NORM = tl.constexpr(2)
DEFERRED_NORM = tl.constexpr(3)
EPILOGUES = ("none", "silu_and_mul", "add_rms_norm", "deferred_norm")  # the kernel's numbering
NORM_MAX_N = 4096  # add_rms_norm: values the last program loads at once (more would spill its registers)


@triton.jit
def pair_rows(lanes, N, BLOCK_N: tl.constexpr):
    """``SILU_AND_MUL``: a program's ``BLOCK_N`` lanes are two runs of W's rows, its first half the gate rows ``i``
    .. ``i + BLOCK_N / 2 - 1`` and its second half the up rows ``N + i`` .. of the same outputs, for the ``N``
    outputs ``silu(gate) * up``; returns (W's rows, the outputs' mask). Lanes ``2i`` and ``2i + 1`` as a gate and
    its up row made gate_up's launch 1.5 µs slower on the H200 than contiguous rows (19.17 µs against 17.66, one
    call: results/h200/int4_gemv_vs_stream+pair-lanes.json, +adjacent-rows.json), and the batch-1 step 2.36x bf16's
    against 2.40x with these two runs (m13_step_times+silu-halves.json)."""
    HALF: tl.constexpr = BLOCK_N // 2
    local = lanes % BLOCK_N
    pair = (lanes // BLOCK_N) * HALF + local % HALF
    return pair + (local // HALF) * N, pair < N


@triton.jit
def finish_row(total, r, lanes, ok, N, out_ptr, stride_om, res_ptr, stride_rm, sq_ptr, words_ptr, stride_wm,
               EPILOGUE: tl.constexpr, BLOCK_N: tl.constexpr, X_WORDS: tl.constexpr):
    """Row ``r`` of x's finished float32 sums for this program's ``BLOCK_N`` lanes: stored as the output, or as
    ``silu(gate) * up`` (``X_WORDS``: the program's outputs are one whole group of ``int16_x``, written as its
    words too), or added into the residual stream with the block's sum of squares written for the norm
    (``norm_when_last``)."""
    dtype = out_ptr.dtype.element_ty
    if EPILOGUE == SILU_AND_MUL:
        gate, up = tl.split(tl.permute(tl.reshape(total, [2, BLOCK_N // 2]), (1, 0)))  # pair_rows' two halves
        gate = gate.to(dtype).to(tl.float32)  # rounded as the unfused path stores gate_up
        up = up.to(dtype).to(tl.float32)
        pairs = tl.program_id(0) * (BLOCK_N // 2) + tl.arange(0, BLOCK_N // 2)
        act = (gate / (1.0 + tl.exp(-gate)) * up).to(dtype)
        tl.store(out_ptr + r * stride_om + pairs, act, mask=pairs < N)
        if X_WORDS:  # the integers int16_x makes of the stored outputs, from registers: no count, no read back
            group = tl.program_id(0) + tl.arange(0, 1)
            store_int16_groups(tl.reshape(act.to(tl.float32), [1, BLOCK_N // 2]), group, group < N // (BLOCK_N // 2),
                               words_ptr + r * stride_wm, N, 1, BLOCK_N // 2)
    elif EPILOGUE == ADD_RMS_NORM:
        residual = res_ptr + r * stride_rm + lanes
        summed = total.to(dtype).to(tl.float32) + tl.load(residual, mask=ok, other=0.0).to(tl.float32)
        summed = summed.to(dtype)  # the residual stream keeps the model's dtype
        tl.store(residual, summed, mask=ok)
        s = tl.where(ok, summed.to(tl.float32), 0.0)
        tl.store(sq_ptr + r * tl.num_programs(0) + tl.program_id(0), tl.sum(s * s, axis=0))
    else:
        tl.store(out_ptr + r * stride_om + lanes, total.to(dtype), mask=ok)


@triton.jit
def norm_when_last(out_ptr, stride_om, res_ptr, stride_rm, norm_w_ptr, sq_ptr, count_ptr, N, eps,
                   ROWS: tl.constexpr, NORM_N: tl.constexpr, NORM_WHOLE: tl.constexpr, BLOCKS_N: tl.constexpr):
    """``ADD_RMS_NORM``, after a finishing program has added its block into the residual: it counts itself done
    (``count_ptr``, zero between launches), and the last of the blocks to count normalises every row of x,
    from the blocks' sums of squares added in a fixed order, then sets the count back to zero.

    The last program's work is one chain of latencies (the count, then its loads, then its stores), so its loads
    go out together: the norm weight before the count, each row's sums of squares (``BLOCKS_N``: the blocks,
    rounded up to a power of two) beside its values, ``NORM_N`` of them a load (N rounded up to a power of two,
    or a slice of it where that would take too many registers: then ``NORM_WHOLE`` is false)."""
    c = tl.arange(0, NORM_N)
    if NORM_WHOLE:  # N in one load: the weight goes out before the count
        w_whole = tl.load(norm_w_ptr + c, mask=c < N, other=0.0).to(tl.float32)
    tl.debug_barrier()  # every thread's residual and sum of squares are written before the count (release)
    blocks = tl.num_programs(0)
    done_before = tl.atomic_add(count_ptr, 1, sem="acq_rel")
    if done_before == blocks - 1:
        dtype = out_ptr.dtype.element_ty
        b = tl.arange(0, BLOCKS_N)
        for r in tl.static_range(ROWS):
            squares = tl.load(sq_ptr + r * blocks + b, mask=b < blocks, other=0.0, cache_modifier=".cg")
            if NORM_WHOLE:
                s = tl.load(res_ptr + r * stride_rm + c, mask=c < N, other=0.0, cache_modifier=".cg")
                inv_rms = 1.0 / tl.sqrt(tl.sum(squares, axis=0) / N + eps)
                tl.store(out_ptr + r * stride_om + c, (s.to(tl.float32) * inv_rms * w_whole).to(dtype), mask=c < N)
            else:
                inv_rms = 1.0 / tl.sqrt(tl.sum(squares, axis=0) / N + eps)
                for c0 in range(0, N, NORM_N):
                    cs = c0 + c
                    s = tl.load(res_ptr + r * stride_rm + cs, mask=cs < N, other=0.0, cache_modifier=".cg")
                    w = tl.load(norm_w_ptr + cs, mask=cs < N, other=0.0)
                    tl.store(out_ptr + r * stride_om + cs, (s.to(tl.float32) * inv_rms * w.to(tl.float32)).to(dtype),
                             mask=cs < N)
        tl.atomic_xchg(count_ptr, 0, sem="relaxed")  # ready for the next launch (or graph replay)


@triton.jit
def _unit_total(row_part, ok, stride_slice, SLICES: tl.constexpr):
    """One row's slices of a unit's outputs added in slice order; their loads go out together (``SLICES`` known
    when compiled: a loop over a slice count read at run time waits for each load before the next)."""
    total = tl.load(row_part, mask=ok, other=0.0, cache_modifier=".cg")
    for s in tl.static_range(1, SLICES):
        total += tl.load(row_part + s * stride_slice, mask=ok, other=0.0, cache_modifier=".cg")
    return total


@triton.jit
def _store_unit(total, res, r, cols, ok, groups, res_ptr, stride_rm, w, sq_ptr, words_ptr, stride_wm, N,
                GROUPS: tl.constexpr, GROUP: tl.constexpr):
    """Row ``r`` of a unit: its added slices rounded as the GEMV stores its output, plus the residual (stored back),
    each group's sum of squares and the integers of ``h * w``."""
    dtype = res_ptr.dtype.element_ty
    summed = (total.to(dtype).to(tl.float32) + res.to(tl.float32)).to(dtype)
    tl.store(res_ptr + r * stride_rm + cols, summed, mask=ok)
    h = tl.reshape(summed.to(tl.float32), [GROUPS, GROUP])
    tl.store(sq_ptr + r * (N // GROUP) + groups, tl.sum(h * h, axis=1), mask=groups < N // GROUP)
    store_int16_groups(h * tl.reshape(w, [GROUPS, GROUP]), groups, groups < N // GROUP, words_ptr + r * stride_wm,
                       N, GROUPS, GROUP)


@triton.jit
def deferred_norm_when_last(part_ptr, part_n, count_ptr, res_ptr, stride_rm, norm_w_ptr, sq_ptr, words_ptr,
                            stride_wm, N, ROWS: tl.constexpr, BLOCK_N: tl.constexpr, GROUP: tl.constexpr,
                            SLICES: tl.constexpr):
    """``DEFERRED_NORM``, after a program has stored its slice's sums: the deferred norm (``deferred_norm.py``)
    done by the last program of each *unit* of whole groups (``max(BLOCK_N, GROUP)`` outputs) to count itself
    done. Every part of that norm is local to its group: the unit's ``SLICES`` slices added in slice order and
    rounded as the GEMV stores its output, plus the residual (stored back), each group's sum of squares (one part
    a group, ``sq_ptr``: ``[ROWS, N // GROUP]``) and the integers of ``h * w``. Each unit has a counter of its
    own, zero between launches, so no program waits for another unit: the last program's chain is the count,
    one round of loads (every row's slices at once) and the stores. The norm weight and the residual are loaded
    before the count; nothing else of this launch writes them before the last program does."""
    UNIT: tl.constexpr = BLOCK_N if BLOCK_N > GROUP else GROUP
    GROUPS: tl.constexpr = UNIT // GROUP
    unit = tl.program_id(0) // (UNIT // BLOCK_N)
    cols = unit * UNIT + tl.arange(0, UNIT)
    ok = cols < N
    w = tl.load(norm_w_ptr + cols, mask=ok, other=0.0).to(tl.float32)
    r0 = tl.load(res_ptr + cols, mask=ok, other=0.0)
    if ROWS > 1:
        r1 = tl.load(res_ptr + stride_rm + cols, mask=ok, other=0.0)
    if ROWS > 2:
        r2 = tl.load(res_ptr + 2 * stride_rm + cols, mask=ok, other=0.0)
    if ROWS > 3:
        r3 = tl.load(res_ptr + 3 * stride_rm + cols, mask=ok, other=0.0)
    tl.debug_barrier()  # every thread's slice sums are written before the program counts itself done (release)
    done_before = tl.atomic_add(count_ptr + unit, 1, sem="acq_rel")
    if done_before == SLICES * (UNIT // BLOCK_N) - 1:
        groups = unit * GROUPS + tl.arange(0, GROUPS)
        stride_slice = ROWS * part_n
        t0 = _unit_total(part_ptr + cols, ok, stride_slice, SLICES)  # every row's loads before any store
        if ROWS > 1:
            t1 = _unit_total(part_ptr + part_n + cols, ok, stride_slice, SLICES)
        if ROWS > 2:
            t2 = _unit_total(part_ptr + 2 * part_n + cols, ok, stride_slice, SLICES)
        if ROWS > 3:
            t3 = _unit_total(part_ptr + 3 * part_n + cols, ok, stride_slice, SLICES)
        _store_unit(t0, r0, 0, cols, ok, groups, res_ptr, stride_rm, w, sq_ptr, words_ptr, stride_wm, N, GROUPS, GROUP)
        if ROWS > 1:
            _store_unit(t1, r1, 1, cols, ok, groups, res_ptr, stride_rm, w, sq_ptr, words_ptr, stride_wm, N, GROUPS,
                        GROUP)
        if ROWS > 2:
            _store_unit(t2, r2, 2, cols, ok, groups, res_ptr, stride_rm, w, sq_ptr, words_ptr, stride_wm, N, GROUPS,
                        GROUP)
        if ROWS > 3:
            _store_unit(t3, r3, 3, cols, ok, groups, res_ptr, stride_rm, w, sq_ptr, words_ptr, stride_wm, N, GROUPS,
                        GROUP)
        tl.atomic_xchg(count_ptr + unit, 0, sem="relaxed")  # ready for the next launch (or graph replay)


@triton.jit
def row_rstd(squares_row_ptr, PARTS: tl.constexpr, PARTS_POW2: tl.constexpr, D, eps):
    """A deferred norm's ``1 / rms`` of one row of x (``deferred_norm.py``): its ``PARTS`` sums of squares added,
    over the row's ``D`` values."""
    parts = tl.arange(0, PARTS_POW2)
    squares = tl.load(squares_row_ptr + parts, mask=parts < PARTS, other=0.0)
    return 1.0 / tl.sqrt(tl.sum(squares, axis=0) / D + eps)


def epilogue_index(name: str) -> int:
    if name not in EPILOGUES:
        raise ValueError(f"unknown GEMV epilogue {name!r}: use one of {', '.join(EPILOGUES)}")
    return EPILOGUES.index(name)


@dataclass(frozen=True)
class _Epilogue:
    """What the GEMV's finishing programs do with their sums: ``name`` one of ``EPILOGUES``; ``add_rms_norm``
    also takes the residual stream (updated in place) and the norm; ``silu_and_mul`` may take ``words``
    (``[M, int16_x_words(N)]`` int32), which receive its outputs as 16-bit integers. ``row_squares``: x's words
    are a deferred norm's (``deferred_norm.py``, its eps ``eps``): every row's sums are multiplied by its 1 / rms
    first. ``deferred_norm`` takes the residual (updated in place), the norm, and writes ``words`` and
    ``squares`` (``[M, N // 128]`` float32, a group's sum of squares each): a ``DeferredRows``'s tensors."""

    name: str = "none"
    residual: torch.Tensor | None = None
    norm_weight: torch.Tensor | None = None
    eps: float = 0.0
    words: torch.Tensor | None = None
    row_squares: torch.Tensor | None = None
    squares: torch.Tensor | None = None


def _norm_constants(epilogue: str, outputs: int, blocks: int, m: int) -> dict[str, int | bool]:
    """The norm epilogue's compile-time widths (``norm_when_last``); fixed for the other epilogues, so that a
    launch without the norm compiles one kernel whatever its N."""
    if epilogue != "add_rms_norm":
        return {"NORM_N": 1, "NORM_WHOLE": True, "BLOCKS_N": 1}
    widest = NORM_MAX_N if m <= 2 else NORM_MAX_N // 4  # more rows: the loop's registers leave less room
    row = triton.next_power_of_2(outputs)
    return {"NORM_N": min(row, widest), "NORM_WHOLE": row <= widest, "BLOCKS_N": triton.next_power_of_2(blocks)}
