"""How a quantized matmul is launched: one configuration per regime of the token count ``M``.

``out[M, N] = x[M, K] @ W[N, K]^T`` with ``W`` quantized. Four regimes, decided from ``M`` alone (a Python int,
so a captured CUDA graph always replays the launch it recorded):

    gemv    M <= GEMV_MAX_M (int8 1-2, int4 1-4)   every weight byte is used by only M rows: pure streaming.
            One program per BLOCK_N output rows (and per slice of K when N alone gives too few programs):
            unpack in registers, multiply-add on the CUDA cores, no tensor cores (a 16-row tl.dot would spend
            16x the multiplies on padding). int4 multiplies on the integer units (``dp4a``, x converted to 16-bit
            integers first): a Qwen3-8B step 1.95x bf16 at one row (1.90x before), 1.68x at 2 (1.42x), 1.23x at 4,
            where the tensor-core tile below gave 1.14x (results/h200/m13_step_times+dp4a-ab.json); with the
            launch tuned again for dp4a, 2.00x and 1.74x (results/h200/m13_step_times+dp4a-grid.json).
    small   M <= SMALL_MAX_M (decode at batch 3-16)  a tile of M rows (padded to 16) on the tensor cores: the
            weight tile is unpacked to bf16 in registers and fed to ``tl.dot``, once for all rows, where the GEMV
            unpacks and multiplies each weight once per row on the CUDA cores. On the H200 a Qwen3-8B step at
            4 rows takes 4.42 ms in int4 and 4.69 in int8 this way, 5.56 on int8's GEMV, bf16 4.96; at 2 rows
            the GEMV wins (results/h200/m13_step_times+regimes-ab.json, +int8-small-batches.json), so int8
            leaves it after 2 (int4, on dp4a, after 4). Past 16 rows it loads and unpacks W once per 16 rows of x.
    large   M <= LARGE_MAX_M (decode at batch 17-512)  ``swap_ab`` (``swap_ab_matmul.py``): the tensor cores
            with W's unpacked tile as their register operand and x's rows as the other (``out^T = W x^T``), K
            in slices where N gives too few programs; each weight byte read once for up to 128 rows. At 32 rows
            a Qwen3-8B step is int4 1.05x bf16 and int8 0.93x (0.74x and 0.69x on the 16-row tile; at 4 and
            16 rows the tile is as fast for int4 and faster for int8: results/h200/
            m13_step_times+small-swap-ab.json). At 64 rows, int4 0.94x and int8 0.86x; at 128, 0.75x and 0.76x
            (through a bf16 scratch for cuBLAS, the table before, 0.47x and 0.45x:
            results/h200/m13_step_times+swap-ab.json): the unpacking is extra work once the tensor cores, not
            the bytes, set the pace.
    prefill M > LARGE_MAX_M (prompt chunks)  ``dequant``: the weight unpacked into a bf16 scratch, a slice of
            rows at a time, for cuBLAS; at thousands of rows the unpacking is amortised over every row, and
            cuBLAS wins (the microbenchmark decides).

Each regime holds a ``QuantMatmulConfig`` per method (``LAUNCH_TABLE``). ``python -m benchmarks.quant_bench`` on
a GPU times every candidate of ``CANDIDATES`` at Qwen3-8B's layer shapes and prints the table its measurements
favour, ready to paste below. No triton import here: the tests check this arithmetic anywhere.
"""

from __future__ import annotations

from dataclasses import dataclass

KERNELS = ("gemv", "dot", "swap_ab", "dequant")
UNPACK_MODES = ("convert", "magic", "subnormal", "dp4a")  # gemv: nibbles to floats (QuantMatmulConfig)
GEMV_MAX_M = {"int8": 2, "int4": 4}  # rows of x up to which each method runs the gemv regime
SMALL_MAX_M = 16
LARGE_MAX_M = 512
MAX_SPLIT_K = 16
SWAP_AB_BLOCK_K = 128  # swap_ab's loop step: one int4 group (int8 takes the same width)


