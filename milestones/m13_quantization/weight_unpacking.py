"""How W's bits become floats inside a kernel: int4 and int8 unpacked in registers, int4's tiles addressed.

m13's matmul kernels (``matmul_kernels.py``) read W as ``quantize.py`` stores it, one tile a step, and turn its
bytes into float32 values in registers with these ``@triton.jit`` helpers, to multiply them there at once (the
dequant path, ``dequant_matmul.py``, writes them out into a bf16 scratch instead)::

    _int4_rows             the addresses of each row's groups, in packed rows or in tiles
    _unpack_int4           bytes -> their low and high nibbles, -8..7 (convert or magic)
    _int4_products         those nibbles times one row of x, times the group's scale
    _int4_group_subnormal  int32 words of 8 nibbles times one row of x (subnormal: _nibble_in_place,
                           _scaled_for_nibble, _by_byte)
    _int8_to_float         int8 -> float32 (convert or magic)
    _load_x                a vector of x as float32

int4 may be stored in packed rows or in tiles (``quantize.tile_int4``: each group of 16 rows one contiguous KiB);
``_int4_rows`` turns either into the tile's addresses, so each step of a program reads whole KiBs from tiles.

Streaming 4 TB/s of int4 means unpacking ~8 trillion weights per second, so the unpacking must be cheap (an H200
issues about 33 thousand billion thread-instructions a second: 4.2 TB/s allows 8 a byte). Three ways to turn a
nibble ``u`` into a float, ``QuantMatmulConfig.unpack``:

    convert    float(u) - 8: an int-to-float conversion, a quarter of an add's rate or less.
    magic      bits(2^23) | u is the float 2^23 + u, so float(u) = (bits | u) - 2^23: an OR and a subtraction.
    subnormal  no conversion at all. Any bit pattern below 2^24, read as a float32, is that integer times
               2^-149 (the subnormals and the first binade of normal floats share one step). So the weights are
               read as int32 words of 8 nibbles, and nibble p of a word, masked in place (``w & (15 << 4p)``,
               one AND), is the float u * 2^(4p - 149). The input it multiplies is scaled up by 2^(149 - 4p - 85)
               instead, once per input rather than once per weight, so that every product is u * x * 2^-85, a
               normal float; the row's sum is scaled back by 2^85 at the end (powers of two: exact). The -8 comes
               off once per word: sum((u - 8) x) = sum(u x) - 8 sum(x). About two instructions a weight, against
               about nine for ``magic`` in the GEMV's byte layout (counted in the sm_90 assembly), where each
               thread also widened two inputs per byte it read.

int8 keeps ``magic`` (``u = q ^ 0x80`` is ``q + 128``): its GEMV reads twice the bytes per weight, and reached
its target without more. A fourth way makes no floats at all: x turned into integers, and four nibble-times-byte
products an instruction (``dp4a``, ``integer_dots.py``): int4's GEMV in the launch table.

The GEMV's whole loop on words (loads and addresses included) issues 7-9.5 instructions a byte, and it is not
waiting on them: on the H200 a variant with 25-35% fewer streamed no faster, while tiles cut its long matmuls' time
by 5% at the same launch and 22% with wider programs (``docs/int4-gemv-journal.md``, "Two guesses tested").
"""

from __future__ import annotations

import triton
import triton.language as tl

from .quantize import TILE_ROWS

CONVERT = tl.constexpr(0)  # the kernels' numbering of launch_config.UNPACK_MODES
MAGIC = tl.constexpr(1)
SUBNORMAL = tl.constexpr(2)
DP4A = tl.constexpr(3)  # int4 times x as 16-bit integers, four products an instruction (integer_dots.py)
# SUBNORMAL's units: a nibble or byte u read as float bits is u * 2^-149; x is scaled up by 2^64 so that the
# products (u * x * 2^-85) stay normal floats; the row's sum is scaled back by 2^85 at the end (powers of two:
# exact). |x| < 2^64 is all it asks of the activations; of the arithmetic, that subnormals are kept, not flushed
# to zero: Triton's float32 default on NVIDIA GPUs (no .ftz), and numpy's in the interpreter. The tests on CUDA
# compare against the float reference, so a flushing build would fail them.
TILE = tl.constexpr(TILE_ROWS)  # int4 in tiles: rows per tile (quantize.tile_int4)
X_UP = tl.constexpr(18446744073709551616.0)  # 2^64
NIBBLE_OFFSET = tl.constexpr(-2.0679515313825692e-25)  # -8 * 2^-85: a nibble's -8, in the products' units
UNIT_DOWN = tl.constexpr(3.8685626227668134e25)  # 2^85


@triton.jit
def _unpack_int4(b, UNPACK: tl.constexpr):
    """Bytes (int32 in 0..255) -> the signed values of their low and high nibbles, as float32 (-8..7)."""
    if UNPACK == CONVERT:
        lo = (b & 0xF).to(tl.float32) - 8.0
        hi = (b >> 4).to(tl.float32) - 8.0
    else:
        lo = ((b & 0xF) | 0x4B000000).to(tl.float32, bitcast=True) - (8388608.0 + 8.0)
        hi = ((b >> 4) | 0x4B000000).to(tl.float32, bitcast=True) - (8388608.0 + 8.0)
    return lo, hi


