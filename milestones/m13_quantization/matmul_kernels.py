"""Quantized matmuls in Triton: ``out = x @ dequantize(W)^T`` with the weight widened in registers, never in memory.

``x`` is ``[M, K]`` (bfloat16, float16 or float32 activations), ``W`` is ``[N, K]`` stored as int8 with one scale
per row, or as int4 nibbles with one scale per row and 128-input group (``quantize.py`` has the formats). Each
kernel reads every weight byte once from memory, turns it into a float in registers and multiplies it there:
the bytes read per step shrink 2x (int8) or ~3.8x (int4) against bf16, the arithmetic does not.

**gemv** (decode at batch 1-4, ``_quantized_gemv_kernel``): one program per ``BLOCK_N`` output rows (and per
slice of K if N alone gives too few programs: split-K, the slices added with float32 atomics). Each loop step
loads a ``[BLOCK_N, BLOCK_K]`` tile of weight bytes (contiguous along K, so 16-byte loads), unpacks it, and
multiply-adds it with the ``M`` rows of ``x`` on the CUDA cores::

    int8:  w = float(q)                                   acc[m, n] += sum_k x[m, k] * w[n, k]
    int4:  lo = float(b & 15) - 8, hi = float(b >> 4) - 8  (b: the bytes of one 128-input group, [BLOCK_N, 64])
           acc[m, n] += scale[n, g] * (sum_j x[m, 128g + j] * lo[n, j] + x[m, 128g + 64 + j] * hi[n, j])

Streaming 4 TB/s of int4 means unpacking ~8 billion weights per second: the ALUs, not memory, can become the
limit. ``float(q)`` as an int-to-float conversion runs at a quarter of the rate of an add (or less) on the H100
and H200, so with ``MAGIC`` the kernel writes the integer into the mantissa of ``2^23`` instead and subtracts:
``bits(2^23) | u`` is the float ``2^23 + u`` for any ``0 <= u < 2^23``, so ``float(u) = (bits | u) - 2^23`` costs
one OR and one subtraction. int8's sign is folded in the same way: ``u = q ^ 0x80`` is ``q + 128``.

**dot** (batch 5+, prompt chunks, ``_quantized_dot_kernel``): the classic tiled matmul (``BLOCK_M`` rows of x by
``BLOCK_N`` rows of W, grouped so that tiles reuse W from L2), whose W tile is unpacked to the activations'
dtype and fed to ``tl.dot`` on the tensor cores. int8: the integers (exact in bf16) go into the dot and each
column's scale multiplies the float32 result at the end. int4: each group's scale is multiplied into the unpacked
tile before its dot (a bf16 rounding of 1/256, beside the format's own step of 1/14 of the range), so every dot
accumulates into one float32 tile; a separate product per group would double the registers the tile needs.

**dequant** (very large M, ``_dequantize_kernel``): unpack a slice of W's rows into a bf16 scratch and call
``F.linear`` (cuBLAS) on it, slice after slice; at thousands of rows the product dwarfs the unpacking.

Everything here decides from shapes and Python ints only (no tensor values), so the launches can be captured in
m10's CUDA graphs. On CPU tensors the kernels run in Triton's interpreter (m08's ``device_kernel``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

import triton
import triton.language as tl

from milestones.m08_triton_kernel.device_kernel import device_kernel, runs_interpreted
from milestones.m08_triton_kernel.launch_config import sm_count

from .launch_config import QuantMatmulConfig, choose_launch, choose_split_k, fits_method
from .quantize import GROUP_SIZE, QUANTIZATION_METHODS

ACTIVATION_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
DEQUANT_SCRATCH_BYTES = 64 * 2**20  # the dequant path unpacks at most this many bytes of W at a time
MAX_SPLIT_K = 64  # slices of K a caller may ask for (the heuristic stays at launch_config.MAX_SPLIT_K)
MAX_DEFERRED_PER_THREAD = 64  # gemv: float32 partial sums a thread may carry across the loop (DEFER_SUM)


@triton.jit
def _unpack_int4(b, MAGIC: tl.constexpr):
    """Bytes (int32 in 0..255) -> the signed values of their low and high nibbles, as float32 (-8..7)."""
    if MAGIC:
        lo = ((b & 0xF) | 0x4B000000).to(tl.float32, bitcast=True) - (8388608.0 + 8.0)
        hi = ((b >> 4) | 0x4B000000).to(tl.float32, bitcast=True) - (8388608.0 + 8.0)
    else:
        lo = (b & 0xF).to(tl.float32) - 8.0
        hi = (b >> 4).to(tl.float32) - 8.0
    return lo, hi


@device_kernel
@triton.jit
def _quantized_gemv_kernel(
    x_ptr, w_ptr, s_ptr, out_ptr,
    M, N, K, k_per_split,
    stride_xm, stride_wn, stride_sn, stride_om,
    INT4: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP: tl.constexpr, MAGIC: tl.constexpr, ATOMIC: tl.constexpr, EVEN: tl.constexpr, DEFER_SUM: tl.constexpr,
):
    """One program: output rows [pid_n * BLOCK_N, +BLOCK_N) for all M rows of x, over its slice of K.

    ``EVEN``: N and every K slice are whole tiles, so the weight loads need no mask (a mask that changes along K
    would keep them from being 16-byte vector loads). ``DEFER_SUM``: the products accumulate elementwise over the
    loop and are summed across K once at the end, instead of a cross-thread reduction in every step (when the
    accumulator fits in a few registers per thread: batch 1)."""
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    rows = tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < M
    col_ok = cols < N
    k_start = pid_k * k_per_split
    k_end = tl.minimum(k_start + k_per_split, K)
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    if INT4:
        HALF: tl.constexpr = GROUP // 2
        GROUPS: tl.constexpr = BLOCK_K // GROUP  # groups per loop step
        g = tl.arange(0, GROUPS)
        j = tl.arange(0, HALF)
        if DEFER_SUM:
            partial = tl.zeros([BLOCK_M, BLOCK_N, GROUPS, HALF], tl.float32)
        for k0 in range(k_start, k_end, BLOCK_K):
            byte = k0 // 2 + g[:, None] * HALF + j[None, :]  # [GROUPS, HALF]: contiguous along the row
            w_ptrs = w_ptr + cols[:, None, None] * stride_wn + byte[None, :, :]
            s_ptrs = s_ptr + cols[:, None] * stride_sn + (k0 // GROUP + g)[None, :]
            k_lo = k0 + g[:, None] * GROUP + j[None, :]  # the inputs the low nibbles multiply; high: + HALF
            if EVEN:
                b = tl.load(w_ptrs).to(tl.int32)
                scale = tl.load(s_ptrs)  # [BLOCK_N, GROUPS]
                x_mask = row_ok[:, None, None]
            else:
                group_ok = k0 + g * GROUP < k_end  # K is a multiple of GROUP: whole groups are in or out
                b = tl.load(w_ptrs, mask=col_ok[:, None, None] & group_ok[None, :, None], other=0).to(tl.int32)
                scale = tl.load(s_ptrs, mask=col_ok[:, None] & group_ok[None, :], other=0.0)
                x_mask = row_ok[:, None, None] & group_ok[None, :, None]
            lo, hi = _unpack_int4(b, MAGIC)  # [BLOCK_N, GROUPS, HALF]
            x_lo = tl.load(x_ptr + rows[:, None, None] * stride_xm + k_lo[None, :, :], mask=x_mask,
                           other=0.0).to(tl.float32)  # [BLOCK_M, GROUPS, HALF]
            x_hi = tl.load(x_ptr + rows[:, None, None] * stride_xm + (k_lo + HALF)[None, :, :], mask=x_mask,
                           other=0.0).to(tl.float32)
            products = x_lo[:, None, :, :] * lo[None, :, :, :] + x_hi[:, None, :, :] * hi[None, :, :, :]
            if DEFER_SUM:
                partial += products * scale[None, :, :, None]
            else:
                acc += tl.sum(tl.sum(products, axis=3) * scale[None, :, :], axis=2)
        if DEFER_SUM:
            acc = tl.sum(tl.sum(partial, axis=3), axis=2)
    else:
        ks = tl.arange(0, BLOCK_K)
        if DEFER_SUM:
            partial = tl.zeros([BLOCK_M, BLOCK_N, BLOCK_K], tl.float32)
        for k0 in range(k_start, k_end, BLOCK_K):
            w_ptrs = w_ptr + cols[:, None] * stride_wn + (k0 + ks)[None, :]
            x_ptrs = x_ptr + rows[:, None] * stride_xm + (k0 + ks)[None, :]
            if EVEN:
                q = tl.load(w_ptrs)  # int8 [BLOCK_N, BLOCK_K]
                x = tl.load(x_ptrs, mask=row_ok[:, None], other=0.0).to(tl.float32)  # [BLOCK_M, BLOCK_K]
            else:
                k_ok = k0 + ks < k_end
                q = tl.load(w_ptrs, mask=col_ok[:, None] & k_ok[None, :], other=0)
                x = tl.load(x_ptrs, mask=row_ok[:, None] & k_ok[None, :], other=0.0).to(tl.float32)
            if MAGIC:
                u = (q.to(tl.int32) & 0xFF) ^ 0x80  # q + 128, in 0..255
                w = (u | 0x4B000000).to(tl.float32, bitcast=True) - (8388608.0 + 128.0)
            else:
                w = q.to(tl.float32)
            if DEFER_SUM:
                partial += x[:, None, :] * w[None, :, :]
            else:
                acc += tl.sum(x[:, None, :] * w[None, :, :], axis=2)
        if DEFER_SUM:
            acc = tl.sum(partial, axis=2)
        acc = acc * tl.load(s_ptr + cols, mask=col_ok, other=0.0)[None, :]
    out = out_ptr + rows[:, None] * stride_om + cols[None, :]
    mask = row_ok[:, None] & col_ok[None, :]
    if ATOMIC:  # split-K: every slice adds its part into a zeroed float32 output
        tl.atomic_add(out, acc, mask=mask)
    else:
        tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=mask)


@device_kernel
@triton.jit
def _quantized_dot_kernel(
    x_ptr, w_ptr, s_ptr, out_ptr,
    M, N, K,
    stride_xm, stride_wn, stride_sn, stride_om,
    INT4: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP: tl.constexpr, GROUP_M: tl.constexpr, DOT_FP32: tl.constexpr, IEEE: tl.constexpr, EVEN_K: tl.constexpr,
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
        for k0 in range(0, K, BLOCK_K):
            for t in tl.static_range(BLOCK_K // GROUP):  # K is a multiple of GROUP, BLOCK_K of GROUP
                kg = k0 + t * GROUP
                group_ok = (kg + j) < K  # [HALF]: all true or all false (whole groups)
                b = tl.load(w_ptr + cols[:, None] * stride_wn + (kg // 2 + j)[None, :],
                            mask=col_ok[:, None] & group_ok[None, :], other=0).to(tl.int32)  # [BLOCK_N, HALF]
                # a group past K (the last step of a K that BLOCK_K does not divide) has x = 0: any finite scale
                # will do, read from a valid address
                scale = tl.load(s_ptr + cols * stride_sn + tl.minimum(kg // GROUP, K // GROUP - 1), mask=col_ok,
                                other=0.0)[:, None]
                # the group's scale goes into the unpacked tile (one rounding to the dot's dtype), so the dots
                # accumulate straight into acc: no second [BLOCK_M, BLOCK_N] accumulator to hold in registers
                lo = (((b & 0xF) - 8).to(tl.float32) * scale).to(compute_dtype)
                hi = (((b >> 4) - 8).to(tl.float32) * scale).to(compute_dtype)
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
            if IEEE:
                acc = tl.dot(x, tl.trans(q.to(compute_dtype)), acc, input_precision="ieee")
            else:
                acc = tl.dot(x, tl.trans(q.to(compute_dtype)), acc)
        acc = acc * tl.load(s_ptr + cols, mask=col_ok, other=0.0)[None, :]
    out = out_ptr + rows[:, None] * stride_om + cols[None, :]
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & col_ok[None, :])


@device_kernel
@triton.jit
def _dequantize_kernel(
    w_ptr, s_ptr, out_ptr, N, K, stride_wn, stride_sn, stride_on,
    INT4: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP: tl.constexpr,
):
    """W's rows [pid_n * BLOCK_N, +BLOCK_N), inputs [pid_k * BLOCK_K, +BLOCK_K), written as floats."""
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < N
    if INT4:
        HALF: tl.constexpr = GROUP // 2
        GROUPS: tl.constexpr = BLOCK_K // GROUP
        g = pid_k * GROUPS + tl.arange(0, GROUPS)
        j = tl.arange(0, HALF)
        scale_mask = col_ok[:, None] & (g * GROUP < K)[None, :]  # [BLOCK_N, GROUPS]
        mask = scale_mask[:, :, None] & (j < HALF)[None, None, :]
        b = tl.load(w_ptr + cols[:, None, None] * stride_wn + (g[:, None] * HALF + j[None, :])[None, :, :],
                    mask=mask, other=0).to(tl.int32)
        scale = tl.load(s_ptr + cols[:, None] * stride_sn + g[None, :], mask=scale_mask, other=0.0)
        lo, hi = _unpack_int4(b, True)
        k_lo = (g[:, None] * GROUP + j[None, :])[None, :, :]
        out = out_ptr + cols[:, None, None] * stride_on + k_lo
        tl.store(out, (lo * scale[:, :, None]).to(out_ptr.dtype.element_ty), mask=mask)
        tl.store(out + HALF, (hi * scale[:, :, None]).to(out_ptr.dtype.element_ty), mask=mask)
    else:
        ks = pid_k * BLOCK_K + tl.arange(0, BLOCK_K)
        mask = col_ok[:, None] & (ks < K)[None, :]
        q = tl.load(w_ptr + cols[:, None] * stride_wn + ks[None, :], mask=mask, other=0)
        scale = tl.load(s_ptr + cols, mask=col_ok, other=0.0)
        tl.store(out_ptr + cols[:, None] * stride_on + ks[None, :],
                 (q.to(tl.float32) * scale[:, None]).to(out_ptr.dtype.element_ty), mask=mask)


