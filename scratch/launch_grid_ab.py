"""One GPU call: a grid around the batch-1 launches m13's step makes, then the step with the fastest.

Part 1: gate_up (SiLU * up writing down_proj's integers, a whole group a program: 256 rows of W) at more stages
and other loop steps. Part 2: q/k/v, o_proj and down_proj leaving their slices of K (as the step launches them),
around the table (64 rows, 2 warps, 3 stages, K cut until 3 programs an SM). Each: 36 launches over distinct weights
in one CUDA graph, 5 interleaved rounds, µs a launch. Part 3: the batch-1 and -2 step (quant_step, 5 interleaved
rounds, 512 keys): bf16, int4 (the table), int4 with part 1's fastest gate_up, and with part 2's fastest too.

    python3 scratch/launch_grid_ab.py OUT_DIR
"""

from __future__ import annotations

import functools
import json
import statistics
import sys
from dataclasses import replace

import torch

import benchmarks.quant_step as quant_step
from benchmarks.env import environment
from milestones.m13_quantization import epilogue_layers, epilogue_matmuls, integer_dots
from milestones.m13_quantization.launch_config import LAUNCH_TABLE, SLICED_GEMV_PROGRAMS_PER_SM
from milestones.m13_quantization.quantize import group_major, tile_int4

LAUNCHES, ROUNDS, REPLAYS = 36, 5, 10
TABLE = LAUNCH_TABLE["int4"]["gemv"]
SLICED = replace(TABLE, min_programs_per_sm=SLICED_GEMV_PROGRAMS_PER_SM)
WHOLE = replace(TABLE, block_n=256, num_warps=4, num_stages=4)  # call 113's fastest
GATE_UP = {  # name: (config, slices of K)
    "n256-w4-s4 (call 113)": (WHOLE, 1),
    "n256-w4-s5": (replace(WHOLE, num_stages=5), 1),
    "n256-w4-s6": (replace(WHOLE, num_stages=6), 1),
    "n256-w4-k128-s6": (replace(WHOLE, block_k=128, num_stages=6), 1),
    "n256-w4-k128-s8": (replace(WHOLE, block_k=128, num_stages=8), 1),
    "n256-w4-k512-s3": (replace(WHOLE, block_k=512, num_stages=3), 1),
    "n256-w8-s4": (replace(WHOLE, num_warps=8), 1),
    "n256-w8-s6": (replace(WHOLE, num_warps=8, num_stages=6), 1),
}
SLICES = {
    "table (n64-w2-s3-p3)": SLICED,
    "n64-w2-s4-p3": replace(SLICED, num_stages=4),
    "n64-w2-s5-p3": replace(SLICED, num_stages=5),
    "n64-w2-s4-p2": replace(SLICED, num_stages=4, min_programs_per_sm=2),
    "n64-w2-s4-p4": replace(SLICED, num_stages=4, min_programs_per_sm=4),
    "n64-w4-s4-p3": replace(SLICED, num_warps=4, num_stages=4),
    "n128-w4-s4-p3": replace(SLICED, block_n=128, num_warps=4, num_stages=4),
    "n128-w4-s4-p2": replace(SLICED, block_n=128, num_warps=4, num_stages=4, min_programs_per_sm=2),
    "n32-w1-s4-p3": replace(SLICED, block_n=32, num_warps=1, num_stages=4),
    "n64-w2-k128-s6-p3": replace(SLICED, block_k=128, num_stages=6),
}
SHAPES = {"qkv": (6144, 4096), "o": (4096, 4096), "down": (4096, 12288)}


def graph_of(launches) -> torch.cuda.CUDAGraph:
    for launch in launches:
        launch()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for launch in launches:
            launch()
    return graph


def timed(variants: dict) -> dict:
    graphs = {name: graph_of(launch_list) for name, launch_list in variants.items()}
    times = {name: [] for name in graphs}
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(ROUNDS):
        for name, graph in graphs.items():
            graph.replay()
            start.record()
            for _ in range(REPLAYS):
                graph.replay()
            end.record()
            end.synchronize()
            times[name].append(start.elapsed_time(end) * 1000 / (REPLAYS * LAUNCHES))
    return times


