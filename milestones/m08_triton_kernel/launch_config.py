"""How the decode kernel is launched: its configurations, one per regime, and how many slices to cut keys into.

A decode launch is in one of two regimes, decided from shapes and Python ints only (never tensor values):

    direct   batch * kv_heads programs already fill the GPU: one program per (sequence, K/V head)
    split    too few programs (small batch): each sequence's keys are cut into slices, one program each,
             and a second kernel combines the slices (flash-decoding)

Each regime has its own best tile size, warps and pipelining depth, so ``LAUNCH_TABLE`` holds one
``DecodeKernelConfig`` per regime, chosen from a sweep of candidates on the H200 (``kernel_bench.py
--autotune-sweep`` at commit 0c790fd, retired since; docs/m08-triton-kernel.md cites its results).
No triton import here: this is plain arithmetic the tests can check anywhere.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

MAX_SPLITS = 64  # partial results per (sequence, head); the combine kernel holds them all in registers
INTERPRETER_SM_COUNT = 8  # what the split heuristic assumes on the CPU (any value is correct, only speed differs)


@dataclass(frozen=True)
class DecodeKernelConfig:
    """Launch parameters of the decode kernel (``tests/decode_configs.py`` lists the candidates the sweep compared).

    ``tile_tokens`` keys per loop iteration (a power of two >= 16: several pages, so many loads are in flight);
    ``num_warps`` / ``num_stages`` Triton's threads per program and software-pipelining depth;
    ``programs_per_sm`` the split heuristic's target of programs per SM; ``min_tiles_per_split`` the least work
    a split is worth; ``dot_in_fp32`` upcasts 16-bit K/V tiles and runs the dots in tf32 (exact for bf16/fp16
    inputs) instead of on bf16/fp16 tensor cores.
    """

    tile_tokens: int = 64
    num_warps: int = 4
    num_stages: int = 3
    programs_per_sm: int = 3
    min_tiles_per_split: int = 2
    dot_in_fp32: bool = False

    def __post_init__(self) -> None:
        if self.tile_tokens < 16 or self.tile_tokens & (self.tile_tokens - 1):
            raise ValueError(f"tile_tokens must be a power of two >= 16, got {self.tile_tokens}")
        if self.num_warps not in (1, 2, 4, 8, 16) or self.num_stages < 1:
            raise ValueError(f"bad launch parameters num_warps={self.num_warps} num_stages={self.num_stages}")
        if self.programs_per_sm < 1 or self.min_tiles_per_split < 1:
            raise ValueError("programs_per_sm and min_tiles_per_split must be >= 1")


DEFAULT_CONFIG = DecodeKernelConfig()

# One configuration per regime (benchmarks/KERNEL_NOTES.md, section 9, has the measurements behind them).
# ``programs_per_sm`` is each configuration's occupancy on an H200 (Triton 3.6, bf16, head_dim 128), so the
# split heuristic fills exactly one wave; only the split entry's value is ever used by the heuristic.
LAUNCH_TABLE: dict[str, DecodeKernelConfig] = {
    # What the H200 sweep favours where batches fill the GPU: at 64 x 2,048, 0.138 ms against 0.160 for t64-w4-s3
    # (one K/V buffer, but 4 programs per SM); equal at 256 x 2,048.
    "direct": DecodeKernelConfig(tile_tokens=64, num_warps=4, num_stages=2, programs_per_sm=4),
    # The design default: the sweep's small-batch times were mostly launch overhead, so they chose nothing here.
    "split": DecodeKernelConfig(tile_tokens=64, num_warps=4, num_stages=3, programs_per_sm=3),
}

# A float8 cache (m13) halves the bytes of a tile but not the work of one loop iteration (the block-table
# addresses, the widening to fp16, the dots): with 64 keys an iteration its loop issued 5.9 instructions per
# byte it read against 2.1 for bf16 (sm_90 assembly), and on the H200 the kernel read 1.7 TB/s where bf16's
# read 3.9 (results/h200/step_probe_m13+fp8-kv.json). Twice the keys an iteration: 4.1 per byte. A third
# stage keeps one more tile in flight: one layer at 176 x 1,024 and 64 x 2,048 keys read 2.35 and 2.62 TB/s
# against 2.22 and 2.20 with two (results/h200/fp8_decode_sweep.json, fp8_dot_sweep.json: two calls agree).
# Those are the byte loads of then. Read as 16-bit words (ldmatrix, as bf16) and widened in PTX, the same launches
# issue 2.5 instructions a byte (4.4 and 4.2 before; registers 142 and 145 against 190 and 201); 64 keys an
# iteration 3.5-3.6, 8 warps 3.6-3.7, 256 keys 2.4 at 202 registers (sm_90 assembly; not yet timed on a GPU).
FP8_LAUNCH_TABLE: dict[str, DecodeKernelConfig] = {
    "direct": DecodeKernelConfig(tile_tokens=128, num_warps=4, num_stages=3, programs_per_sm=2),
    "split": DecodeKernelConfig(tile_tokens=128, num_warps=4, num_stages=2, programs_per_sm=3),
}


_SM_COUNTS: dict[int, int] = {}


def sm_count(device: torch.device) -> int:
    """Streaming multiprocessors of ``device`` (cached: the wrapper must not query the driver every call)."""
    if device.type != "cuda":
        return INTERPRETER_SM_COUNT
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _SM_COUNTS:
        _SM_COUNTS[index] = torch.cuda.get_device_properties(index).multi_processor_count
    return _SM_COUNTS[index]


def choose_num_splits(batch: int, num_kv_heads: int, max_context_len: int, num_sms: int,
                      config: DecodeKernelConfig = DEFAULT_CONFIG) -> int:
    """How many slices to cut each sequence's keys into so that one wave of programs fills the GPU.

    ``batch * num_kv_heads`` programs exist without splitting; an SM runs about ``config.programs_per_sm`` of
    them at once (what its registers and shared memory allow), so split into as many slices as still fit in
    one such wave, but never into slices shorter than ``config.min_tiles_per_split`` tiles (each program's
    fixed cost and the combine step must stay small next to the keys it streams).
    Qwen3-0.6B on an H200 (132 SMs, 8 K/V heads, default config: 396 programs in flight): batch >= 50 -> 1
    split; batch 16 -> 3; batch 1 at 2,048 keys -> 16 splits of 128 keys, at 8,192 keys -> 49.
    """
    programs = batch * num_kv_heads
    one_wave = config.programs_per_sm * num_sms // programs
    worth = -(-max_context_len // config.tile_tokens) // config.min_tiles_per_split
    return max(1, min(one_wave, worth, MAX_SPLITS))


def choose_launch(batch: int, num_kv_heads: int, max_context_len: int, num_sms: int,
                  table: dict[str, DecodeKernelConfig] = LAUNCH_TABLE) -> tuple[DecodeKernelConfig, int]:
    """``(config, num_splits)`` of one launch: the split regime if the split entry's heuristic cuts the keys
    into more than one slice, else the direct entry with one slice."""
    num_splits = choose_num_splits(batch, num_kv_heads, max_context_len, num_sms, table["split"])
    if num_splits > 1:
        return table["split"], num_splits
    return table["direct"], 1
