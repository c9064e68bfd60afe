"""One GPU call: what each GEMV epilogue costs at Qwen3-8B's shapes, against the kernel it replaces.

Call 57 put the epilogues (gemv_epilogues.py) in m13's step: 108 kernels fewer, and no faster at batch 1 (the
GEMVs took 292 us more, the kernels they replaced 242). This times each piece on its own. Per shape and batch
(1, 2), 36 launches over 36 distinct weights (as a step's 36 layers: nothing from L2) in one CUDA graph, 5
interleaved rounds of 20 replays, us per launch:
    gemv                 the GEMV alone
    gemv + m12           the GEMV, then m12's add_rms_norm or silu_and_mul (the step without epilogues)
    epilogue             the GEMV with its epilogue (the norm's last program loads its row at once)
    epilogue, chunked    the same, the norm's row loaded 1,024 values at a time (as call 57's kernel)
Shapes: o_proj (4,096 x 4,096) and down_proj (4,096 x 12,288) with the add + norm, gate_up (24,576 x 4,096) with
SiLU * up; int4 in tiles, scales group by group (the engine's layout).

    python3 scratch/epilogue_shapes.py OUT.json
"""

from __future__ import annotations

import json
import statistics
import sys

import torch

from benchmarks.env import environment
from milestones.m12_async_scheduling.fused_kernels import add_rms_norm, silu_and_mul
from milestones.m13_quantization import matmul_kernels as mk

LAYERS, REPLAYS, ROUNDS = 36, 20, 5
SHAPES = {"o_proj": (4096, 4096, "norm"), "down_proj": (4096, 12288, "norm"), "gate_up": (24576, 4096, "silu")}


def weights(n: int, k: int):
    tiles = torch.randint(0, 256, (n // 16, k // 128, 16, 64), dtype=torch.uint8, device="cuda")
    scales = (torch.rand(k // 128, n, device="cuda") * 0.01).t()  # group by group, as the engine stores them
    return tiles, scales


def variant_fn(name: str, kind: str, x, w, s, residual, norm_w):
    if name == "gemv":
        return lambda: mk.quantized_matmul(x, w, s, "int4")
    if name == "gemv + m12":
        if kind == "norm":
            return lambda: add_rms_norm(mk.quantized_matmul(x, w, s, "int4"), residual, norm_w, 1e-6)
        return lambda: silu_and_mul(mk.quantized_matmul(x, w, s, "int4"))
    if kind == "norm":
        return lambda: mk.quantized_add_rms_norm(x, w, s, "int4", residual, norm_w, 1e-6)
    return lambda: mk.quantized_silu_and_mul(x, w, s, "int4")


def capture(fns):
    for fn in fns:  # warm-up: compiles, allocates the counters
        fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for fn in fns:
            fn()
    return graph


def time_us(graph) -> float:
    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(REPLAYS):
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000 / LAYERS)
    return statistics.median(times)


def main(out: str) -> None:
    variants = ("gemv", "gemv + m12", "epilogue", "epilogue, chunked")
    graphs, keep = {}, []
    for shape, (n, k, kind) in SHAPES.items():
        ws = [weights(n, k) for _ in range(LAYERS)]
        for batch in (1, 2):
            x = torch.randn(batch, k, device="cuda", dtype=torch.bfloat16)
            residual = torch.randn(batch, n, device="cuda", dtype=torch.bfloat16)
            norm_w = torch.ones(n, device="cuda", dtype=torch.bfloat16)
            keep.append((x, residual, norm_w))
            for name in variants:
                saved = mk.NORM_MAX_N
                mk.NORM_MAX_N = 1024 if name == "epilogue, chunked" else saved
                try:
                    graphs[(shape, batch, name)] = capture([variant_fn(name, kind, x, w, s, residual, norm_w)
                                                            for w, s in ws])
                finally:
                    mk.NORM_MAX_N = saved
        keep.append(ws)
    times = {key: [] for key in graphs}
    for round_ in range(ROUNDS):
        for key, graph in graphs.items():
            times[key].append(time_us(graph))
        print(f"round {round_ + 1} done", flush=True)
    result = {"name": "int4_gemv_epilogues", "env": environment("cuda"), "layers": LAYERS, "replays": REPLAYS,
              "rounds": ROUNDS, "shapes": {s: list(v) for s, v in SHAPES.items()}, "us_per_launch": {}}
    for (shape, batch, name), values in times.items():
        key = f"{shape} b{batch} {name}"
        result["us_per_launch"][key] = {"median": statistics.median(values), "min": min(values), "max": max(values),
                                        "rounds": values}
        print(f"{key:34s} {statistics.median(values):7.2f} us ({min(values):.2f}-{max(values):.2f})", flush=True)
    with open(out, "w") as f:
        json.dump(result, f, indent=1)
    print(f"-> {out}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "int4_gemv_epilogues.json")
