"""Weight-only quantization: the two formats, quantizing at load, and the module that replaces ``nn.Linear``.

A decode step reads every weight once and does two flops per weight per row. At small batch the GPU waits on
memory, not arithmetic, so the step's time is the weights' bytes over the memory bandwidth. Storing each weight
in fewer bits and widening it back to bfloat16 *in registers*, inside the matmul kernel, cuts the bytes read
and leaves the arithmetic as it was (``matmul_kernels.py``). Only the weights are quantized ("weight-only",
W8A16 / W4A16): activations stay in bfloat16.

**int8, per output channel** (``quantization="int8"``)::

    scale[n] = max_k |W[n, k]| / 127           one float32 per output row
    q[n, k]  = round(W[n, k] / scale[n])       int8 in [-127, 127]
    W[n, k] ~ q[n, k] * scale[n]                1 byte per weight (+ 4 bytes per row)

**int4, groups of 128 along the input dimension** (``quantization="int4"``): one scale per row per group, since
a single scale per row would spend the 16 levels on the row's largest outlier::

    scale[n, g] = max_{k in g} |W[n, k]| / 7   one float32 per 128 weights (0.03 bytes per weight)
    q[n, k]     = round(W[n, k] / scale[n, g]) in [-7, 7], stored as q + 8 (a nibble, 1..15)

Two nibbles share a byte. Within each group of 128, byte ``j`` (0..63) holds element ``j`` in its low nibble and
element ``j + 64`` in its high nibble (llama.cpp's Q4_0 blocks are laid out the same way), so both nibbles of
a byte use the same scale and a kernel unpacks a group into two contiguous halves with one mask and one shift::

    packed[n, 64 g + j] = (q[n, 128 g + j] + 8) | (q[n, 128 g + 64 + j] + 8) << 4

Symmetric scales (no zero point) keep the dequantisation one multiply; both formats round to nearest.

**int4 in tiles** (what ``QuantizedLinear`` stores when ``N`` is a multiple of ``TILE_ROWS``): the same bytes,
reordered so that one 128-input group of 16 consecutive rows is one contiguous KiB::

    tiles[n // 16, g, n % 16, j] = packed[n, 64 g + j]        shape [N / 16, K / 128, 16, 64]

A batch-1 GEMV program reads a group of ``block_n`` rows per step: in rows, that is ``block_n`` separate 64-byte
pieces 2 KiB apart (K = 4,096); in tiles, ``block_n / 16`` whole KiBs, and a program's steps follow each other
in memory. The values, the bytes read and the arithmetic are the same; on the H200 the LM head's GEMV took 5% less
time from tiles at the same launch, and 22% less with the wider programs tiles made worth it; the short matmuls
2-5% less (``docs/m13-quantization.md``). Marlin reorders its weights offline for the same reason.

int4's scales are stored group by group (``group_major``: the same ``[N, K // 128]`` tensor, strides ``(1, N)``),
so that the scales a GEMV program reads for one group of its rows are one contiguous piece: on the H200 the LM
head's GEMV took 14% less time, the batch-1 step 1.4% (``docs/m13-quantization.md``, calls 55-56).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

QUANTIZATION_METHODS = ("int8", "int4")
INT8_MAX = 127
INT4_MAX = 7  # symmetric: -7..7, stored with an offset of 8 as 1..15 (0 and -8 unused)
INT4_OFFSET = 8
GROUP_SIZE = 128  # int4: inputs per scale
TILE_ROWS = 16  # int4 in tiles: rows of W per tile (tile_int4)


def check_method(method: str) -> None:
    if method not in QUANTIZATION_METHODS:
        raise ValueError(f"unknown quantization {method!r}: use {' or '.join(QUANTIZATION_METHODS)} (or None)")


def check_groupable(in_features: int, name: str = "a linear layer") -> None:
    """int4's groups of ``GROUP_SIZE`` inputs must tile the input dimension exactly."""
    if in_features % GROUP_SIZE:
        raise ValueError(f"quantization='int4' groups {GROUP_SIZE} inputs per scale, but {name} has "
                         f"{in_features} inputs (not a multiple of {GROUP_SIZE}); use int8 for this model")


# --------------------------------------------------------------------------- int8


