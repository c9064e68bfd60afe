"""One GPU call: int4's GEMV with x as 16-bit integers and dp4a (``integer_dots.py``) against m13's table before.

1. The step (quant_step on qwen3-8b-random, 512 keys, the float32 gate first, 5 interleaved rounds), each
   engine's graphs captured under its own table: ``bf16``; ``int4-before`` (the table before: ``subnormal``,
   the GEMV to 2 rows); ``int4`` (the table now: ``dp4a``, the GEMV to 4 rows). Call 77 ran it with the GEMV
   to 2 rows; call 78 with the norm epilogue converting its row too; call 79 (at bfa85af) with dp4a only from
   2^25 rows x weights beside dp4a everywhere, which was faster.
2. Each of Qwen3-8B's five batch-1 matmuls, 36 launches over distinct weights in one CUDA graph, 5 interleaved
   rounds, µs a launch: ``subnormal``, dp4a with x already converted, dp4a with its conversion, the conversion
   alone. Each is first checked against the float reference (call 77).

    python3 scratch/int4_dp4a.py OUT_DIR [step|shapes|both] [BATCHES]
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import sys

import torch

import benchmarks.quant_step as quant_step
from benchmarks.env import environment
from milestones.m13_quantization import integer_dots, launch_config, matmul_kernels
from milestones.m13_quantization.quantize import dequantize_int4, group_major, tile_int4, untile_int4

SHAPES = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (24576, 4096), "down": (4096, 12288),
          "lm_head": (151936, 4096)}
LAUNCHES, ROUNDS, REPLAYS = 36, 5, 10
TABLE = dataclasses.replace(launch_config.LAUNCH_TABLE["int4"]["gemv"], unpack="subnormal")  # the table before
DP4A = dataclasses.replace(TABLE, unpack="dp4a")


STEP_MODES = {"int4-before": {"gemv": TABLE, "int4_gemv_rows": 2}}


def step(out_dir: str, batches: str) -> None:
    plain_build = quant_step.build

    def build(mode, args):
        saved = launch_config.LAUNCH_TABLE["int4"]["gemv"], launch_config.GEMV_MAX_M
        change = STEP_MODES.get(mode, {})
        try:  # the graphs record the launches they capture: the table matters only while building
            launch_config.LAUNCH_TABLE["int4"]["gemv"] = change.get("gemv", saved[0])
            launch_config.GEMV_MAX_M = {**saved[1], "int4": change.get("int4_gemv_rows", saved[1]["int4"])}
            return plain_build(mode, args)
        finally:
            launch_config.LAUNCH_TABLE["int4"]["gemv"], launch_config.GEMV_MAX_M = saved

    for mode in STEP_MODES:
        quant_step.MODES.setdefault(mode, {"quantization": "int4"})
    quant_step.build = build
    quant_step.main(["--gate", "--modes", "bf16,int4-before,int4", "--batches", batches, "--rounds", "5", "--out", f"{out_dir}/m13_step_times_dp4a.json"])
    quant_step.build = plain_build


def graph_of(launches) -> torch.cuda.CUDAGraph:
    for launch in launches:  # warm-up (compiles; split counters allocated outside the capture)
        launch()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for launch in launches:
            launch()
    return graph


def per_shape(out_dir: str) -> dict:
    torch.manual_seed(0)
    result = {"name": "int4_dp4a", "env": environment("cuda"), "launches": LAUNCHES, "rounds": ROUNDS,
              "replays": REPLAYS, "table": dataclasses.asdict(TABLE), "shapes": {}}
    for name, (n, k) in SHAPES.items():
        x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
        weights = [(tile_int4(torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, device="cuda")),
                    group_major(torch.rand(n, k // 128, device="cuda") * 0.02 + 0.001)) for _ in range(LAUNCHES)]
        w0, s0 = weights[0]
        reference = x.float() @ dequantize_int4(untile_int4(w0), s0).t()
        errors = {}
        for label, config in (("subnormal", TABLE), ("dp4a", DP4A)):
            out = matmul_kernels.quantized_matmul(x, w0, s0, "int4", config=config).float()
            errors[label] = ((out - reference).norm() / reference.norm()).item()
        x_ready = integer_dots.int16_x(x)
        real_int16_x = matmul_kernels.int16_x
        variants = {
            "subnormal": [lambda w=w, s=s: matmul_kernels.quantized_matmul(x, w, s, "int4", config=TABLE)
                          for w, s in weights],
            "dp4a, x ready": [lambda w=w, s=s: matmul_kernels.quantized_matmul(x, w, s, "int4", config=DP4A)
                              for w, s in weights],
            "dp4a with int16_x": [lambda w=w, s=s: matmul_kernels.quantized_matmul(x, w, s, "int4", config=DP4A)
                                  for w, s in weights],
            "int16_x alone": [lambda: integer_dots.int16_x(x) for _ in weights],
        }
        graphs = {}
        for label, launches in variants.items():
            if label == "dp4a, x ready":
                matmul_kernels.int16_x = lambda _x: x_ready
            try:
                graphs[label] = graph_of(launches)
            finally:
                matmul_kernels.int16_x = real_int16_x
        times = {label: [] for label in graphs}
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        for _ in range(ROUNDS):
            for label, graph in graphs.items():
                graph.replay()
                start.record()
                for _ in range(REPLAYS):
                    graph.replay()
                end.record()
                end.synchronize()
                times[label].append(start.elapsed_time(end) * 1000 / (REPLAYS * LAUNCHES))
        result["shapes"][name] = {"n": n, "k": k, "relative_error": errors, "us": times,
                                  "median_us": {label: statistics.median(v) for label, v in times.items()}}
        print(name, {label: round(statistics.median(v), 2) for label, v in times.items()}, errors, flush=True)
        del graphs, weights
        torch.cuda.empty_cache()
    with open(f"{out_dir}/int4_dp4a.json", "w") as f:
        json.dump(result, f, indent=1, default=str)
    return result


if __name__ == "__main__":
    out = sys.argv[1] if len(sys.argv) > 1 else "."
    which = sys.argv[2] if len(sys.argv) > 2 else "both"
    if which in ("both", "step"):
        step(out, sys.argv[3] if len(sys.argv) > 3 else "1,2,3,4,8")
    if which in ("both", "shapes"):
        per_shape(out)
