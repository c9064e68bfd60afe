"""One GPU call, under Nsight Compute if the machine has it: why does m13's batch-1 int4 GEMV take 3-9 us more
than a kernel that only streams its bytes, even with every weight byte already in L2 (call 63)?

Launches each batch-1 GEMV shape of qwen3-8b-random 3 times over distinct weights (eagerly, each a kernel of
its own) and prints the shapes in launch order; ``scratch/gemv_ncu.sh`` runs it under ncu.

    python3 scratch/gemv_ncu.py [SHAPE ...]
"""

from __future__ import annotations

import sys

import torch

from milestones.m13_quantization import matmul_kernels as mk

SHAPES = {"qkv_proj": (6144, 4096), "o_proj": (4096, 4096), "gate_up": (24576, 4096), "down_proj": (4096, 12288),
          "lm_head": (151936, 4096)}


def main() -> None:
    names = sys.argv[1:] or list(SHAPES)
    order = []
    for shape in names:
        n, k = SHAPES[shape]
        ws = [(torch.randint(0, 256, (n // 16, k // 128, 16, 64), dtype=torch.uint8, device="cuda"),
               (torch.rand(k // 128, n, device="cuda") * 0.01).t()) for _ in range(3)]
        x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
        for i in range(3):
            mk.quantized_matmul(x, *ws[i % 3], "int4")
            order.append(shape)
        torch.cuda.synchronize()
    print("launches in order:", order)


if __name__ == "__main__":
    main()
