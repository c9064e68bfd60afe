"""One GPU call: the launch parameters of int4's dp4a GEMV, swept at Qwen3-8B's five batch-1 shapes, then the
step with the winners.

Until call 82 the table's dp4a GEMV (one warp of 32 rows, 256 inputs a step, 3 stages, K in slices to 3
programs an SM) was the ``subnormal`` kernel's tuning (call 28/33): dp4a issues half the instructions a byte, so
the best shape of a program may have moved (call 82: the first grid; call 83: the second, around its winner). Each config is timed as 36 launches over distinct weights in one CUDA graph (x already
in integers, as the norms now give it), 5 interleaved rounds, µs a launch, each first checked against the float
reference. Then quant_step (no gate: the call ran it first), 5 interleaved rounds at batch 1, 2, 4: bf16, int4
(the table), int4-one (the config with the least time over a step's 145 matmuls), int4-shape (each shape's
fastest), and in call 83 int4-one+conversion (int4-one with x's conversion launch at the best of
``CONVERSIONS``, timed as 36 launches in a graph at K 4,096 and 12,288).

    python3 scratch/dp4a_grid.py OUT_DIR [BUDGET_S]
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import statistics
import sys
import time

import torch

import benchmarks.quant_step as quant_step
from benchmarks.env import environment
from milestones.m13_quantization import integer_dots, launch_config, matmul_kernels
from milestones.m13_quantization.quantize import dequantize_int4, group_major, tile_int4, untile_int4

SHAPES = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (24576, 4096), "down": (4096, 12288),
          "lm_head": (151936, 4096)}
PER_STEP = {"qkv": 36, "o": 36, "gate_up": 36, "down": 36, "lm_head": 1}
ROUNDS, REPLAYS = 5, 10
TABLE = launch_config.LAUNCH_TABLE["int4"]["gemv"]


def grid(round_: int = 2) -> dict[str, launch_config.QuantMatmulConfig]:
    """Call 82 swept the first grid around the table then (32 rows, 1 warp); call 83 the second, around its
    winner (64 rows, 2 warps, 3 stages, 2 programs an SM, the table since)."""
    configs = {"table": TABLE}
    if round_ == 1:
        for block_n, warps, stages, per_sm in itertools.product((16, 32, 64), (1, 2, 4), (2, 3, 4), (2, 3, 4, 6)):
            name = f"n{block_n}-k256-w{warps}-s{stages}-p{per_sm}"
            configs[name] = dataclasses.replace(TABLE, block_n=block_n, num_warps=warps, num_stages=stages,
                                                min_programs_per_sm=per_sm)
        for block_k, stages in ((128, 4), (128, 6), (512, 2), (512, 3)):
            for warps in (1, 2):
                configs[f"n32-k{block_k}-w{warps}-s{stages}-p3"] = dataclasses.replace(
                    TABLE, block_n=32, block_k=block_k, num_warps=warps, num_stages=stages, min_programs_per_sm=3)
        return configs
    for block_n, warps, stages, per_sm in itertools.product((64, 128), (2, 4, 8), (3, 4, 5), (1, 2, 3)):
        configs[f"n{block_n}-k256-w{warps}-s{stages}-p{per_sm}"] = dataclasses.replace(
            TABLE, block_n=block_n, num_warps=warps, num_stages=stages, min_programs_per_sm=per_sm)
    for block_n, warps, stages, per_sm in itertools.product((32,), (1, 2), (4, 5, 6), (2, 3, 4)):
        configs[f"n{block_n}-k256-w{warps}-s{stages}-p{per_sm}"] = dataclasses.replace(
            TABLE, block_n=block_n, num_warps=warps, num_stages=stages, min_programs_per_sm=per_sm)
    for block_k, stages, warps in itertools.product((128, 512), (2, 3, 4, 6), (2, 4)):
        if (block_k == 512) == (stages <= 3):
            configs[f"n64-k{block_k}-w{warps}-s{stages}-p2"] = dataclasses.replace(
                TABLE, block_n=64, block_k=block_k, num_warps=warps, num_stages=stages, min_programs_per_sm=2)
    return configs


def graph_of(launches) -> torch.cuda.CUDAGraph:
    for launch in launches:  # warm-up (compiles; split counters allocated outside the capture)
        launch()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for launch in launches:
            launch()
    return graph


def sweep(out_dir: str, budget_s: float) -> dict:
    began = time.perf_counter()
    torch.manual_seed(0)
    configs = grid()
    result = {"name": "int4_dp4a_grid", "round": 2, "env": environment("cuda"), "rounds": ROUNDS, "replays": REPLAYS,
              "configs": {name: dataclasses.asdict(c) for name, c in configs.items()}, "shapes": {}}
    for shape, (n, k) in SHAPES.items():
        launches = 8 if shape == "lm_head" else 36  # the head is 6x L2 anyway
        x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
        x_words = integer_dots.int16_x(x)
        weights = [(tile_int4(torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, device="cuda")),
                    group_major(torch.rand(n, k // 128, device="cuda") * 0.02 + 0.001)) for _ in range(launches)]
        w0, s0 = weights[0]
        reference = x.float() @ dequantize_int4(untile_int4(w0), s0).t()
        graphs, errors, failed = {}, {}, {}
        for name, config in configs.items():
            if time.perf_counter() - began > budget_s:
                failed[name] = "budget"
                continue
            try:
                out = matmul_kernels.quantized_matmul(x, w0, s0, "int4", config=config, x_words=x_words).float()
                errors[name] = ((out - reference).norm() / reference.norm()).item()
                if not errors[name] < 1e-2:
                    failed[name] = f"relative error {errors[name]:.3g}"
                    continue
                graphs[name] = graph_of([
                    lambda w=w, s=s, c=config: matmul_kernels.quantized_matmul(x, w, s, "int4", config=c,
                                                                              x_words=x_words)
                    for w, s in weights])
            except Exception as error:  # a config the compiler refuses (registers, shared memory)
                failed[name] = f"{type(error).__name__}: {str(error)[:200]}"
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
        best = sorted(medians, key=medians.get)[:8]
        result["shapes"][shape] = {"n": n, "k": k, "launches": launches, "us": times, "median_us": medians,
                                   "relative_error": errors, "failed": failed, "fastest": best}
        print(f"{shape}: table {medians.get('table', float('nan')):.2f} us; fastest "
              + ", ".join(f"{b} {medians[b]:.2f}" for b in best[:5])
              + f"; {len(failed)} failed; {time.perf_counter() - began:.0f} s", flush=True)
        del graphs, weights
        torch.cuda.empty_cache()
    timed = [name for name in configs if all(name in s["median_us"] for s in result["shapes"].values())]
    step_us = {name: sum(PER_STEP[shape] * s["median_us"][name] for shape, s in result["shapes"].items())
               for name in timed}
    result["step_matmuls_us"] = step_us
    result["one"] = min(step_us, key=step_us.get) if step_us else "table"
    result["per_shape"] = {shape: s["fastest"][0] for shape, s in result["shapes"].items() if s["fastest"]}
    print(f"step's 145 matmuls: table {step_us.get('table', float('nan')):.0f} us, {result['one']} "
          f"{step_us.get(result['one'], float('nan')):.0f} us; per shape {result['per_shape']} "
          f"{sum(PER_STEP[s] * result['shapes'][s]['median_us'][c] for s, c in result['per_shape'].items()):.0f} us",
          flush=True)
    with open(f"{out_dir}/int4_dp4a_grid2.json", "w") as f:
        json.dump(result, f, indent=1, default=str)
    return result


CONVERSIONS = [(groups, warps) for groups in (1, 2, 4, 8) for warps in (1, 2, 4)]


def int16_x_with(groups: int, warps: int):
    """``integer_dots.int16_x`` with ``groups`` groups of 128 inputs a program and ``warps`` warps (the module's:
    8 and 4)."""
    def convert(x):
        m, k = x.shape
        out = torch.empty((m, integer_dots.int16_x_words(k)), dtype=torch.int32, device=x.device)
        integer_dots._int16_x_kernel[(m, -(-(k // 128) // groups))](
            x, out, k, x.stride(0), out.stride(0), GROUPS=groups, GROUP=128, num_warps=warps)
        return out
    return convert


def conversions(out_dir: str) -> tuple[int, int]:
    """x's conversion launch (``int16_x``): 36 in one graph at o_proj's and down_proj's K, 5 rounds."""
    result = {"name": "int16_x_grid", "env": environment("cuda"), "rounds": ROUNDS, "replays": REPLAYS, "k": {}}
    for k in (4096, 12288):
        xs = [torch.randn(1, k, device="cuda", dtype=torch.bfloat16) for _ in range(36)]
        reference = integer_dots.int16_x(xs[0])
        graphs = {}
        for groups, warps in CONVERSIONS:
            convert = int16_x_with(groups, warps)
            assert torch.equal(convert(xs[0]), reference), (groups, warps)
            graphs[f"g{groups}-w{warps}"] = graph_of([lambda x=x: convert(x) for x in xs])
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
                times[name].append(start.elapsed_time(end) * 1000 / (REPLAYS * 36))
        result["k"][str(k)] = {"us": times, "median_us": {n: statistics.median(v) for n, v in times.items()}}
        print(f"int16_x at K={k}: " + ", ".join(f"{n} {statistics.median(v):.2f}" for n, v in times.items()),
              flush=True)
    total = {n: sum(r["median_us"][n] for r in result["k"].values()) for n in result["k"]["4096"]["median_us"]}
    best = min(total, key=total.get)
    result["best"] = best
    with open(f"{out_dir}/int16_x_grid.json", "w") as f:
        json.dump(result, f, indent=1, default=str)
    groups, warps = best[1:].split("-w")
    return int(groups), int(warps)


