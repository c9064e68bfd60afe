"""One GPU call: gate_up's GEMV with its SiLU * up epilogue at 256 rows a program (128 outputs: one group of 128,
so its finishing program could write down_proj's x as integers), against the table's 64 rows. 36 launches over
distinct weights in one CUDA graph, x already integers, 5 interleaved rounds, µs a launch; each config checked
against the float reference first.

    python3 scratch/silu_group_rows.py OUT_DIR
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import sys

import torch

from benchmarks.env import environment
from milestones.m13_quantization import integer_dots, launch_config
from milestones.m13_quantization.epilogue_matmuls import quantized_silu_and_mul
from milestones.m13_quantization.quantize import dequantize_int4, group_major, tile_int4, untile_int4

N, K, LAUNCHES, ROUNDS, REPLAYS = 24576, 4096, 36, 5, 10
TABLE = launch_config.LAUNCH_TABLE["int4"]["gemv"]


def configs() -> dict:
    out = {"table": TABLE}
    for warps, stages, per_sm in [(8, 3, 1), (8, 3, 2), (8, 3, 3), (4, 3, 2), (8, 4, 2), (16, 3, 2), (4, 3, 1)]:
        out[f"n256-w{warps}-s{stages}-p{per_sm}"] = dataclasses.replace(
            TABLE, block_n=256, num_warps=warps, num_stages=stages, min_programs_per_sm=per_sm)
    return out


def main(out_dir: str) -> None:
    torch.manual_seed(0)
    x = torch.randn(1, K, device="cuda", dtype=torch.bfloat16)
    words = integer_dots.int16_x(x)
    weights = [(tile_int4(torch.randint(0, 256, (N, K // 2), dtype=torch.uint8, device="cuda")),
                group_major(torch.rand(N, K // 128, device="cuda") * 0.02 + 0.001)) for _ in range(LAUNCHES)]
    w0, s0 = weights[0]
    gate_up = x.float() @ dequantize_int4(untile_int4(w0), s0).t()
    gate, up = gate_up[:, :N // 2].bfloat16().float(), gate_up[:, N // 2:].bfloat16().float()
    reference = torch.nn.functional.silu(gate) * up
    graphs, result = {}, {"name": "int4_silu_group_rows", "env": environment("cuda"), "errors": {}, "failed": {}}
    for name, config in configs().items():
        try:
            out = quantized_silu_and_mul(x, w0, s0, "int4", config=config, x_words=words).float()
            result["errors"][name] = err = ((out - reference).norm() / reference.norm()).item()
            if not err < 1e-2:
                result["failed"][name] = f"relative error {err:.3g}"
                continue
            launches = [lambda w=w, s=s, c=config: quantized_silu_and_mul(x, w, s, "int4", config=c, x_words=words)
                        for w, s in weights]
            for launch in launches:
                launch()
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                for launch in launches:
                    launch()
            graphs[name] = graph
        except Exception as error:
            result["failed"][name] = f"{type(error).__name__}: {str(error)[:200]}"
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
    result["us"] = times
    result["median_us"] = {name: statistics.median(v) for name, v in times.items()}
    for name, us in sorted(result["median_us"].items(), key=lambda kv: kv[1]):
        print(f"{name:20s} {us:6.2f} us (err {result['errors'][name]:.2e})", flush=True)
    print("failed:", result["failed"], flush=True)
    with open(f"{out_dir}/int4_silu_group_rows.json", "w") as f:
        json.dump(result, f, indent=1, default=str)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else ".")