@dataclass(frozen=True)
class QuantMatmulConfig:
    """Launch parameters of one quantized matmul.

    ``kernel``: ``gemv`` (CUDA cores, streaming), ``dot`` (tensor cores, W's tile as their shared-memory
    operand), ``swap_ab`` (tensor cores, W's tile as their register operand; ``block_m`` the most rows of x a
    program takes, ``swap_ab_rows``) or ``dequant`` (scratch + cuBLAS).
    ``block_n`` / ``block_k``: output rows and inputs per program per loop step (int4: ``block_k`` is a multiple
    of the 128-input group); ``block_m``: rows of ``x`` per program for ``dot`` (``gemv`` uses M rounded up to a
    power of two). ``num_warps`` / ``num_stages``: Triton's threads per program and software-pipelining depth
    (loads of ``num_stages - 1`` later steps in flight while one is computed). ``group_m``: ``dot`` visits
    tiles in groups of this many row blocks so that a weight tile is reused from L2. ``unpack``: how ``gemv``
    turns int4 nibbles into floats: ``convert`` (int-to-float conversions, a quarter of an add's rate or less),
    ``magic`` (the integer written into the mantissa of 2^23: an OR and a subtraction), ``subnormal`` (the
    nibble's bits read as a float as they are, ``u * 2^-149``: no instruction at all; x is scaled up instead, and
    the -8 comes off the sum once per pair of inputs) or ``dp4a`` (no floats: x converted to 16-bit integers by a
    launch of its own, then four nibble-times-byte products an instruction, ``integer_dots.py``; a float32 x
    keeps ``subnormal``). int8 uses ``magic`` for the last three. ``defer_sum``: ``gemv`` keeps a partial sum
    per element across the loop and reduces across K once at the end (fewer shuffles, more registers: used only
    where it fits in 64 per thread) instead of a cross-thread reduction in every step.
    ``min_programs_per_sm``: ``gemv`` and ``swap_ab`` split K until the launch has at least this many programs
    per SM.
    """

    kernel: str = "gemv"
    block_m: int = 16
    block_n: int = 16
    block_k: int = 256
    num_warps: int = 4
    num_stages: int = 3
    group_m: int = 8
    unpack: str = "subnormal"
    defer_sum: bool = True
    min_programs_per_sm: int = 1

    def __post_init__(self) -> None:
        if self.kernel not in KERNELS:
            raise ValueError(f"kernel must be one of {', '.join(KERNELS)}, got {self.kernel!r}")
        if self.unpack not in UNPACK_MODES:
            raise ValueError(f"unpack must be one of {', '.join(UNPACK_MODES)}, got {self.unpack!r}")
        for name in ("block_m", "block_n", "block_k"):
            value = getattr(self, name)
            if value < 1 or value & (value - 1):
                raise ValueError(f"{name} must be a power of two, got {value}")
        if self.kernel in ("dot", "swap_ab") and min(self.block_m, self.block_n, self.block_k) < 16:
            raise ValueError("tl.dot needs block_m, block_n and block_k >= 16")
        if self.kernel == "swap_ab" and self.block_k != SWAP_AB_BLOCK_K:
            raise ValueError(f"swap_ab steps through K {SWAP_AB_BLOCK_K} inputs at a time (int4's group): "
                             f"block_k must be {SWAP_AB_BLOCK_K}, got {self.block_k}")
        if self.num_warps not in (1, 2, 4, 8, 16) or self.num_stages < 1 or self.group_m < 1:
            raise ValueError(f"bad launch parameters num_warps={self.num_warps} num_stages={self.num_stages} "
                             f"group_m={self.group_m}")


# A GEMV whose slices of K the kernel after it adds (``sliced_sums.py``) pays no finish for more of them: it cuts K
# until 3 programs an SM, not the table's 2 (q/k/v, o_proj and down_proj in 8 slices each at Qwen3-8B's shapes). On the
# H200 the step was as fast at one row and 34-43 µs faster at two, 67-74 at four; 1 an SM was slower at every row
# (results/h200/m13_step_times+slices-grid.json, +slices-grid-2.json: two calls).
SLICED_GEMV_PROGRAMS_PER_SM = 3


