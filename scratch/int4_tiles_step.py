"""The batch-1 and batch-4 decode step on qwen3-8b-random: bf16, int4 in tiles (the engine now) and int4 in packed
rows (tile_int4 patched out while that engine loads), in interleaved rounds (quant_step). One GPU call."""

from __future__ import annotations

import sys

import benchmarks.quant_step as quant_step
from milestones.m13_quantization import quantize

table_build = quant_step.build


def build(mode, args):
    if mode != "int4-rows":
        return table_build(mode, args)
    tile = quantize.tile_int4
    quantize.tile_int4 = lambda packed: packed  # QuantizedLinear keeps the packed rows
    try:
        return table_build(mode, args)
    finally:
        quantize.tile_int4 = tile


if __name__ == "__main__":
    quant_step.MODES["int4-rows"] = {"quantization": "int4"}
    quant_step.build = build
    quant_step.main(["--modes", "bf16,int4,int4-rows", "--batches", "1,4", "--rounds", "5",
                     "--out", sys.argv[1] if len(sys.argv) > 1 else "m13_step_times+tiles-ab.json"])