def step(out_dir: str, found: dict, conversion: tuple[int, int]) -> None:
    configs = grid()
    one = configs[found["one"]]
    by_shape = {SHAPES[shape]: configs[name] for shape, name in found["per_shape"].items()}
    plain_choose = matmul_kernels.choose_launch

    def choose_with(pick):
        def choose(method, m, n, k, num_sms, table=launch_config.LAUNCH_TABLE):
            config = pick(n, k) if method == "int4" and launch_config.regime(m, method) == "gemv" else None
            if config is None:
                return plain_choose(method, m, n, k, num_sms, table)
            return config, launch_config.choose_split_k(m, n, k, num_sms, config)
        return choose

    picks = {"int4-one": lambda n, k: one, "int4-shape": lambda n, k: by_shape.get((n, k)),
             "int4-one+conversion": lambda n, k: one}
    plain_build, plain_int16_x = quant_step.build, matmul_kernels.int16_x

    def build(mode, args):
        try:  # the graphs record the launches they capture: the choice matters only while building
            if mode in picks:
                matmul_kernels.choose_launch = choose_with(picks[mode])
            if mode == "int4-one+conversion":
                matmul_kernels.int16_x = int16_x_with(*conversion)
            return plain_build(mode, args)
        finally:
            matmul_kernels.choose_launch, matmul_kernels.int16_x = plain_choose, plain_int16_x

    for mode in picks:
        quant_step.MODES.setdefault(mode, {"quantization": "int4"})
    quant_step.build = build
    print(f"int4-one: {found['one']}; int4-one+conversion: int16_x with {conversion}", flush=True)
    quant_step.main(["--modes", ",".join(["bf16", "int4", *picks]), "--batches", "1,2,4", "--rounds", "5",
                     "--out", f"{out_dir}/m13_step_times_dp4a_grid2.json"])


if __name__ == "__main__":
    out = sys.argv[1] if len(sys.argv) > 1 else "."
    found = sweep(out, float(sys.argv[2]) if len(sys.argv) > 2 else 300.0)
    step(out, found, conversions(out))
