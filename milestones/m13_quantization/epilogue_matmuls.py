"""The GEMV with the kernel after it folded into its finish: ``quantized_silu_and_mul`` (``_int16`` also writing its
outputs as 16-bit integers), ``quantized_add_rms_norm``, ``quantized_deferred_add_norm``; and the other way round,
``quantized_matmul_slices``: the GEMV's finish left to the kernel after it (``sliced_sums.py``).

Each call does what m12's decoder does in two (``epilogue_layers.py`` makes the swap). Where the launch is the
GEMV, with at most ``GEMV_MAX_ROWS`` rows of x and at least two rows of W a program (one SiLU pair), it runs the
GEMV with an epilogue: its finishing programs do the next kernel's work on their sums (``gemv_epilogues.py``).
Anywhere else it runs ``quantized_matmul`` and then m12's kernel. The shapes are checked as ``quantized_matmul``
checks them (``_plan``), and the epilogue's own besides: gate and up rows in equal numbers; a contiguous residual
``[M, N]`` in x's dtype and a norm weight ``[N]``.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from milestones.m12_async_scheduling.fused_kernels import add_rms_norm, silu_and_mul

from .gemv_epilogues import _Epilogue
from .integer_dots import int16_x_words
from .deferred_norm import DeferredRows
from .integer_norm import IntegerRows
from .launch_config import SILU_WORDS_GEMV, SLICED_GEMV_PROGRAMS_PER_SM, QuantMatmulConfig
from .matmul_kernels import GEMV_MAX_ROWS, _gemv, _plan, quantized_matmul
from .quantize import GROUP_SIZE
from .sliced_sums import SlicedSums


def _folds(m: int, config: QuantMatmulConfig) -> bool:
    """Whether this launch's finishing programs can take the next kernel's work: the GEMV, a few rows of x."""
    return config.kernel == "gemv" and 0 < m <= GEMV_MAX_ROWS and config.block_n >= 2


def quantized_silu_and_mul(x: torch.Tensor | DeferredRows, qweight: torch.Tensor, scales: torch.Tensor,
                           method: str, *, config: QuantMatmulConfig | None = None, split_k: int | None = None,
                           x_words: torch.Tensor | None = None) -> torch.Tensor:
    """``silu(gate) * up`` of ``x @ W^T``, W's rows the gate rows then the up rows (m10's packed ``gate_up_proj``):
    ``[M, N // 2]``. In the GEMV's finishing programs (``gemv_epilogues.py``); at more rows, the matmul and then
    m12's kernel. ``x_words``: as ``quantized_matmul`` takes it. ``x`` may be a deferred norm's rows (the GEMV's
    finish multiplies by their 1 / rms)."""
    x, x_words, epilogue = _deferred(x, x_words, _Epilogue("silu_and_mul"))
    m, n, k, config, split_k = _plan(x, qweight, scales, method, config, split_k)
    if n % 2:
        raise ValueError(f"silu_and_mul needs gate and up rows in equal numbers, got N = {n}")
    if not _folds(m, config):
        _refuse_deferred(epilogue, m)
        return silu_and_mul(quantized_matmul(x, qweight, scales, method, config=config, split_k=split_k,
                                             x_words=x_words))
    return _gemv(x, qweight, scales, m, n, k, method == "int4", config, split_k, epilogue, x_words)


def quantized_silu_and_mul_int16(x: torch.Tensor | DeferredRows, qweight: torch.Tensor, scales: torch.Tensor,
                                 method: str, *, config: QuantMatmulConfig | None = None, split_k: int | None = None,
                                 x_words: torch.Tensor | None = None) -> torch.Tensor | IntegerRows:
    """``quantized_silu_and_mul``, with its outputs also as ``int16_x``'s words (for a GEMV on ``dp4a`` after it)
    where the GEMV's programs can write them, each making one group of 128 outputs (by default, where the table's
    launch is the GEMV on ``dp4a``: ``launch_config.SILU_WORDS_GEMV``, K in one slice): then ``IntegerRows``.
    Anywhere else, ``quantized_silu_and_mul``'s tensor."""
    plain, words_in, epilogue = _deferred(x, x_words, _Epilogue("silu_and_mul"))
    launch, slices = config, split_k
    if config is None and _plan(plain, qweight, scales, method, None, None)[3].unpack == "dp4a":
        launch, slices = SILU_WORDS_GEMV, 1 if split_k is None else split_k
    m, n, k, launch, slices = _plan(plain, qweight, scales, method, launch, slices)
    per_block = launch.block_n // 2
    if n % 2 or not _folds(m, launch) or per_block != GROUP_SIZE or (n // 2) % GROUP_SIZE:
        return quantized_silu_and_mul(x, qweight, scales, method, config=config, split_k=split_k, x_words=x_words)
    words = torch.empty((m, int16_x_words(n // 2)), dtype=torch.int32, device=plain.device)
    out = _gemv(plain, qweight, scales, m, n, k, method == "int4", launch, slices, replace(epilogue, words=words),
                words_in)
    return IntegerRows(out, words)


def _deferred(x: torch.Tensor | DeferredRows, x_words: torch.Tensor | None,
              epilogue: _Epilogue) -> tuple[torch.Tensor, torch.Tensor | None, _Epilogue]:
    """(x for the shape checks, x's words, the epilogue): a deferred norm's rows give their words, and the
    epilogue multiplies by their 1 / rms."""
    if not isinstance(x, DeferredRows):
        return x, x_words, epilogue
    return x.stand_in(), x.words, replace(epilogue, eps=x.eps, row_squares=x.squares)


def _refuse_deferred(epilogue: _Epilogue, m: int) -> None:
    if epilogue.row_squares is not None:
        raise ValueError(f"a deferred norm's rows are read by the GEMV only (at most {GEMV_MAX_ROWS} rows of x, on "
                         f"int4's dp4a launch); got {m} rows")


def _check_norm_operands(what: str, x: torch.Tensor, residual: torch.Tensor, norm_weight: torch.Tensor, m: int,
                         n: int) -> None:
    """The residual ``[M, N]`` in x's dtype, contiguous, and the norm weight ``[N]``, contiguous, on x's device."""
    if (tuple(residual.shape) != (m, n) or residual.dtype != x.dtype or not residual.is_contiguous()
            or tuple(norm_weight.shape) != (n,) or not norm_weight.is_contiguous()
            or not x.device == residual.device == norm_weight.device):
        raise ValueError(f"{what} needs the residual as [M, N] = [{m}, {n}] in x's dtype ({x.dtype}), "
                         f"contiguous, and a contiguous norm weight [{n}], on x's device; got residual "
                         f"{residual.dtype} {tuple(residual.shape)}, norm weight {tuple(norm_weight.shape)}")


def quantized_add_rms_norm(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, method: str,
                           residual: torch.Tensor, norm_weight: torch.Tensor, eps: float, *,
                           config: QuantMatmulConfig | None = None, split_k: int | None = None,
                           x_words: torch.Tensor | None = None) -> torch.Tensor:
    """``residual += x @ W^T`` (in place, in ``residual``'s dtype); returns ``RMSNorm(residual) * norm_weight``,
    m12's ``add_rms_norm`` after the matmul. In the GEMV's finishing programs (``gemv_epilogues.py``); at more
    rows, the matmul and then m12's kernel. ``x_words``: as ``quantized_matmul`` takes it."""
    m, n, k, config, split_k = _plan(x, qweight, scales, method, config, split_k)
    _check_norm_operands("add_rms_norm", x, residual, norm_weight, m, n)
    if not _folds(m, config):
        return add_rms_norm(quantized_matmul(x, qweight, scales, method, config=config, split_k=split_k,
                                             x_words=x_words), residual, norm_weight, eps)
    return _gemv(x, qweight, scales, m, n, k, method == "int4", config, split_k,
                 _Epilogue("add_rms_norm", residual, norm_weight, eps), x_words)


def quantized_deferred_add_norm(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, method: str,
                                residual: torch.Tensor, norm_weight: torch.Tensor, eps: float, *,
                                config: QuantMatmulConfig | None = None, split_k: int | None = None,
                                x_words: torch.Tensor | None = None) -> DeferredRows:
    """``residual += x @ W^T`` (in place); returns RMSNorm(residual) * norm_weight with 1 / rms deferred
    (``DeferredRows``, a part of the sum of squares per group of 128): what ``quantized_matmul_slices`` then
    ``deferred_add_rms_norm`` return, the residual and the words to the bit, with the norm done by the GEMV's
    last program of each group (``gemv_epilogues.deferred_norm_when_last``) instead of a launch of its own. Only
    on int4's GEMV on ``dp4a`` (which reads those words); K cut as ``quantized_matmul_slices`` cuts it."""
    if config is None:
        m, n, k, config, _ = _plan(x, qweight, scales, method, None, 0)
        if config.kernel == "gemv":
            config = replace(config, min_programs_per_sm=SLICED_GEMV_PROGRAMS_PER_SM)
    m, n, k, config, split_k = _plan(x, qweight, scales, method, config, split_k)
    if (method != "int4" or x.dtype == torch.float32 or config.unpack != "dp4a" or not _folds(m, config)
            or n % GROUP_SIZE or max(config.block_n, GROUP_SIZE) % min(config.block_n, GROUP_SIZE)):
        raise ValueError(f"the deferred norm is done in int4's GEMV on dp4a only (at most {GEMV_MAX_ROWS} rows of "
                         f"bf16 or fp16 x, N a multiple of {GROUP_SIZE}, blocks of whole groups or groups of whole "
                         f"blocks); got {method}, {x.dtype}, {m} rows, N {n}, {config.kernel} block_n "
                         f"{config.block_n}")
    _check_norm_operands("the deferred norm", x, residual, norm_weight, m, n)
    words = torch.empty((m, int16_x_words(n)), dtype=torch.int32, device=x.device)
    squares = torch.empty((m, n // GROUP_SIZE), dtype=torch.float32, device=x.device)
    _gemv(x, qweight, scales, m, n, k, True, config, split_k,
          _Epilogue("deferred_norm", residual, norm_weight, eps, words, squares=squares), x_words)
    return DeferredRows(words, squares, eps, n, x.dtype)


def quantized_matmul_slices(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, method: str, *,
                            config: QuantMatmulConfig | None = None, split_k: int | None = None,
                            x_words: torch.Tensor | None = None) -> torch.Tensor | SlicedSums:
    """``quantized_matmul``, except that a GEMV leaves its slices' float32 sums unadded (one or more:
    ``SlicedSums``, for the kernel that reads them to add); any other launch returns the output. By default K is
    cut until ``SLICED_GEMV_PROGRAMS_PER_SM`` programs an SM."""
    if config is None:
        m, n, k, config, _ = _plan(x, qweight, scales, method, None, 0)
        if config.kernel == "gemv":
            config = replace(config, min_programs_per_sm=SLICED_GEMV_PROGRAMS_PER_SM)
    m, n, k, config, split_k = _plan(x, qweight, scales, method, config, split_k)
    if not _folds(m, config):
        return quantized_matmul(x, qweight, scales, method, config=config, split_k=split_k, x_words=x_words)
    return SlicedSums(_gemv(x, qweight, scales, m, n, k, method == "int4", config, split_k, x_words=x_words,
                            leave_slices=True), x.dtype)


def deferred_matmul_slices(x: DeferredRows, qweight: torch.Tensor, scales: torch.Tensor, method: str, *,
                           config: QuantMatmulConfig | None = None) -> SlicedSums:
    """``quantized_matmul_slices`` of a deferred norm's rows: the slices, to be multiplied by each row's 1 / rms
    where they are added (``sliced_sums.sliced_qk_norm_rope``)."""
    m, _, _, plan, _ = _plan(x.stand_in(), qweight, scales, method, config, None)
    if method != "int4" or x.dtype == torch.float32 or plan.unpack != "dp4a" or not _folds(m, plan):
        raise ValueError("a deferred norm's rows are multiplied as words, by int4's GEMV on dp4a only "
                         f"(at most {GEMV_MAX_ROWS} rows of bf16 or fp16 x); got {method}, {x.dtype}, {m} rows")
    sums = quantized_matmul_slices(x.stand_in(), qweight, scales, method, config=config, x_words=x.words)
    return replace(sums, row_squares=x.squares, eps=x.eps, x_dim=x.dim)
