"""One GPU call: where the batch-1 GEMVs' 174 µs over a stream of their bytes (call 108) are, shape by shape.

Each of Qwen3-8B's five batch-1 matmuls, launched as m13's step launches it (q/k/v, o_proj and down_proj leaving
their slices of K, gate_up with SiLU * up writing down_proj's integers, the LM head plain; x already integers),
36 launches over distinct weights in one CUDA graph (the head 8), against the same graph with each launch
replaced by ``gemv_floor_in_step.py``'s kernel that only streams the launch's weight words and scales, and
gate_up without its epilogue beside them; 5 interleaved rounds, µs a launch.

    python3 scratch/gemv_vs_stream.py OUT_DIR [SHAPES]     (call 109: all five; call 110: gate_up and down, with
                                                             SiLU * up alone; call 111 also ADJACENT_ROWS=1)
"""

from __future__ import annotations

import json
import os
import statistics
import sys

import torch
import triton
import triton.language as tl

from benchmarks.env import environment
from milestones.m13_quantization import epilogue_matmuls, integer_dots, matmul_kernels
from milestones.m13_quantization.quantize import group_major, tile_int4
from scratch.gemv_floor_in_step import StreamInstead

SHAPES = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (24576, 4096), "down": (4096, 12288),
          "lm_head": (151936, 4096)}
PER_STEP = {"qkv": 36, "o": 36, "gate_up": 36, "down": 36, "lm_head": 1}
ROUNDS, REPLAYS = 5, 10
# ADJACENT_ROWS=1 (call 111): gate_up's programs read W's rows 2i and 2i + 1 as each output's gate and up, not rows
# i and N + i: the same loads and arithmetic in contiguous rows (wrong outputs: a timing question only). Set before
# anything compiles the GEMV, so that it compiles with these rows.
ADJACENT = os.environ.get("ADJACENT_ROWS") == "1"


@triton.jit
def adjacent_rows(lanes, N):
    return lanes, lanes < 2 * N


if ADJACENT:
    matmul_kernels.pair_rows = adjacent_rows


def as_the_step(shape, x, words):
    if shape in ("qkv", "o", "down"):
        return lambda w, s: epilogue_matmuls.quantized_matmul_slices(x, w, s, "int4", x_words=words)
    if shape == "gate_up":
        return lambda w, s: epilogue_matmuls.quantized_silu_and_mul_int16(x, w, s, "int4", x_words=words)
    return lambda w, s: matmul_kernels.quantized_matmul(x, w, s, "int4", x_words=words)


def graph_of(launches) -> torch.cuda.CUDAGraph:
    for launch in launches:
        launch()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for launch in launches:
            launch()
    return graph


def main(out_dir: str, shapes: list[str]) -> None:
    torch.manual_seed(0)
    result = {"name": "int4_gemv_vs_stream", "env": environment("cuda"), "rounds": ROUNDS, "replays": REPLAYS,
              "adjacent_rows": ADJACENT, "shapes": {}}
    stream = StreamInstead()
    for shape in shapes:
        n, k = SHAPES[shape]
        launches = 8 if shape == "lm_head" else 36
        x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
        words = integer_dots.int16_x(x)
        weights = [(tile_int4(torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, device="cuda")),
                    group_major(torch.rand(n, k // 128, device="cuda") * 0.02 + 0.001)) for _ in range(launches)]
        step_launch = as_the_step(shape, x, words)
        variants = {"gemv": [lambda w=w, s=s: step_launch(w, s) for w, s in weights],
                    "stream": [lambda w=w, s=s: stream.launch(x, w, s) for w, s in weights]}
        if shape == "gate_up":
            variants["gemv, SiLU * up only"] = [
                lambda w=w, s=s: epilogue_matmuls.quantized_silu_and_mul(x, w, s, "int4", x_words=words)
                for w, s in weights]
            variants["gemv, no epilogue"] = [
                lambda w=w, s=s: matmul_kernels.quantized_matmul(x, w, s, "int4", x_words=words) for w, s in weights]
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
                times[name].append(start.elapsed_time(end) * 1000 / (REPLAYS * launches))
        medians = {name: statistics.median(v) for name, v in times.items()}
        nbytes = weights[0][0].numel() + weights[0][1].numel() * 4
        result["shapes"][shape] = {"n": n, "k": k, "launches": launches, "bytes": nbytes, "us": times,
                                   "median_us": medians}
        print(f"{shape:8} " + "  ".join(f"{name} {us:6.2f} us ({nbytes / us / 1e6:.2f} TB/s)"
                                       for name, us in medians.items())
              + f"  gemv over stream {medians['gemv'] - medians['stream']:.2f} us, x{PER_STEP[shape]} a step "
              f"{PER_STEP[shape] * (medians['gemv'] - medians['stream']):.0f} us", flush=True)
        del graphs, weights, variants
        torch.cuda.empty_cache()
    total = {name: sum(PER_STEP[s] * r["median_us"][name] for s, r in result["shapes"].items())
             for name in ("gemv", "stream")}
    result["step_matmuls_us"] = total
    print(f"the matmuls of a step ({', '.join(shapes)}): gemv {total['gemv']:.0f} us, stream {total['stream']:.0f} us",
          flush=True)
    with open(f"{out_dir}/int4_gemv_vs_stream_{len(shapes)}{'_adjacent' if ADJACENT else ''}.json", "w") as f:
        json.dump(result, f, indent=1, default=str)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else ".", (sys.argv[2] if len(sys.argv) > 2 else ",".join(SHAPES)).split(","))
