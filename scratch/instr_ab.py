"""Call 43: the int4 GEMV three ways, in one call: before this session (float32 atomics and the table at 31039da,
scratch/old_matmul_kernels.py), with the split finished by its last program and the table of call 42
(scratch/split_matmul_kernels.py, b76a232), and now (fewer instructions a word in the loop as well).

1. Per Qwen3-8B shape at batch 1, each way's table launch: GPU time from CUDA graphs (weights rotated over copies
   of 4x the L2 cache), the output checked against bf16 on the dequantized weight.
2. The decode step of qwen3-8b-random at batch 1 and 2 (512 keys) in 5 interleaved rounds: bf16, int8, and int4
   each way.

    python3 scratch/instr_ab.py OUT_DIR
"""

from __future__ import annotations

import json
import sys

import torch

import benchmarks.quant_step as quant_step
import scratch.old_matmul_kernels as before
import scratch.split_matmul_kernels as split
from benchmarks import quant_bench
from benchmarks.env import environment
from benchmarks.kernel_bench import Timing
from milestones.m13_quantization import matmul_kernels as now
from milestones.m13_quantization.launch_config import LAUNCH_TABLE, QuantMatmulConfig

OLD_INT4_GEMV = {"gemv": QuantMatmulConfig("gemv", block_n=32, block_k=256, num_warps=1, num_stages=3),
                 "gemv long rows": QuantMatmulConfig("gemv", block_n=32, block_k=256, num_warps=1, num_stages=3,
                                                     min_programs_per_sm=3)}


def old_choose_launch(method, m, n, k, num_sms, table=LAUNCH_TABLE):
    """The launch choice at 31039da: 16 or 8 rows where 32 give fewer than 2 programs per SM, K in slices only for
    rows of 8,192 inputs or more."""
    config = table[method]["gemv" if m <= 2 else "small" if m <= 32 else "large" if m <= 512 else "prefill"]
    if method == "int4" and config.kernel == "gemv":
        config = OLD_INT4_GEMV["gemv"]
        if k >= 8192 and -(-n // 32) < 2 * num_sms:
            config = OLD_INT4_GEMV["gemv long rows"]
        else:
            while config.block_n > 8 and -(-n // config.block_n) < 2 * num_sms:
                config = QuantMatmulConfig("gemv", block_n=config.block_n // 2, block_k=256, num_warps=1,
                                           num_stages=3)
    programs = -(-n // config.block_n)
    wanted = -(-config.min_programs_per_sm * num_sms // programs)
    return config, (1 if config.kernel != "gemv" else max(1, min(wanted, k // config.block_k, 16)))


WAYS = {"before": before, "split": split, "now": now}
DEVICE = "cuda"  # a CPU smoke test patches this
before.choose_launch = old_choose_launch  # its own launch choice, not today's table


def shapes(out_dir: str) -> dict:
    device = torch.device(DEVICE)
    timing = Timing(device)
    result = {"name": "int4_gemv_ways", "env": environment(DEVICE), "timing": timing.describe("the weight"),
              "shapes": {}}
    for name, (n, k) in quant_bench.QWEN3_8B_SHAPES.items():
        weights = quant_bench.make_weights(n, k, "int4", device, seed=1)
        x = torch.randn((1, k), device=device, dtype=torch.bfloat16)
        expected = quant_bench.reference(weights, x)
        row = {}
        for way, module in WAYS.items():
            path = [lambda w=w, s=s, module=module: module.quantized_matmul(x, w, s, "int4")
                    for w, s in weights.tensors]
            error = quant_bench.relative_error(path[0](), expected)
            us = timing.gpu_ms(path) * 1e3
            row[way] = {"us": us, "error": error, "gbs": weights.nbytes / us / 1e3}
            print(f"{name:13s} {way:7s} {us:8.1f} us  {weights.nbytes / us / 1e3:6.0f} GB/s  err {error:.1e}",
                  flush=True)
            assert error < 2e-2, (name, way, error)
        result["shapes"][name] = {"n": n, "k": k, "bytes": weights.nbytes, **row}
        del weights
        if device.type == "cuda":
            torch.cuda.empty_cache()
    with open(f"{out_dir}/int4_gemv_ways.json", "w") as f:
        json.dump(result, f, indent=1, default=str)
    return result


def step_ab(out_dir: str) -> None:
    table_build = quant_step.build

    def build(mode, args):
        saved = now.quantized_matmul
        if mode in ("int4-before", "int4-split"):
            now.quantized_matmul = WAYS[mode.split("-")[1]].quantized_matmul  # QuantizedLinear imports it per call
        try:
            return table_build(mode, args)  # its graphs capture these launches
        finally:
            now.quantized_matmul = saved

    quant_step.MODES["int4-before"] = {"quantization": "int4"}
    quant_step.MODES["int4-split"] = {"quantization": "int4"}
    quant_step.build = build
    quant_step.main(["--modes", "bf16,int8,int4-before,int4-split,int4", "--batches", "1,2", "--rounds", "5",
                     "--out", f"{out_dir}/m13_step_times_ways.json"])


if __name__ == "__main__":
    out = sys.argv[1] if len(sys.argv) > 1 else "."
    shapes(out)
    step_ab(out)
