"""One GPU call: the dp4a GEMV converting its int32 sums to float four words at a time (``DP4A_WORDS_PER_FLOAT``
4: one conversion per 32 weights) against one word at a time (1: m13 before), and down_proj's integers written
by SiLU * up's GEMV at up to 4 rows (``SILU_WORDS_MAX_ROWS``) now that a program makes a whole group.

Part 1: each batch-1 launch as the step makes it, 36 over distinct weights in one CUDA graph (the LM head 8), 5
interleaved rounds, µs a launch, with 1 and 4 words a conversion. Part 2: the step (quant_step, 5 interleaved
rounds, 512 keys) at 1, 2 and 4 rows: bf16, int4 (m13 now: 4 words, a group a program), int4-convert-each (1
word), int4-words-4-rows (SILU_WORDS_MAX_ROWS 4).

    python3 scratch/words_per_float_ab.py OUT_DIR
"""

from __future__ import annotations

import json
import statistics
import sys

import torch

import benchmarks.quant_step as quant_step
from benchmarks.env import environment
from milestones.m13_quantization import epilogue_layers, epilogue_matmuls, integer_dots, matmul_kernels
from milestones.m13_quantization.quantize import group_major, tile_int4

ROUNDS, REPLAYS = 5, 10
SHAPES = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (24576, 4096), "down": (4096, 12288),
          "lm_head": (151936, 4096)}


def graph_of(launches) -> torch.cuda.CUDAGraph:
    for launch in launches:
        launch()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for launch in launches:
            launch()
    return graph


def as_the_step(shape, x, words):
    if shape in ("qkv", "o", "down"):
        return lambda w, s: epilogue_matmuls.quantized_matmul_slices(x, w, s, "int4", x_words=words)
    if shape == "gate_up":
        return lambda w, s: epilogue_matmuls.quantized_silu_and_mul_int16(x, w, s, "int4", x_words=words)
    return lambda w, s: matmul_kernels.quantized_matmul(x, w, s, "int4", x_words=words)


def launches_alone() -> dict:
    torch.manual_seed(0)
    result = {}
    for shape, (n, k) in SHAPES.items():
        launches = 8 if shape == "lm_head" else 36
        x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
        words = integer_dots.int16_x(x)
        weights = [(tile_int4(torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, device="cuda")),
                    group_major(torch.rand(n, k // 128, device="cuda") * 0.02 + 0.001)) for _ in range(launches)]
        launch = as_the_step(shape, x, words)
        graphs, outputs = {}, {}
        for summed in (1, 4):  # compiled with the constant when the graph is captured
            matmul_kernels.DP4A_WORDS_PER_FLOAT = summed
            graphs[summed] = graph_of([lambda w=w, s=s: launch(w, s) for w, s in weights])
            out = launch(*weights[0])
            outputs[summed] = getattr(out, "x", getattr(out, "parts", out)).float()
        matmul_kernels.DP4A_WORDS_PER_FLOAT = 4
        a, b = outputs[1], outputs[4]
        rel = float((a - b).norm() / a.norm())
        times = {summed: [] for summed in graphs}
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        for _ in range(ROUNDS):
            for summed, graph in graphs.items():
                graph.replay()
                start.record()
                for _ in range(REPLAYS):
                    graph.replay()
                end.record()
                end.synchronize()
                times[summed].append(start.elapsed_time(end) * 1000 / (REPLAYS * launches))
        medians = {summed: statistics.median(v) for summed, v in times.items()}
        print(f"{shape:8} 1 word a float {medians[1]:6.2f} us ({min(times[1]):.2f}-{max(times[1]):.2f})   4 words "
              f"{medians[4]:6.2f} us ({min(times[4]):.2f}-{max(times[4]):.2f})   relative difference of the outputs "
              f"{rel:.2e}", flush=True)
        result[shape] = {"n": n, "k": k, "launches": launches, "us": times, "median_us": medians,
                         "relative_difference": rel}
        del graphs, weights
        torch.cuda.empty_cache()
    return result


def main(out_dir: str) -> None:
    result = {"name": "int4_words_per_float", "env": environment("cuda"), "rounds": ROUNDS, "replays": REPLAYS,
              "batch": 1, "shapes": launches_alone()}
    with open(f"{out_dir}/int4_words_per_float.json", "w") as f:
        json.dump(result, f, indent=1, default=str)
    plain_build = quant_step.build

    def build(mode, args):
        try:  # the graphs record the launches they capture
            matmul_kernels.DP4A_WORDS_PER_FLOAT = 1 if mode == "int4-convert-each" else 4
            epilogue_layers.SILU_WORDS_MAX_ROWS = 4 if mode == "int4-words-4-rows" else 1
            return plain_build(mode, args)
        finally:
            matmul_kernels.DP4A_WORDS_PER_FLOAT, epilogue_layers.SILU_WORDS_MAX_ROWS = 4, 1

    for mode in ("int4-convert-each", "int4-words-4-rows"):
        quant_step.MODES.setdefault(mode, quant_step.MODES["int4"])
    quant_step.build = build
    quant_step.main(["--modes", "bf16,int4-convert-each,int4,int4-words-4-rows", "--batches", "1,2,4",
                     "--rounds", "5", "--out", f"{out_dir}/m13_step_times_words_per_float.json"])


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else ".")
