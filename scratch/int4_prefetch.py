"""int4's batch-1 GEMV with its weights asked of L2 ahead of their loads (QuantMatmulConfig.prefetch, evict_first),
per Qwen3-8B shape, then the decode step with the best setting against the table and bf16 (one GPU call).

Part 1: each launch timed as in int4_tiles_grid.py (bfba528): a CUDA graph of matmuls of one shape over distinct
weights (400 MiB, 8x the L2), median of 10 replays, us per matmul; the table's launch per shape (gemv_for_shape),
with prefetch 0/2/4/8/16 steps ahead and evict_first off/on, and for the short shapes 8/16/32 rows a program.
Part 2: quant_step's interleaved rounds, bf16 / int4 (the table) / int4-pf (the table with the best global setting
of part 1), batch 1 and 4, 5 rounds.
"""

from __future__ import annotations

import json
import sys
from dataclasses import replace

import torch

from benchmarks.env import environment
from milestones.common.demo import cuda_median_ms
from milestones.m08_triton_kernel.launch_config import sm_count
from milestones.m13_quantization import launch_config, matmul_kernels
from milestones.m13_quantization.launch_config import choose_launch
from milestones.m13_quantization.quantize import tile_int4

SHAPES = {"qkv_proj": (6144, 4096), "o_proj": (4096, 4096), "gate_up_proj": (24576, 4096),
          "down_proj": (4096, 12288), "lm_head": (151936, 4096)}
L2_MISS_BYTES = 400 * 2**20
SETTINGS = [(pf, ev) for ev in (False, True) for pf in (0, 2, 4, 8, 16)]
LAYER = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")


def chain_us(n, k, config, split_k, repeats=10) -> float:
    copies = max(2, -(-L2_MISS_BYTES // (n * k // 2)))
    weights = [(tile_int4(torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, device="cuda")),
                torch.rand(n, k // 128, device="cuda") * 0.01) for _ in range(copies)]
    x = torch.randn(1, k, dtype=torch.bfloat16, device="cuda")
    ref = matmul_kernels.quantized_matmul_reference(x, *weights[0], "int4").float()
    got = matmul_kernels.quantized_matmul(x, *weights[0], "int4", config=config, split_k=split_k).float()
    err = ((got - ref).norm() / ref.norm()).item()
    assert err < 2e-2, f"relative error {err}"

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


def part1(result) -> tuple[int, bool]:
    sms = sm_count(torch.device("cuda"))
    us = result["us"] = {}
    for shape, (n, k) in SHAPES.items():
        table, split = choose_launch("int4", 1, n, k, sms)
        us[shape] = {}
        for pf, ev in SETTINGS:
            us[shape][f"pf{pf} ev{int(ev)}"] = chain_us(n, k, replace(table, prefetch=pf, evict_first=ev), split)
        if shape in ("qkv_proj", "o_proj"):
            for bn in (8, 16, 32):
                for pf in (0, 4, 16):
                    c = replace(table, block_n=bn, prefetch=pf, evict_first=True)
                    us[shape][f"n{bn} pf{pf} ev1"] = chain_us(n, k, c, launch_config.choose_split_k(1, n, k, sms, c))
        print(shape, f"table {table} split {split}:", " ".join(f"{a}={b:.2f}" for a, b in us[shape].items()),
              flush=True)
    sums = {}
    for pf, ev in SETTINGS:
        key = f"pf{pf} ev{int(ev)}"
        sums[key] = (36 * sum(us[s][key] for s in LAYER) + us["lm_head"][key]) / 1e3
    result["step_matmuls_ms"] = sums
    best = min(sums, key=sums.get)
    print("step's matmuls (ms):", " ".join(f"{a}={b:.3f}" for a, b in sums.items()), "best", best, flush=True)
    return next((pf, ev) for pf, ev in SETTINGS if f"pf{pf} ev{int(ev)}" == best)


def part2(pf: int, ev: bool, out: str) -> None:
    import benchmarks.quant_step as quant_step

    table_build = quant_step.build

    def build(mode, args):
        if mode != "int4-pf":
            return table_build(mode, args)
        saved = dict(launch_config.LAUNCH_TABLE["int4"])
        for regime in ("gemv", "gemv long rows"):
            launch_config.LAUNCH_TABLE["int4"][regime] = replace(saved[regime], prefetch=pf, evict_first=ev)
        try:
            return table_build(mode, args)  # its graphs capture the launches now
        finally:
            launch_config.LAUNCH_TABLE["int4"].update(saved)

    quant_step.MODES["int4-pf"] = {"quantization": "int4"}
    quant_step.build = build
    quant_step.main(["--modes", "bf16,int4,int4-pf", "--batches", "1,2", "--rounds", "5", "--out", out])


if __name__ == "__main__":
    out_dir = sys.argv[1] if len(sys.argv) > 1 else "."
    result = {"name": "int4_prefetch", "env": environment("cuda"), "settings": [f"pf{a} ev{int(b)}" for a, b in SETTINGS]}
    pf, ev = part1(result)
    result["best"] = {"prefetch": pf, "evict_first": ev}
    with open(f"{out_dir}/int4_prefetch.json", "w") as f:
        json.dump(result, f, indent=1, default=str)
    part2(pf, ev, f"{out_dir}/m13_step_times_prefetch.json")