def quantize_int8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``[N, K]`` float -> (int8 ``[N, K]``, float32 scales ``[N]``)."""
    w = weight.float()
    scales = w.abs().amax(dim=1).clamp(min=torch.finfo(torch.float32).tiny) / INT8_MAX
    q = torch.round(w / scales[:, None]).clamp(-INT8_MAX, INT8_MAX).to(torch.int8)
    return q, scales


def dequantize_int8(q: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return (q.float() * scales[:, None]).to(dtype)


# --------------------------------------------------------------------------- int4


def quantize_int4(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``[N, K]`` float -> (uint8 ``[N, K // 2]``, two nibbles per byte; float32 scales ``[N, K // 128]``)."""
    n, k = weight.shape
    check_groupable(k)
    groups = weight.float().view(n, k // GROUP_SIZE, GROUP_SIZE)
    scales = groups.abs().amax(dim=2).clamp(min=torch.finfo(torch.float32).tiny) / INT4_MAX
    q = torch.round(groups / scales[:, :, None]).clamp(-INT4_MAX, INT4_MAX).to(torch.int16) + INT4_OFFSET
    return pack_int4(q.view(n, k)), scales


def pack_int4(nibbles: torch.Tensor) -> torch.Tensor:
    """Values 0..15 ``[N, K]`` -> bytes ``[N, K // 2]``: per group of 128, element j low, element j + 64 high."""
    n, k = nibbles.shape
    halves = nibbles.to(torch.uint8).view(n, k // GROUP_SIZE, 2, GROUP_SIZE // 2)
    return (halves[:, :, 0] | (halves[:, :, 1] << 4)).view(n, k // 2)


def unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    """Bytes ``[N, K // 2]`` -> the nibbles 0..15 ``[N, K]`` (uint8), in the weight's column order."""
    n, half = packed.shape
    groups = packed.view(n, half // (GROUP_SIZE // 2), GROUP_SIZE // 2)
    return torch.stack([groups & 0xF, groups >> 4], dim=2).view(n, 2 * half)


def tile_int4(packed: torch.Tensor) -> torch.Tensor:
    """Bytes ``[N, K // 2]`` (N a multiple of ``TILE_ROWS``) -> tiles ``[N // 16, K // 128, 16, 64]``."""
    n, half = packed.shape
    if n % TILE_ROWS:
        raise ValueError(f"int4 tiles hold {TILE_ROWS} rows each: N = {n} is not a multiple of {TILE_ROWS}")
    return packed.view(n // TILE_ROWS, TILE_ROWS, half // 64, 64).transpose(1, 2).contiguous()


def group_major(scales: torch.Tensor) -> torch.Tensor:
    """int4 scales ``[N, K // 128]`` stored group by group (strides ``(1, N)``, the same values and shape). A batch-1
    GEMV program reads one group's scales for its 32 rows per loop step: row by row they are 32 separate 32-byte
    sectors, 4 bytes used in each; group by group, 128 contiguous bytes. Every kernel takes both strides."""
    return scales.t().contiguous().t()


def untile_int4(packed: torch.Tensor) -> torch.Tensor:
    """Tiles ``[N // 16, K // 128, 16, 64]`` -> bytes ``[N, K // 2]`` (bytes in rows are returned as they are)."""
    if packed.dim() == 2:
        return packed
    tiles, groups, rows, width = packed.shape
    return packed.transpose(1, 2).reshape(tiles * rows, groups * width)


def dequantize_int4(packed: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    packed = untile_int4(packed)
    n = packed.shape[0]
    values = unpack_int4(packed).float() - INT4_OFFSET  # -7..7
    return (values.view(n, -1, GROUP_SIZE) * scales[:, :, None]).view(n, -1).to(dtype)


def quantize_weight(weight: torch.Tensor, method: str) -> tuple[torch.Tensor, torch.Tensor]:
    check_method(method)
    return quantize_int8(weight) if method == "int8" else quantize_int4(weight)


def dequantize_weight(qweight: torch.Tensor, scales: torch.Tensor, method: str,
                      dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return (dequantize_int8 if method == "int8" else dequantize_int4)(qweight, scales, dtype)


def bytes_per_weight(method: str | None, dtype: torch.dtype = torch.bfloat16) -> float:
    """Bytes one weight costs in memory and per step, scales included (arithmetic, independent of shape)."""
    if method is None:
        return torch.empty((), dtype=dtype).element_size()
    check_method(method)
    return 1.0 if method == "int8" else 0.5 + 4 / GROUP_SIZE  # int8's per-row scale is ~0 per weight


# --------------------------------------------------------------------------- the module


class QuantizedLinear(nn.Module):
    """``nn.Linear`` with a quantized weight: ``qweight`` (int8 ``[N, K]``; int4 in tiles ``[N // 16, K // 128,
    16, 64]``, or packed rows ``[N, K // 2]`` where N is not a multiple of 16) and float32 ``scales`` (int4's
    stored group by group: ``group_major``; ``.to()`` and ``torch.save`` keep that order, ``torch.cat`` or
    ``.contiguous()`` would give row-by-row scales back, read correctly, only more slowly); the bias, if any, stays
    in the activations' dtype.

    ``forward`` runs ``matmul_kernels.quantized_matmul`` (the Triton kernels) when ``kernel == "triton"``
    (the default on a GPU), else the torch reference: dequantize the whole weight, then ``F.linear``. On a CPU
    the Triton kernels could only run in Triton's interpreter, far too slowly for an engine, so the torch
    path computes the same thing there (up to the order of the sums); the tests check the kernels separately.
    """

    def __init__(self, qweight: torch.Tensor, scales: torch.Tensor, method: str, in_features: int,
                 bias: torch.Tensor | None = None, kernel: str = "torch") -> None:
        super().__init__()
        self.method, self.in_features, self.out_features = method, in_features, scales.shape[0]
        self.register_buffer("qweight", qweight)
        self.register_buffer("scales", scales)
        self.register_buffer("bias", bias)
        self.kernel = kernel

    @classmethod
    @torch.no_grad()
    def from_linear(cls, linear: nn.Linear, method: str, kernel: str = "torch") -> QuantizedLinear:
        qweight, scales = quantize_weight(linear.weight, method)
        if method == "int4":
            scales = group_major(scales)
            if qweight.shape[0] % TILE_ROWS == 0:
                qweight = tile_int4(qweight)
        bias = None if linear.bias is None else linear.bias.detach().clone()
        return cls(qweight, scales, method, linear.in_features, bias, kernel)

    @property
    def weight_bytes(self) -> int:
        return self.qweight.numel() * self.qweight.element_size() + self.scales.numel() * self.scales.element_size()

    def dequantized_weight(self, dtype: torch.dtype) -> torch.Tensor:
        return dequantize_weight(self.qweight, self.scales, self.method, dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.kernel == "triton":
            from .matmul_kernels import quantized_matmul

            lead = x.shape[:-1]
            out = quantized_matmul(x.reshape(-1, self.in_features), self.qweight, self.scales, self.method)
            out = out.view(*lead, self.out_features)
            return out if self.bias is None else out + self.bias
        return F.linear(x, self.dequantized_weight(x.dtype), self.bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, method={self.method}, " \
               f"kernel={self.kernel}"