def regime(m: int, method: str) -> str:
    if m <= GEMV_MAX_M[method]:
        return "gemv"
    return "small" if m <= SMALL_MAX_M else "large" if m <= LARGE_MAX_M else "prefill"


# One configuration per method and regime. gemv: measured on the H200 at Qwen3-8B's five shapes, batch 1. int8
# (quant_bench --gemv-grid at 0c790fd, results/h200/quant_bench+gemv-grid.json): 8 rows x 512 inputs a step, 2 warps,
# 4 stages deep. int4 on tiles: the words kernel (on dp4a since results/h200/m13_step_times+dp4a-ab.json) with
# programs of 64 rows and 2 warps, 3 stages deep, and K cut into slices where N gives fewer than 2 such programs per
# SM (results/h200/int4_dp4a_grid.json: 117 launches at the five shapes, the step's 145 matmuls 1.570 ms against 1.653
# with the table before, one warp of 32 rows and 3 programs an SM, which subnormal's grids had chosen:
# int4_tiles_grid.json, int4_split_finish.json; a second grid around it, int4_dp4a_grid2.json, found nothing faster by
# more than 1%). The other regimes, from the full quant_bench (results/h200/quant_bench.json, batch 4 to 2,048): 16
# rows x 32 outputs x 256 inputs on the tensor cores at 3-16 rows (int4 at batch 16: 3.67 ms a step's matmuls, the
# config before 4.61, bf16 4.22), and beyond 512 rows the dequant path (at 2,048, 55 ms against the best tl.dot's
# 102). From 17 to 512 rows: swap_ab, 64 rows of W by up to 128 of x, K in slices for 2 programs an SM
# (results/h200/int4_wide.json, int4 per shape at 64 and 128 rows: q/k/v 24.9 and 32.8 us against the dequant path's
# 36.0 and 37.3, gate_up 58.7 and 77.0 against 148.1 and 157.3, down_proj 38.2 and 50.5 against 79.9 and 86.9, the LM
# head 292 and 401 against 916 and 974; bf16's cuBLAS 16.5, 52.6, 32.3, 311 at 64 rows; in the step,
# m13_step_times+swap-ab.json, int4 0.94x bf16 at 64 rows against 0.47x, int8 0.86x against 0.45x); from 17 rows, not
# 33, since calls 72-73 (quant_bench+small-swap-ab.json: at 32 rows int4's gate_up 43.0 us against the 16-row tile's
# 81.8, the LM head 228 against 477; m13_step_times+small-swap-ab.json, above). Compiled for sm_90
# (tests/compile_m13_for_gpu.py --registers): with bf16 or fp16 activations nothing spills (float32 ones spill in the
# tensor-core kernels, a path for tests, not for speed).
SMALL = QuantMatmulConfig("dot", block_m=16, block_n=32, block_k=256, num_warps=4, num_stages=4)
DEQUANT = QuantMatmulConfig("dequant", block_n=64, block_k=256, num_warps=4, num_stages=2)
SWAP_AB = QuantMatmulConfig("swap_ab", block_m=128, block_n=64, block_k=128, num_warps=4, num_stages=3,
                            min_programs_per_sm=2)
LAUNCH_TABLE: dict[str, dict[str, QuantMatmulConfig]] = {
    "int8": {
        "gemv": QuantMatmulConfig("gemv", block_n=8, block_k=512, num_warps=2, num_stages=4),
        "small": SMALL,
        "large": SWAP_AB,
        "prefill": DEQUANT,
    },
    "int4": {
        "gemv": QuantMatmulConfig("gemv", block_n=64, block_k=256, num_warps=2, num_stages=3,
                                  min_programs_per_sm=2, unpack="dp4a"),
        "small": SMALL,
        "large": SWAP_AB,
        "prefill": DEQUANT,
    },
}