# --------------------------------------------------------------------------- the host side


def _check(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, method: str) -> tuple[int, int, int]:
    """Shapes, dtypes and devices (never values); returns (M, N, K)."""
    if method not in QUANTIZATION_METHODS:
        raise ValueError(f"unknown quantization method {method!r}: use {' or '.join(QUANTIZATION_METHODS)}")
    if x.dim() != 2 or qweight.dim() != 2:
        raise ValueError(f"x must be [M, K] and qweight [N, K] (int8) or [N, K // 2] (int4); got x "
                         f"{tuple(x.shape)}, qweight {tuple(qweight.shape)}")
    m, k = x.shape
    n = qweight.shape[0]
    if x.dtype not in ACTIVATION_DTYPES:
        raise ValueError(f"x must be float32, float16 or bfloat16, got {x.dtype}")
    if method == "int8":
        expected = ((n, k), torch.int8, (n,))
    else:
        if k % GROUP_SIZE:
            raise ValueError(f"int4 needs K (the inputs, {k}) to be a multiple of its group size {GROUP_SIZE}")
        expected = ((n, k // 2), torch.uint8, (n, k // GROUP_SIZE))
    shape, dtype, scale_shape = expected
    if tuple(qweight.shape) != shape or qweight.dtype != dtype:
        raise ValueError(f"{method} qweight for x {tuple(x.shape)} must be {dtype} {shape}, got {qweight.dtype} "
                         f"{tuple(qweight.shape)}")
    if tuple(scales.shape) != scale_shape or scales.dtype != torch.float32:
        raise ValueError(f"{method} scales must be float32 {scale_shape}, got {scales.dtype} {tuple(scales.shape)}")
    if x.stride(-1) != 1 or qweight.stride(-1) != 1 or scales.stride(-1) != 1:
        raise ValueError("x, qweight and scales must be contiguous along their last dimension")
    if not (x.device == qweight.device == scales.device):
        raise ValueError(f"all tensors must be on one device; got {x.device}, {qweight.device}, {scales.device}")
    return m, n, k


_CHECKED: dict[tuple, tuple[int, int, int]] = {}
_MAX_LAYOUTS = 1024


def _meta(t: torch.Tensor) -> tuple:
    return t.shape, t.stride(), t.dtype, t.device


def quantized_matmul(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, method: str, *,
                     config: QuantMatmulConfig | None = None, split_k: int | None = None) -> torch.Tensor:
    """``x [M, K] @ dequantize(qweight, scales)^T`` -> ``[M, N]`` in ``x``'s dtype.

    ``config``: by default ``launch_config.LAUNCH_TABLE``'s entry for ``M``'s regime; ``split_k`` (gemv only)
    overrides the heuristic's number of K slices.
    """
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
    split_k = heuristic_split if split_k is None else split_k
    if m == 0:
        return x.new_empty((0, n))
    int4 = method == "int4"
    if config.kernel == "gemv":
        return _gemv(x, qweight, scales, m, n, k, int4, config, split_k)
    if config.kernel == "dot":
        return _dot(x, qweight, scales, m, n, k, int4, config)
    return _dequant_then_cublas(x, qweight, scales, n, k, int4, config)


def _gemv(x, qweight, scales, m, n, k, int4, config, split_k) -> torch.Tensor:
    if not 1 <= split_k <= MAX_SPLIT_K:
        raise ValueError(f"split_k must be in [1, {MAX_SPLIT_K}], got {split_k}")
    block_m = triton.next_power_of_2(m)
    k_per_split = -(-k // (split_k * config.block_k)) * config.block_k
    split_k = -(-k // k_per_split)  # slices that hold at least one step of K
    atomic = split_k > 1
    out = torch.zeros((m, n), dtype=torch.float32, device=x.device) if atomic else x.new_empty((m, n))
    even = n % config.block_n == 0 and k % config.block_k == 0 and k_per_split % config.block_k == 0
    per_thread = block_m * config.block_n * config.block_k // (32 * config.num_warps)  # a deferred sum's registers
    _quantized_gemv_kernel[(triton.cdiv(n, config.block_n), split_k)](
        x, qweight, scales, out, m, n, k, k_per_split,
        x.stride(0), qweight.stride(0), scales.stride(0), out.stride(0),
        INT4=int4, BLOCK_M=block_m, BLOCK_N=config.block_n, BLOCK_K=config.block_k, GROUP=GROUP_SIZE,
        MAGIC=config.magic, ATOMIC=atomic, EVEN=even,
        DEFER_SUM=config.defer_sum and per_thread <= MAX_DEFERRED_PER_THREAD,
        num_warps=config.num_warps, num_stages=config.num_stages,
    )
    return out.to(x.dtype) if atomic else out


def _dot_fp32(x: torch.Tensor) -> bool:
    # Triton's interpreter computes bfloat16 dots wrongly (m08's kernel notes it too): upcast the tiles there.
    return x.dtype == torch.float32 or (runs_interpreted(x.device) and x.dtype == torch.bfloat16)


def _dot(x, qweight, scales, m, n, k, int4, config) -> torch.Tensor:
    out = x.new_empty((m, n))
    block_k = max(config.block_k, GROUP_SIZE) if int4 else config.block_k
    grid = (triton.cdiv(m, config.block_m) * triton.cdiv(n, config.block_n),)
    _quantized_dot_kernel[grid](
        x, qweight, scales, out, m, n, k, x.stride(0), qweight.stride(0), scales.stride(0), out.stride(0),
        INT4=int4, BLOCK_M=config.block_m, BLOCK_N=config.block_n, BLOCK_K=block_k, GROUP=GROUP_SIZE,
        GROUP_M=config.group_m, DOT_FP32=_dot_fp32(x), IEEE=x.dtype == torch.float32, EVEN_K=k % block_k == 0,
        num_warps=config.num_warps, num_stages=config.num_stages,
    )
    return out


def dequantize(qweight: torch.Tensor, scales: torch.Tensor, method: str, dtype: torch.dtype,
               rows: slice | None = None, config: QuantMatmulConfig | None = None) -> torch.Tensor:
    """``W[rows]`` as a dense ``dtype`` matrix, unpacked by ``_dequantize_kernel`` (the dequant path's scratch)."""
    rows = rows or slice(0, qweight.shape[0])
    w, s = qweight[rows], scales[rows]
    n = w.shape[0]
    k = w.shape[1] * (2 if method == "int4" else 1)
    config = config or QuantMatmulConfig("dequant", block_n=64, block_k=256, num_warps=4, num_stages=2)
    block_k = max(config.block_k, GROUP_SIZE) if method == "int4" else config.block_k
    out = torch.empty((n, k), dtype=dtype, device=qweight.device)
    _dequantize_kernel[(triton.cdiv(n, config.block_n), triton.cdiv(k, block_k))](
        w, s, out, n, k, w.stride(0), s.stride(0), out.stride(0),
        INT4=method == "int4", BLOCK_N=config.block_n, BLOCK_K=block_k, GROUP=GROUP_SIZE,
        num_warps=config.num_warps,
    )
    return out


def _dequant_then_cublas(x, qweight, scales, n, k, int4, config) -> torch.Tensor:
    method = "int4" if int4 else "int8"
    rows_per_slice = max(config.block_n, DEQUANT_SCRATCH_BYTES // (k * x.element_size()))
    if rows_per_slice >= n:
        return F.linear(x, dequantize(qweight, scales, method, x.dtype, config=config))
    out = x.new_empty((x.shape[0], n))
    for start in range(0, n, rows_per_slice):
        rows = slice(start, min(n, start + rows_per_slice))
        out[:, rows] = F.linear(x, dequantize(qweight, scales, method, x.dtype, rows, config))
    return out


def quantized_matmul_reference(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor,
                               method: str) -> torch.Tensor:
    """The same product in float32 torch: the definition every kernel must meet."""
    from .quantize import dequantize_weight

    return (x.float() @ dequantize_weight(qweight, scales, method, torch.float32).T).to(x.dtype)
