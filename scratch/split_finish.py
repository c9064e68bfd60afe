"""Call 42: int4 split-K finished by the last program of each row block (no zeroed float32 output, no cast launch)
against float32 atomics (the kernel at 31039da, scratch/old_matmul_kernels.py).

1. Per Qwen3-8B shape at batch 1: the table's launch on both kernels, then a grid of rows per program x slices of
   K on the new kernel (GPU time from CUDA graphs, weights rotated over copies of 4x the L2 cache), each output
   checked against bf16 on the dequantized weight, before and after its timed replays; a split launch repeated
   30 times must give the same bits, and leave its counters at zero.
2. The decode step of qwen3-8b-random at batch 1 and 2 (512 keys) in 5 interleaved rounds: bf16, int4 before
   (atomics), int4 now (same table), int4 with the grid's fastest launch per shape.

    python3 scratch/split_finish.py OUT_DIR
"""

from __future__ import annotations

import dataclasses
import json
import sys

import torch

import benchmarks.quant_step as quant_step
import scratch.old_matmul_kernels as old
from benchmarks import quant_bench
from benchmarks.env import environment
from benchmarks.kernel_bench import Timing
from milestones.m08_triton_kernel.launch_config import sm_count
from milestones.m13_quantization import matmul_kernels as new
from milestones.m13_quantization.launch_config import choose_launch

GRID_ROWS = (8, 16, 32, 64)
GRID_SPLITS = (1, 2, 4, 8)
DEVICE = "cuda"  # a CPU smoke test patches this


def grid(out_dir: str) -> dict:
    device = torch.device(DEVICE)
    timing, num_sms = Timing(device), sm_count(device)
    result = {"name": "int4_split_finish", "env": environment(DEVICE), "timing": timing.describe("the weight"),
              "shapes": {}, "best": {}, "determinism": {}}
    for name, (n, k) in quant_bench.QWEN3_8B_SHAPES.items():
        weights = quant_bench.make_weights(n, k, "int4", device, seed=1)
        x = torch.randn((1, k), device=device, dtype=torch.bfloat16)
        expected = quant_bench.reference(weights, x)
        config, split = choose_launch("int4", 1, n, k, num_sms)
        cases = {"before: atomics, table": (old.quantized_matmul, config, split),
                 "now: table": (new.quantized_matmul, config, split)}
        for rows in GRID_ROWS:
            for slices in GRID_SPLITS:
                if k // slices >= config.block_k:
                    cases[f"n{rows} split {slices}"] = (new.quantized_matmul,
                                                        dataclasses.replace(config, block_n=rows), slices)
        rows_out = {}
        for label, (fn, cfg, slices) in cases.items():
            path = [lambda w=w, s=s, fn=fn, cfg=cfg, slices=slices: fn(x, w, s, "int4", config=cfg, split_k=slices)
                    for w, s in weights.tensors]
            error = quant_bench.relative_error(path[0](), expected)
            us = timing.gpu_ms(path) * 1e3
            error_after = quant_bench.relative_error(path[-1](), expected)
            rows_out[label] = {"us": us, "block_n": cfg.block_n, "split": slices, "error": error,
                               "error_after_replays": error_after, "gbs": weights.nbytes / us / 1e3}
            print(f"{name:13s} {label:24s} {us:8.1f} us  {weights.nbytes / us / 1e3:6.0f} GB/s  err {error:.1e} "
                  f"/ {error_after:.1e}", flush=True)
            assert error < 2e-2 and error_after < 2e-2, (name, label, error, error_after)
        result["shapes"][name] = {"n": n, "k": k, "table": {"block_n": config.block_n, "split": split},
                                  "copies": len(weights.tensors), "cases": rows_out}
        best = min((label for label in rows_out if label.startswith("n")), key=lambda lb: rows_out[lb]["us"])
        result["best"][name] = {"label": best, **rows_out[best]}
        w, s = weights.tensors[0]
        cfg = dataclasses.replace(config, block_n=rows_out[best]["block_n"])
        slices = max(2, rows_out[best]["split"])
        first = new.quantized_matmul(x, w, s, "int4", config=cfg, split_k=slices)
        same = all(torch.equal(first, new.quantized_matmul(x, w, s, "int4", config=cfg, split_k=slices))
                   for _ in range(30))
        if device.type == "cuda":
            torch.cuda.synchronize()
        counters_zero = not any(c.any().item() for c in new._COUNTERS.values())
        result["determinism"][name] = {"block_n": cfg.block_n, "split": slices, "same_bits_30x": same,
                                       "counters_zero": counters_zero}
        print(f"{name}: split {slices} x30 same bits {same}, counters zero {counters_zero}", flush=True)
        del weights
        torch.cuda.empty_cache()
    with open(f"{out_dir}/int4_split_finish.json", "w") as f:
        json.dump(result, f, indent=1, default=str)
    return result


def tuned_choose_launch(best: dict, shapes: dict):
    by_shape = {(shapes[name]["n"], shapes[name]["k"]): row for name, row in best.items()}

    def choose(method, m, n, k, num_sms, table=None):
        config, split = choose_launch(method, m, n, k, num_sms)
        row = by_shape.get((n, k))
        if method == "int4" and config.kernel == "gemv" and row is not None:
            return dataclasses.replace(config, block_n=row["block_n"]), row["split"]
        return config, split

    return choose


def step_ab(out_dir: str, result: dict) -> None:
    table_build = quant_step.build
    tuned = tuned_choose_launch(result["best"], result["shapes"])

    def build(mode, args):
        saved = new.quantized_matmul, new.choose_launch
        if mode == "int4-before":
            new.quantized_matmul = old.quantized_matmul  # QuantizedLinear imports it at each call
        elif mode == "int4-tuned":
            new.choose_launch = tuned
        try:
            return table_build(mode, args)  # its graphs capture these launches
        finally:
            new.quantized_matmul, new.choose_launch = saved

    quant_step.MODES["int4-before"] = {"quantization": "int4"}
    quant_step.MODES["int4-tuned"] = {"quantization": "int4"}
    quant_step.build = build
    quant_step.main(["--modes", "bf16,int4-before,int4,int4-tuned", "--batches", "1,2", "--rounds", "5",
                     "--out", f"{out_dir}/m13_step_times_split_finish.json"])


if __name__ == "__main__":
    out = sys.argv[1] if len(sys.argv) > 1 else "."
    step_ab(out, grid(out))