def weights_of(n: int, k: int):
    return [(tile_int4(torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, device="cuda")),
             group_major(torch.rand(n, k // 128, device="cuda") * 0.02 + 0.001)) for _ in range(LAUNCHES)]


def report(label: str, times: dict) -> dict:
    medians = {name: statistics.median(v) for name, v in times.items()}
    for name, us in medians.items():
        print(f"{label:8} {name:24} {us:6.2f} us ({min(times[name]):.2f}-{max(times[name]):.2f})", flush=True)
    return medians


def main(out_dir: str) -> None:
    torch.manual_seed(0)
    result = {"name": "int4_launch_grid", "env": environment("cuda"), "launches": LAUNCHES, "rounds": ROUNDS,
              "replays": REPLAYS, "batch": 1, "shapes": {}}
    x = torch.randn(1, 4096, device="cuda", dtype=torch.bfloat16)
    words = integer_dots.int16_x(x)
    weights = weights_of(24576, 4096)
    silu_words = epilogue_matmuls.quantized_silu_and_mul_int16
    times = timed({name: [lambda w=w, s=s, c=c, k=split: silu_words(x, w, s, "int4", config=c, split_k=k,
                                                                    x_words=words) for w, s in weights]
                   for name, (c, split) in GATE_UP.items()})
    medians = report("gate_up", times)
    result["shapes"]["gate_up"] = {"n": 24576, "k": 4096, "us": times, "median_us": medians,
                                   "configs": {name: [vars(c), s] for name, (c, s) in GATE_UP.items()}}
    gate_up_best = min(GATE_UP, key=medians.get)
    del weights
    torch.cuda.empty_cache()
    slice_best = {}
    for shape, (n, k) in SHAPES.items():
        xs = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
        xs_words = integer_dots.int16_x(xs)
        weights = weights_of(n, k)
        times = timed({name: [lambda w=w, s=s, c=c: epilogue_matmuls.quantized_matmul_slices(
            xs, w, s, "int4", config=c, x_words=xs_words) for w, s in weights] for name, c in SLICES.items()})
        medians = report(shape, times)
        result["shapes"][shape] = {"n": n, "k": k, "us": times, "median_us": medians}
        slice_best[(n, k)] = SLICES[min(SLICES, key=medians.get)]
        print(f"{shape}: fastest {min(SLICES, key=medians.get)}", flush=True)
        del weights
        torch.cuda.empty_cache()
    result["configs"] = {name: vars(c) for name, c in SLICES.items()}
    result["chosen"] = {"gate_up": gate_up_best, **{f"{n}x{k}": vars(c) for (n, k), c in slice_best.items()}}
    with open(f"{out_dir}/int4_launch_grid.json", "w") as f:
        json.dump(result, f, indent=1, default=str)

    gate_config, gate_split = GATE_UP[gate_up_best]
    print(f"step: int4-gate-up with {gate_up_best}; int4-grid with it and {result['chosen']}", flush=True)
    table_silu = epilogue_layers.quantized_silu_and_mul_int16
    table_slices_layers, table_slices = epilogue_layers.quantized_matmul_slices, epilogue_matmuls.quantized_matmul_slices

    @functools.wraps(table_slices)
    def grid_slices(x, qweight, scales, method, *, config=None, split_k=None, x_words=None):
        if config is None:
            config = slice_best.get((qweight.shape[0] * (16 if qweight.dim() == 4 else 1), x.shape[1]))
        return table_slices(x, qweight, scales, method, config=config, split_k=split_k, x_words=x_words)

    plain_build = quant_step.build

    def build(mode, args):
        try:  # the graphs record the launches they capture
            if mode in ("int4-gate-up", "int4-grid"):
                epilogue_layers.quantized_silu_and_mul_int16 = functools.partial(table_silu, config=gate_config,
                                                                                 split_k=gate_split)
            if mode == "int4-grid":
                epilogue_layers.quantized_matmul_slices = epilogue_matmuls.quantized_matmul_slices = grid_slices
            return plain_build(mode, args)
        finally:
            epilogue_layers.quantized_silu_and_mul_int16 = table_silu
            epilogue_layers.quantized_matmul_slices, epilogue_matmuls.quantized_matmul_slices = (table_slices_layers,
                                                                                                 table_slices)

    for mode in ("int4-gate-up", "int4-grid"):
        quant_step.MODES.setdefault(mode, quant_step.MODES["int4"])
    quant_step.build = build
    quant_step.main(["--modes", "bf16,int4,int4-gate-up,int4-grid", "--batches", "1,2", "--rounds", "5",
                     "--out", f"{out_dir}/m13_step_times_launch_grid.json"])


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else ".")
