"""One GPU call: is m13's int4 GEMV faster when its weights are already in L2, and does a prefetch on a side
stream, while another kernel runs, put them there?

Per shape, 36 launches in one CUDA graph, 5 interleaved rounds of 20 replays, us per launch:
    cold        36 distinct weights (as a step's 36 layers: nothing from L2)
    hot         one weight 36 times (in L2 after the first launch, where it fits: 50 MB)
    spin        a stand-in for attention: one small kernel that waits SPIN_US, then the GEMV (distinct weights)
    spin + pf   the same, with the GEMV's weights and scales asked of L2 on a side stream during the wait
"spin + pf" less "spin" is what the prefetch saves; "hot" against "cold" is the most it could.

    python3 scratch/l2_hot_gemv.py OUT.json
"""

from __future__ import annotations

import json
import statistics
import sys

import torch
import triton
import triton.language as tl

from benchmarks.env import environment
from milestones.m13_quantization import matmul_kernels as mk

sys.path.insert(0, "scratch")
from l2_prefetch_ab import prefetch_l2  # noqa: E402

LAYERS, REPLAYS, ROUNDS, SPIN_US = 36, 20, 5, 10.0
SHAPES = {"qkv_proj": (6144, 4096), "o_proj": (4096, 4096), "gate_up": (24576, 4096), "down_proj": (4096, 12288)}


@triton.jit
def _spin_kernel(out_ptr, cycles):
    start = tl.inline_asm_elementwise("mov.u64 $0, %clock64;", "=l", [], dtype=tl.int64, is_pure=False, pack=1)
    now = start
    while now - start < cycles:
        now = tl.inline_asm_elementwise("mov.u64 $0, %clock64;", "=l", [], dtype=tl.int64, is_pure=False, pack=1)
    tl.store(out_ptr + tl.program_id(0), now - start)


def weights(n: int, k: int):
    tiles = torch.randint(0, 256, (n // 16, k // 128, 16, 64), dtype=torch.uint8, device="cuda")
    return tiles, (torch.rand(k // 128, n, device="cuda") * 0.01).t()


def capture(fns):
    for fn in fns:
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
    clock_hz = torch.cuda.get_device_properties(0).clock_rate * 1000 if hasattr(
        torch.cuda.get_device_properties(0), "clock_rate") else 1.98e9
    cycles = int(SPIN_US * 1e-6 * clock_hz)
    sink = torch.zeros(8, dtype=torch.int64, device="cuda")
    side = torch.cuda.Stream()
    graphs, keep = {}, [sink]
    for shape, (n, k) in SHAPES.items():
        ws = [weights(n, k) for _ in range(LAYERS)]
        x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
        keep += [ws, x]

        def spin():
            _spin_kernel[(1,)](sink, cycles, num_warps=1)

        def spin_pf(w, s):
            here = torch.cuda.current_stream()
            side.wait_stream(here)
            with torch.cuda.stream(side):
                prefetch_l2(w)
                prefetch_l2(s)
            spin()
            here.wait_stream(side)

        graphs[(shape, "cold")] = capture([lambda w=w, s=s: mk.quantized_matmul(x, w, s, "int4") for w, s in ws])
        graphs[(shape, "hot")] = capture([lambda: mk.quantized_matmul(x, *ws[0], "int4")] * LAYERS)
        graphs[(shape, "spin only")] = capture([spin] * LAYERS)
        graphs[(shape, "spin")] = capture(
            [lambda w=w, s=s: (spin(), mk.quantized_matmul(x, w, s, "int4")) for w, s in ws])
        graphs[(shape, "spin + pf")] = capture(
            [lambda w=w, s=s: (spin_pf(w, s), mk.quantized_matmul(x, w, s, "int4")) for w, s in ws])
        print(f"{shape}: captured", flush=True)
    times = {key: [] for key in graphs}
    for round_ in range(ROUNDS):
        for key, graph in graphs.items():
            times[key].append(time_us(graph))
    result = {"name": "int4_gemv_l2", "env": environment("cuda"), "layers": LAYERS, "replays": REPLAYS,
              "rounds": ROUNDS, "spin_us": SPIN_US, "spin_cycles": cycles,
              "shapes": {s: list(v) for s, v in SHAPES.items()}, "us_per_launch": {}}
    for (shape, name), values in times.items():
        result["us_per_launch"][f"{shape} {name}"] = {"median": statistics.median(values), "min": min(values),
                                                      "max": max(values), "rounds": values}
        print(f"{shape:10s} {name:10s} {statistics.median(values):7.2f} us ({min(values):.2f}-{max(values):.2f})")
    with open(out, "w") as f:
        json.dump(result, f, indent=1)
    print(f"-> {out}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "int4_gemv_l2.json")
