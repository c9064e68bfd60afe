"""One GPU call: gate_up's GEMV with SiLU * up writing down_proj's integers, each group of 128 outputs made by one
program (256 rows of W: ``WORDS_HERE``, the words from registers) against four programs of 64 rows, the last of
which counts, reads the group back and converts it (m13's table). Call 112 put that chain at 1.5 µs a launch.

Part 1: gate_up's launch alone, 36 launches over distinct weights in one CUDA graph, 5 interleaved rounds, µs a
launch, for a few launches of 256 rows (warps, stages, K in one or two slices). Part 2: the batch-1 and -2 step
(quant_step, 5 interleaved rounds, 512 keys), bf16, int4 and int4 with the fastest of part 1 while the graphs are
captured.

    python3 scratch/silu_whole_groups_ab.py OUT_DIR
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
from milestones.m13_quantization.launch_config import LAUNCH_TABLE
from milestones.m13_quantization.quantize import group_major, tile_int4

N, K, LAUNCHES, ROUNDS, REPLAYS = 24576, 4096, 36, 5, 10
TABLE = LAUNCH_TABLE["int4"]["gemv"]
CANDIDATES = {  # name: (config, slices of K)
    "n256-w4-s3": (replace(TABLE, block_n=256, num_warps=4, num_stages=3), 1),
    "n256-w4-s4": (replace(TABLE, block_n=256, num_warps=4, num_stages=4), 1),
    "n256-w2-s3": (replace(TABLE, block_n=256, num_warps=2, num_stages=3), 1),
    "n256-w8-s3": (replace(TABLE, block_n=256, num_warps=8, num_stages=3), 1),
    "n256-w4-s3-k2": (replace(TABLE, block_n=256, num_warps=4, num_stages=3), 2),
    "n256-w8-s3-k2": (replace(TABLE, block_n=256, num_warps=8, num_stages=3), 2),
}


def graph_of(launches) -> torch.cuda.CUDAGraph:
    for launch in launches:
        launch()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for launch in launches:
            launch()
    return graph


def launches_alone(out_dir: str) -> dict:
    torch.manual_seed(0)
    x = torch.randn(1, K, device="cuda", dtype=torch.bfloat16)
    words = integer_dots.int16_x(x)
    weights = [(tile_int4(torch.randint(0, 256, (N, K // 2), dtype=torch.uint8, device="cuda")),
                group_major(torch.rand(N, K // 128, device="cuda") * 0.02 + 0.001)) for _ in range(LAUNCHES)]
    silu_words = epilogue_matmuls.quantized_silu_and_mul_int16
    variants = {"table (4 programs a group)": [lambda w=w, s=s: silu_words(x, w, s, "int4", x_words=words)
                                               for w, s in weights],
                "table, SiLU * up only": [
                    lambda w=w, s=s: epilogue_matmuls.quantized_silu_and_mul(x, w, s, "int4", x_words=words)
                    for w, s in weights]}
    reference = silu_words(x, *weights[0], "int4", x_words=words)
    same = {}
    for name, (config, split) in CANDIDATES.items():
        variants[name] = [lambda w=w, s=s, c=config, k=split: silu_words(x, w, s, "int4", config=c, split_k=k,
                                                                         x_words=words) for w, s in weights]
        got = silu_words(x, *weights[0], "int4", config=config, split_k=split, x_words=words)
        same[name] = bool(torch.equal(got.x, reference.x) and torch.equal(got.words, reference.words)
                          and torch.equal(got.words, integer_dots.int16_x(got.x)))
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
    medians = {name: statistics.median(v) for name, v in times.items()}
    for name, us in medians.items():
        print(f"gate_up {name:28} {us:6.2f} us ({min(times[name]):.2f}-{max(times[name]):.2f})"
              f"{'' if name not in same else '  same outputs and words: ' + str(same[name])}", flush=True)
    result = {"name": "int4_gate_up_whole_groups", "env": environment("cuda"), "n": N, "k": K, "launches": LAUNCHES,
              "rounds": ROUNDS, "replays": REPLAYS, "batch": 1,
              "candidates": {name: {"config": vars(c), "split_k": s} for name, (c, s) in CANDIDATES.items()},
              "same_as_table": same, "us": times, "median_us": medians}
    with open(f"{out_dir}/int4_gate_up_whole_groups.json", "w") as f:
        json.dump(result, f, indent=1, default=str)
    del graphs, weights, variants
    torch.cuda.empty_cache()
    return result


def main(out_dir: str) -> None:
    alone = launches_alone(out_dir)
    fastest = min(CANDIDATES, key=lambda name: alone["median_us"][name])
    config, split = CANDIDATES[fastest]
    print(f"step: int4-whole-groups with {fastest}", flush=True)
    table_call = epilogue_layers.quantized_silu_and_mul_int16
    whole_call = functools.partial(table_call, config=config, split_k=split)
    plain_build = quant_step.build

    def build(mode, args):
        try:  # the graphs record the launches they capture
            if mode == "int4-whole-groups":
                epilogue_layers.quantized_silu_and_mul_int16 = whole_call
            return plain_build(mode, args)
        finally:
            epilogue_layers.quantized_silu_and_mul_int16 = table_call

    quant_step.MODES.setdefault("int4-whole-groups", quant_step.MODES["int4"])
    quant_step.build = build
    quant_step.main(["--modes", "bf16,int4,int4-whole-groups", "--batches", "1,2", "--rounds", "5",
                     "--out", f"{out_dir}/m13_step_times_whole_groups.json"])


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else ".")
