"""One GPU call: PyTorch's own int4 matmul for CUDA (``torch._weight_int4pack_mm``, the "tinygemm" kernel that
gpt-fast and torchao use at batch 1) against m13's Triton GEMV, at Qwen3-8B's five shapes.

The issue allows "a torch op where one exists for CUDA"; this asks whether one is faster. Per shape and batch
(1, 2, 4), LAYERS launches over distinct weights in one CUDA graph (nothing from L2), 5 interleaved rounds of 20
replays, us per launch:
    m13            m13's GEMV (tiles, scales group by group: the engine's layout and launch table)
    torch kT       torch._weight_int4pack_mm on weights packed with innerKTiles = T (2, 4, 8), bf16 scales
First the op's arithmetic is checked against a float reference (w = (q - 8) * s, zero points 0), both nibble orders.

    python3 scratch/int4_torch_op.py OUT.json
"""

from __future__ import annotations

import json
import statistics
import sys

import torch

from benchmarks.env import environment
from milestones.m13_quantization import matmul_kernels as mk

REPLAYS, ROUNDS, GROUP = 20, 5, 128
SHAPES = {"qkv_proj": (6144, 4096, 36), "o_proj": (4096, 4096, 36), "gate_up": (24576, 4096, 36),
          "down_proj": (4096, 12288, 36), "lm_head": (151936, 4096, 6)}
STEP_COUNTS = {"qkv_proj": 36, "o_proj": 36, "gate_up": 36, "down_proj": 36, "lm_head": 1}
INNER_K_TILES = (2, 4, 8)


def torch_packed(q: torch.Tensor, inner_k_tiles: int, high_first: bool) -> torch.Tensor:
    """Nibbles 0..15 [N, K] -> the op's layout, through uint8 [N, K / 2] (element 2j in the high nibble, or low)."""
    q = q.to(torch.uint8)
    even, odd = q[:, ::2], q[:, 1::2]
    pairs = (even << 4 | odd) if high_first else (odd << 4 | even)
    return torch._convert_weight_to_int4pack(pairs.contiguous(), inner_k_tiles)


def scales_and_zeros(scales: torch.Tensor) -> torch.Tensor:
    """float scales [N, K / 128] -> the op's [K / 128, N, 2] bf16 (scale, zero point 0)."""
    s = scales.t().to(torch.bfloat16)
    return torch.stack([s, torch.zeros_like(s)], dim=2).contiguous()


def check_arithmetic() -> dict:
    torch.manual_seed(0)
    n, k = 512, 4096
    q = torch.randint(0, 16, (n, k), device="cuda")
    scales = (torch.rand(n, k // GROUP, device="cuda") * 0.02 + 0.001).to(torch.bfloat16).float()
    weight = ((q.float() - 8).view(n, k // GROUP, GROUP) * scales[:, :, None]).view(n, k)
    result = {}
    for rows in (1, 4):
        x = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16)
        expected = x.float() @ weight.t()
        for high_first in (True, False):
            out = torch._weight_int4pack_mm(x, torch_packed(q, 8, high_first), GROUP, scales_and_zeros(scales))
            err = ((out.float() - expected).norm() / expected.norm()).item()
            result[f"rows {rows}, {'high' if high_first else 'low'} nibble first"] = err
            print(f"arithmetic, rows {rows}, {'high' if high_first else 'low'} first: relative error {err:.2e}")
    return result


def m13_weights(n: int, k: int):
    tiles = torch.randint(0, 256, (n // 16, k // 128, 16, 64), dtype=torch.uint8, device="cuda")
    scales = (torch.rand(k // 128, n, device="cuda") * 0.01).t()
    return tiles, scales


def torch_weights(n: int, k: int, inner_k_tiles: int):
    q = torch.randint(0, 16, (n, k), device="cuda", dtype=torch.uint8)
    packed = torch_packed(q, inner_k_tiles, True)
    del q
    return packed, scales_and_zeros(torch.rand(n, k // GROUP, device="cuda") * 0.01)


def capture(fns):
    for fn in fns:
        fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for fn in fns:
            fn()
    return graph


def time_us(graph, launches: int) -> float:
    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(REPLAYS):
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000 / launches)
    return statistics.median(times)


def main(out: str) -> None:
    arithmetic = check_arithmetic()
    graphs, keep = {}, []
    for shape, (n, k, launches) in SHAPES.items():
        ours = [m13_weights(n, k) for _ in range(launches)]
        theirs = {t: [torch_weights(n, k, t) for _ in range(launches)] for t in INNER_K_TILES}
        keep += [ours, theirs]
        for batch in (1, 2, 4):
            x = torch.randn(batch, k, device="cuda", dtype=torch.bfloat16)
            keep.append(x)
            graphs[(shape, batch, "m13")] = (capture(
                [lambda w=w, s=s: mk.quantized_matmul(x, w, s, "int4") for w, s in ours]), launches)
            for t, ws in theirs.items():
                try:
                    graphs[(shape, batch, f"torch k{t}")] = (capture(
                        [lambda w=w, s=s: torch._weight_int4pack_mm(x, w, GROUP, s) for w, s in ws]), launches)
                except RuntimeError as error:
                    print(f"{shape} b{batch} torch k{t}: {str(error).splitlines()[0]}")
        print(f"{shape}: captured", flush=True)
    times = {key: [] for key in graphs}
    for round_ in range(ROUNDS):
        for key, (graph, launches) in graphs.items():
            times[key].append(time_us(graph, launches))
        print(f"round {round_ + 1} done", flush=True)
    result = {"name": "int4_torch_op", "env": environment("cuda"), "replays": REPLAYS, "rounds": ROUNDS,
              "shapes": {s: list(v) for s, v in SHAPES.items()}, "arithmetic_relative_error": arithmetic,
              "us_per_launch": {}, "step_matmuls_ms": {}}
    for (shape, batch, name), values in times.items():
        key = f"{shape} b{batch} {name}"
        result["us_per_launch"][key] = {"median": statistics.median(values), "min": min(values), "max": max(values),
                                        "rounds": values}
        print(f"{key:28s} {statistics.median(values):8.2f} us ({min(values):.2f}-{max(values):.2f})", flush=True)
    names = sorted({name for _, _, name in times})
    for batch in (1, 2, 4):
        for name in names:
            keys = [f"{shape} b{batch} {name}" for shape in SHAPES]
            if all(key in result["us_per_launch"] for key in keys):
                total = sum(STEP_COUNTS[s] * result["us_per_launch"][key]["median"] for s, key in zip(SHAPES, keys))
                result["step_matmuls_ms"][f"b{batch} {name}"] = total / 1000
                print(f"the step's 145 matmuls, batch {batch}, {name}: {total / 1000:.3f} ms")
    with open(out, "w") as f:
        json.dump(result, f, indent=1)
    print(f"-> {out}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "int4_torch_op.json")