# gate_up's GEMV where it writes down_proj's x as integers too (SiLU * up, ``epilogue_matmuls``): 256 rows of W a
# program, so that each group of 128 outputs is one program's, converted from registers, where the table's
# programs of 64 rows made a group in four, the last of which counted, read the group back and converted it. K in
# one slice: 96 programs of 4 warps, 4 stages deep. On the H200 gate_up's launch took 16.78 µs against 17.75
# (3 stages 18.00, 2 warps 23.52, 8 warps 19.06, K in 2 slices 18.54; 5 or 6 stages, 128- or 512-input steps no
# faster) and the batch-1 step 2.047 ms against 2.070, 2.43x bf16's against 2.40x (results/h200/
# int4_gate_up_whole_groups.json, int4_launch_grid.json, m13_step_times+whole-groups.json, +launch-grid.json).
SILU_WORDS_GEMV = QuantMatmulConfig("gemv", block_n=256, block_k=256, num_warps=4, num_stages=4, unpack="dp4a")


# The candidates of the two regimes with many rows (large batches, prompt chunks).
LARGE_CANDIDATES: dict[str, QuantMatmulConfig] = {
    "m64-n128-k128-w4-s3": QuantMatmulConfig("dot", block_m=64, block_n=128, block_k=128, num_warps=4,
                                             num_stages=3),
    "m128-n128-k64-w8-s3": QuantMatmulConfig("dot", block_m=128, block_n=128, block_k=64, num_warps=8,
                                             num_stages=3),
    "m128-n128-k128-w8-s3": QuantMatmulConfig("dot", block_m=128, block_n=128, block_k=128, num_warps=8,
                                              num_stages=3),
    "m128-n64-k128-w4-s4": QuantMatmulConfig("dot", block_m=128, block_n=64, block_k=128, num_warps=4,
                                             num_stages=4),
    "dequant + cuBLAS": QuantMatmulConfig("dequant", block_n=64, block_k=256, num_warps=4, num_stages=2),
    "swap_ab n64-m128-w4-s3": SWAP_AB,
    "swap_ab n128-m128-w8-s3": QuantMatmulConfig("swap_ab", block_m=128, block_n=128, block_k=128, num_warps=8,
                                                 num_stages=3, min_programs_per_sm=2),
}

# What benchmarks/quant_bench.py times: every candidate in its regime, for both methods (int4 needs block_k a
# multiple of 128; candidates that do not qualify for a method are skipped there).
CANDIDATES: dict[str, dict[str, QuantMatmulConfig]] = {
    "gemv": {
        "n16-k256-w4-s3": QuantMatmulConfig("gemv", block_n=16, block_k=256, num_warps=4, num_stages=3),
        "n16-k512-w4-s3": QuantMatmulConfig("gemv", block_n=16, block_k=512, num_warps=4, num_stages=3),
        "n8-k512-w4-s4": QuantMatmulConfig("gemv", block_n=8, block_k=512, num_warps=4, num_stages=4),
        "n32-k256-w8-s3": QuantMatmulConfig("gemv", block_n=32, block_k=256, num_warps=8, num_stages=3),
        "n16-k256-w4-s4 convert": QuantMatmulConfig("gemv", block_n=16, block_k=256, num_warps=4, num_stages=4,
                                                    unpack="convert"),
        "n16-k256-w4-s4 magic": QuantMatmulConfig("gemv", block_n=16, block_k=256, num_warps=4, num_stages=4,
                                                  unpack="magic"),
        "n16-k256-w4-s3 4/SM": QuantMatmulConfig("gemv", block_n=16, block_k=256, num_warps=4, num_stages=3,
                                                   min_programs_per_sm=4),
        "n16-k256-w4-s3 sum per step": QuantMatmulConfig("gemv", block_n=16, block_k=256, num_warps=4,
                                                         num_stages=3, defer_sum=False),
        "swap_ab n64-m128-w4-s3": SWAP_AB,  # the tensor cores at 1-4 rows, x padded to 16 rows
        "n32-k256-w1-s3 subnormal": QuantMatmulConfig("gemv", block_n=32, block_k=256, num_warps=1, num_stages=3,
                                                      min_programs_per_sm=3, unpack="subnormal"),
        "n32-k256-w1-s3 dp4a": QuantMatmulConfig("gemv", block_n=32, block_k=256, num_warps=1, num_stages=3,
                                                 min_programs_per_sm=3, unpack="dp4a"),
    },
    "small": {
        "swap_ab n64-m128-w4-s3": SWAP_AB,  # x's rows padded to 16 (to 32 past 16 rows)
        "gemv n32-k256-w1-s3 dp4a": QuantMatmulConfig("gemv", block_n=32, block_k=256, num_warps=1, num_stages=3,
                                                      min_programs_per_sm=3, unpack="dp4a"),  # 4 rows a launch
        "m16-n64-k128-w4-s4": QuantMatmulConfig("dot", block_m=16, block_n=64, block_k=128, num_warps=4,
                                                num_stages=4),
        "m16-n128-k128-w4-s3": QuantMatmulConfig("dot", block_m=16, block_n=128, block_k=128, num_warps=4,
                                                 num_stages=3),
        "m16-n32-k256-w4-s4": QuantMatmulConfig("dot", block_m=16, block_n=32, block_k=256, num_warps=4,
                                                num_stages=4),
        "m32-n64-k128-w4-s4": QuantMatmulConfig("dot", block_m=32, block_n=64, block_k=128, num_warps=4,
                                                num_stages=4),
    },
    "large": LARGE_CANDIDATES,
    "prefill": LARGE_CANDIDATES,  # the same candidates, timed at prompt-chunk sizes
}