@triton.jit
def _nibble_in_place(words, P: tl.constexpr):
    """Nibble ``P`` (0..7, from the low bits up) of each int32 word as a float32 with its bits left in place:
    ``u * 2^(4P - 149)``. Any bit pattern below 2^24 is that integer times 2^-149 (the subnormals and the first
    binade of normal floats share one step), so nibbles 0-5 need only a mask; 6 and 7 are shifted down first."""
    if P < 6:
        f = (words & (0xF << (4 * P))).to(tl.float32, bitcast=True)
    else:
        f = ((words >> (4 * P)) & 0xF).to(tl.float32, bitcast=True)
    return f


@triton.jit
def _scaled_for_nibble(x, P: tl.constexpr):
    """x in the units that make ``_nibble_in_place(words, P) * x`` equal ``u * x * 2^-85``."""
    if P < 6:
        x = x * (X_UP / (1 << (4 * P)))
    else:
        x = x * X_UP
    return x


@triton.jit
def _by_byte(x, WORDS: tl.constexpr):
    """64 contiguous inputs (one contiguous load) -> 4 vectors of ``WORDS``: those of byte 0, 1, 2 and 3 of each
    word (inputs ``4w + b``)."""
    pairs_a, pairs_b = tl.split(tl.reshape(x, [WORDS, 2, 2]))  # [w, b // 2] for b even, and for b odd
    b0, b2 = tl.split(pairs_a)
    b1, b3 = tl.split(pairs_b)
    return b0, b1, b2, b3


@triton.jit
def _int4_group_subnormal(words, x_group_ptr, group_ok, HALF: tl.constexpr, WORDS: tl.constexpr):
    """One row of x times one 128-input group held as ``[BLOCK_N, 16]`` int32 words (8 nibbles each), in units
    of 2^-85. Byte ``b`` of word ``w`` holds inputs ``4w + b`` (low nibble) and ``64 + 4w + b`` (high), so
    nibble ``p`` multiplies input ``4w + p // 2 + 64 * (p % 2)``, scaled up by 2^64 over the nibble's own
    2^(4p) (``_nibble_in_place``). ``sum((u - 8) x) = sum(u x) - 8 sum(x)``: the 8s come off once per word.
    Eight fused multiply-adds and about nine integer operations a word: about two instructions a weight."""
    x_lo = _by_byte(_load_x(x_group_ptr + tl.arange(0, HALF), group_ok), WORDS)  # inputs 4w + b, b = 0..3
    x_hi = _by_byte(_load_x(x_group_ptr + HALF + tl.arange(0, HALF), group_ok), WORDS)  # inputs 64 + 4w + b
    x_sum = x_lo[0] + x_hi[0] + x_lo[1] + x_hi[1] + x_lo[2] + x_hi[2] + x_lo[3] + x_hi[3]
    part = tl.zeros(words.shape, tl.float32)
    for p in tl.static_range(8):
        x = x_hi[p // 2] if p % 2 else x_lo[p // 2]
        part = part + _nibble_in_place(words, p) * _scaled_for_nibble(x, p)[None, :]
    return part + (x_sum * NIBBLE_OFFSET)[None, :]


@triton.jit
def _int4_rows(w_ptr, cols, stride_wn, K, TILED: tl.constexpr, WIDTH: tl.constexpr, GROUP: tl.constexpr):
    """Pointers to the first unit (byte, or int32 word) of each row's group 0, ``[BLOCK_N, 1]``, and the distance
    from one group of a row to the next, in units. Rows: ``[N, K // 2]``. Tiles (``quantize.tile_int4``):
    ``[N // 16, K // 128, 16, WIDTH]``, so a group of 16 rows is one contiguous KiB."""
    if TILED:
        rows = w_ptr + ((cols // TILE) * (K // GROUP) * (TILE * WIDTH) + (cols % TILE) * WIDTH)[:, None]
        group_stride = TILE * WIDTH
    else:
        rows = w_ptr + cols[:, None] * stride_wn
        group_stride = WIDTH
    return rows, group_stride


@triton.jit
def _int8_to_float(q, UNPACK: tl.constexpr):
    """int8 -> float32: ``q``, or, ``MAGIC``, ``u = q + 128`` (0..255) written into the mantissa of 2^23, minus
    2^23 + 128 (``SUBNORMAL`` is treated as ``MAGIC`` here: int8's GEMV is not limited by its instructions)."""
    if UNPACK == CONVERT:
        w = q.to(tl.float32)
    else:
        u = (q.to(tl.int32) & 0xFF) ^ 0x80
        w = (u | 0x4B000000).to(tl.float32, bitcast=True) - (8388608.0 + 128.0)
    return w


@triton.jit
def _int4_products(lo, hi, x_lo_ptr, x_ok, HALF: tl.constexpr, scale):
    """One row of x times one 128-input group of unpacked nibbles (``[BLOCK_N, 64]`` bytes' low and high
    halves: inputs ``j`` and ``64 + j``), times the group's scale."""
    xl = _load_x(x_lo_ptr, x_ok)
    xh = _load_x(x_lo_ptr + HALF, x_ok)
    return (lo * xl[None, :] + hi * xh[None, :]) * scale[:, None]


@triton.jit
def _load_x(ptrs, mask):
    """A vector of x as float32; ``mask`` None: whole tiles, no mask (so the loads can be vectors)."""
    if mask is None:
        x = tl.load(ptrs)
    else:
        x = tl.load(ptrs, mask=mask, other=0.0)
    return x.to(tl.float32)
