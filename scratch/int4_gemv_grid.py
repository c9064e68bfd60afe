"""int4's batch-1 GEMV with more loads in flight per SM, then the step with the best launch per shape (one GPU call).

int4_floor.py measured that a kernel streaming the step's int4 bytes needs ~4 programs of 4 warps per SM to
approach the copy bandwidth; m13's table launches 1-2. Part 1 times a grid of GEMV launches per Qwen3-8B shape,
each in a CUDA graph of enough distinct weights to miss L2 (median of replays; the table's launch included). Part 2
runs quant_step on bf16, int4 with the table, and int4 with the best launch per shape (captured into its graphs
while choose_launch is patched), in interleaved rounds.
"""

from __future__ import annotations

import json
import sys

import torch

import benchmarks.quant_step as quant_step
from milestones.common.demo import cuda_median_ms
from milestones.m08_triton_kernel.launch_config import sm_count
from milestones.m13_quantization import matmul_kernels
from milestones.m13_quantization.launch_config import QuantMatmulConfig, choose_launch

SHAPES = {"qkv_proj": (6144, 4096), "o_proj": (4096, 4096), "gate_up_proj": (24576, 4096),
          "down_proj": (4096, 12288), "lm_head": (151936, 4096)}
L2_MISS_BYTES = 400 * 2**20  # distinct weights per chain: 8x the H200's L2
GRID = [  # (unpack, block_n, block_k, warps, stages, split_k or None for the heuristic)
    ("subnormal", 32, 256, 1, 3, None), ("subnormal", 16, 256, 1, 4, None), ("subnormal", 8, 256, 1, 4, None),
    ("subnormal", 8, 512, 1, 3, None), ("subnormal", 8, 512, 2, 3, None), ("subnormal", 16, 512, 2, 3, None),
    ("subnormal", 16, 512, 4, 3, None), ("subnormal", 4, 512, 1, 4, None), ("subnormal", 8, 1024, 2, 3, None),
    ("subnormal", 32, 512, 2, 3, None), ("subnormal", 64, 256, 2, 3, None), ("subnormal", 32, 256, 1, 3, 2),
    ("subnormal", 32, 256, 1, 3, 4), ("subnormal", 16, 256, 1, 4, 2),
    ("magic", 16, 256, 4, 4, None), ("magic", 8, 256, 4, 4, None), ("magic", 8, 512, 4, 3, None),
    ("magic", 8, 512, 2, 4, None), ("magic", 4, 512, 2, 4, None), ("magic", 16, 512, 8, 3, None),
    ("magic", 16, 256, 4, 4, 2),
]


def name(c) -> str:
    return f"{c[0]} n{c[1]}-k{c[2]}-w{c[3]}-s{c[4]}" + (f" split{c[5]}" if c[5] else "")


def chain_us(n: int, k: int, launch, repeats: int = 10) -> float:
    """Microseconds per matmul of a graph of matmuls of one shape over distinct weights (no L2 reuse)."""
    copies = max(2, -(-L2_MISS_BYTES // (n * k // 2)))
    weights = [(torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, device="cuda"),
                torch.rand(n, k // 128, device="cuda") * 0.01) for _ in range(copies)]
    x = torch.randn(1, k, dtype=torch.bfloat16, device="cuda")

    def run():
        for q, s in weights:
            launch(x, q, s)

    run()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run()
    ms = cuda_median_ms(graph.replay, repeats)
    del graph, weights
    return ms * 1e3 / copies


def main(out: str) -> int:
    result = {"name": "int4_gemv_grid", "grid": [name(c) for c in GRID], "us": {}, "best": {}}
    sms = sm_count(torch.device("cuda"))
    best = {}
    for shape, (n, k) in SHAPES.items():
        table_config, table_split = choose_launch("int4", 1, n, k, sms)
        times = {"table": chain_us(n, k, lambda x, q, s: matmul_kernels.quantized_matmul(x, q, s, "int4"))}
        for c in GRID:
            config = QuantMatmulConfig("gemv", block_n=c[1], block_k=c[2], num_warps=c[3], num_stages=c[4],
                                       unpack=c[0])
            try:
                times[name(c)] = chain_us(n, k, lambda x, q, s: matmul_kernels.quantized_matmul(
                    x, q, s, "int4", config=config, split_k=c[5]))
            except Exception as error:  # a launch that does not compile or fit: skip it, say why
                times[name(c)] = None
                print(f"{shape} {name(c)}: {type(error).__name__}: {str(error)[:120]}", flush=True)
        result["us"][shape] = times
        ok = {key: t for key, t in times.items() if t is not None}
        winner = min(ok, key=ok.get)
        c = next((c for c in GRID if name(c) == winner), None)
        best[(n, k)] = (table_config, table_split) if c is None else (
            QuantMatmulConfig("gemv", block_n=c[1], block_k=c[2], num_warps=c[3], num_stages=c[4], unpack=c[0]),
            c[5] or 1)
        result["best"][shape] = {"launch": winner, "us": ok[winner], "table_us": times["table"],
                                 "table_launch": f"{table_config} split {table_split}"}
        print(f"{shape}: table {times['table']:.2f} us, best {winner} {ok[winner]:.2f} us", flush=True)
    layer = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")
    for key in ("table_us", "us"):
        result[f"step_matmuls_ms_{key}"] = (36 * sum(result["best"][s][key] for s in layer)
                                            + result["best"]["lm_head"][key]) / 1e3
    print(f"matmuls of a step: table {result['step_matmuls_ms_table_us']:.3f} ms, "
          f"best {result['step_matmuls_ms_us']:.3f} ms", flush=True)

    # Part 2: the step, with the best launches captured into the int4-best engine's graphs.
    table_choose = matmul_kernels.choose_launch

    def best_choose(method, m, n, k, num_sms, *rest):
        if method == "int4" and m == 1 and (n, k) in best:
            return best[(n, k)]
        return table_choose(method, m, n, k, num_sms, *rest)

    table_build = quant_step.build

    def build(mode, args):
        if mode != "int4-best":
            return table_build(mode, args)
        matmul_kernels.choose_launch = best_choose
        try:
            return table_build(mode, args)
        finally:
            matmul_kernels.choose_launch = table_choose

    quant_step.MODES["int4-best"] = {"quantization": "int4"}
    quant_step.build = build
    with open(out, "w") as f:
        json.dump(result, f, indent=1, default=str)
    step = quant_step.main(["--modes", "bf16,int4,int4-best", "--batches", "1", "--rounds", "5",
                            "--out", out.replace(".json", "+step.json")])
    result["step_speedup"] = step.get("speedup")
    with open(out, "w") as f:
        json.dump(result, f, indent=1, default=str)
    print(f"-> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "int4_gemv_grid.json"))