def fits_method(config: QuantMatmulConfig, method: str) -> bool:
    """int4 unpacks whole 128-input groups: its ``block_k`` must be a multiple of 128."""
    return method == "int8" or config.block_k % 128 == 0


def swap_ab_rows(m: int, config: QuantMatmulConfig) -> int:
    """``swap_ab``: rows of x a program takes: ``M`` rounded up to a power of two (at least 16, tl.dot's least),
    at most ``block_m``; 17-32 rows take 32, 33-64 take 64, beyond that ``block_m``."""
    return min(config.block_m, max(16, 1 << (m - 1).bit_length()))


def choose_split_k(m: int, n: int, k: int, num_sms: int, config: QuantMatmulConfig) -> int:
    """``gemv``: slices of K, so that ``cdiv(N, block_n) * split_k`` reaches ``min_programs_per_sm`` per SM.
    ``swap_ab`` likewise over its ``cdiv(M, swap_ab_rows) * cdiv(N, block_n)`` programs (its loop steps are 128
    inputs wide: an int4 group); there each slice's float32 sums go to a plane of their own, added by one more
    launch after the kernel.

    int4's words kernel runs programs of 64 rows and 2 warps, and a program that streams needs company on its SM
    to keep enough loads in flight. Qwen3-8B on an H200 (132 SMs): q/k/v has 96 such programs, o_proj and
    down_proj 64, gate_up 384, the LM head 2,374; at 2 per SM, q/k/v asks for 3 slices, o_proj and down_proj for
    5. The slices are equal: the count is rounded up to one that divides K's loop steps (q/k/v's 16 steps in 4
    slices of 4, not in 6 + 6 + 4, whose launch lasts as long as its longest slices; o_proj's 16 in 8, down_proj's
    48 in 6). A split costs a float32 write of each slice's sums and, per row block, one program that adds them
    (the kernel's ``SPLIT``): no launch of its own. No programs at all (an empty M or N): no slices.
    """
    if config.kernel == "swap_ab":
        programs = -(-m // swap_ab_rows(m, config)) * -(-n // config.block_n)
    elif config.kernel == "gemv":
        programs = -(-n // config.block_n)
    else:
        return 1
    if programs == 0:
        return 1
    wanted = -(-config.min_programs_per_sm * num_sms // programs)
    steps = k // config.block_k
    most = max(1, min(steps, MAX_SPLIT_K))
    wanted = max(1, min(wanted, most))
    return next((s for s in range(wanted, most + 1) if steps % s == 0), wanted)


def choose_launch(method: str, m: int, n: int, k: int, num_sms: int,
                  table: dict[str, dict[str, QuantMatmulConfig]] = LAUNCH_TABLE) -> tuple[QuantMatmulConfig, int]:
    """``(config, split_k)`` of one launch: the table's entry for ``M``'s regime, and its slices of K."""
    config = table[method][regime(m, method)]
    return config, choose_split_k(m, n, k, num_sms, config)
