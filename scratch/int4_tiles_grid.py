"""int4's batch-1 GEMV on tiles (quantize.tile_int4) against packed rows, per Qwen3-8B shape (one GPU call).

Each launch is timed as in int4_gemv_grid.py: a CUDA graph of matmuls of one shape over distinct weights
(400 MiB, 8x the L2), median of 10 replays, microseconds per matmul. Rows: the table's launch and two others;
tiles: a grid of launches. Prints the best tiled launch per shape and the step's matmul total both ways.
"""

from __future__ import annotations

import json
import sys

import torch

from benchmarks.env import environment
from milestones.common.demo import cuda_median_ms
from milestones.m08_triton_kernel.launch_config import sm_count
from milestones.m13_quantization import matmul_kernels
from milestones.m13_quantization.launch_config import QuantMatmulConfig, choose_launch
from milestones.m13_quantization.quantize import tile_int4

SHAPES = {"qkv_proj": (6144, 4096), "o_proj": (4096, 4096), "gate_up_proj": (24576, 4096),
          "down_proj": (4096, 12288), "lm_head": (151936, 4096)}
L2_MISS_BYTES = 400 * 2**20
GRID = [  # (block_n, block_k, warps, stages, split_k or None for the heuristic)
    (16, 256, 1, 4, None), (8, 256, 1, 4, None), (32, 256, 1, 3, None), (64, 256, 1, 3, None), (64, 128, 1, 4, None),
    (32, 256, 2, 3, None), (64, 256, 2, 3, None), (16, 512, 1, 3, None), (32, 256, 1, 3, 2), (32, 256, 1, 3, 4),
    (16, 256, 1, 4, 2), (64, 256, 1, 3, 4), (64, 128, 1, 4, 2), (128, 256, 2, 3, None),
]
ROWS_GRID = [(64, 256, 1, 3, None), (32, 256, 1, 3, None)]


def name(c) -> str:
    return f"n{c[0]}-k{c[1]}-w{c[2]}-s{c[3]}" + (f" split{c[4]}" if c[4] else "")


def chain_us(n: int, k: int, tiled: bool, config=None, split_k=None, repeats: int = 10) -> float:
    copies = max(2, -(-L2_MISS_BYTES // (n * k // 2)))
    weights = []
    for _ in range(copies):
        q = torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, device="cuda")
        weights.append((tile_int4(q) if tiled else q, torch.rand(n, k // 128, device="cuda") * 0.01))
    x = torch.randn(1, k, dtype=torch.bfloat16, device="cuda")

    def run():
        for q, s in weights:
            matmul_kernels.quantized_matmul(x, q, s, "int4", config=config, split_k=split_k)

    run()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run()
    ms = cuda_median_ms(graph.replay, repeats)
    del graph, weights
    return ms * 1e3 / copies


def config_of(c) -> QuantMatmulConfig:
    return QuantMatmulConfig("gemv", block_n=c[0], block_k=c[1], num_warps=c[2], num_stages=c[3])


def main(out: str) -> int:
    result = {"name": "int4_tiles_grid", "env": environment("cuda"), "grid": [name(c) for c in GRID], "us": {},
              "best": {}}
    sms = sm_count(torch.device("cuda"))
    for shape, (n, k) in SHAPES.items():
        table_config, table_split = choose_launch("int4", 1, n, k, sms)
        times = {"rows table": chain_us(n, k, False), "tiles table": chain_us(n, k, True)}
        for tiled, grid in ((False, ROWS_GRID), (True, GRID)):
            for c in grid:
                key = ("tiles " if tiled else "rows ") + name(c)
                try:
                    times[key] = chain_us(n, k, tiled, config_of(c), c[4])
                except Exception as error:  # a launch that does not compile or fit: skip it, say why
                    times[key] = None
                    print(f"{shape} {key}: {type(error).__name__}: {str(error)[:120]}", flush=True)
        ok = {key: t for key, t in times.items() if t is not None and key.startswith("tiles")}
        winner = min(ok, key=ok.get)
        result["us"][shape] = times
        result["best"][shape] = {"launch": winner, "us": ok[winner], "table_launch": f"{table_config} split "
                                 f"{table_split}", "rows_table_us": times["rows table"],
                                 "tiles_table_us": times["tiles table"]}
        print(f"{shape}: rows table {times['rows table']:.2f} us, tiles table {times['tiles table']:.2f} us, best "
              f"{winner} {ok[winner]:.2f} us | " + " ".join(f"{a}={b:.2f}" for a, b in times.items() if b), flush=True)
    layer = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")
    for key in ("rows_table_us", "tiles_table_us", "us"):
        result[f"step_matmuls_ms_{key}"] = (36 * sum(result["best"][s][key] for s in layer)
                                            + result["best"]["lm_head"][key]) / 1e3
        print(f"matmuls of a step, {key}: {result[f'step_matmuls_ms_{key}']:.3f} ms", flush=True)
    with open(out, "w") as f:
        json.dump(result, f, indent=1, default=str)
    print(f"-> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "int4_tiles_grid.json"))
