"""One GPU call, under Nsight Compute if the machine has it: why does m13's batch-1 int4 GEMV take 3-9 us more
than a kernel that only streams its bytes, even with every weight byte already in L2 (call 63)?

Launches each batch-1 GEMV shape of qwen3-8b-random 3 times over distinct weights (eagerly, each a kernel of
its own), then, as a control, a kernel that only streams the same bytes (4 programs of 4 warps per SM, one
multiply-add per 32-bit word: call 27's floor), and prints the launches in order; ``scratch/gemv_ncu.sh`` runs it
under ncu.

    python3 scratch/gemv_ncu.py [SHAPE ...]
"""

from __future__ import annotations

import sys

import torch
import triton
import triton.language as tl

from milestones.m13_quantization import matmul_kernels as mk

SHAPES = {"qkv_proj": (6144, 4096), "o_proj": (4096, 4096), "gate_up": (24576, 4096), "down_proj": (4096, 12288),
          "lm_head": (151936, 4096)}


BLOCK = 512


@triton.jit
def _stream_kernel(w_ptr, out_ptr, n_words, iters, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    acc = tl.zeros([BLOCK], tl.float32)
    base = tl.program_id(0) * iters * BLOCK
    for i in tl.range(0, iters, num_stages=3):
        idx = base + i * BLOCK + offs
        acc += tl.load(w_ptr + idx, mask=idx < n_words, other=0).to(tl.float32, bitcast=True)
    tl.store(out_ptr + tl.program_id(0), tl.sum(acc))


def stream(words: torch.Tensor, out: torch.Tensor) -> None:
    programs = 4 * torch.cuda.get_device_properties(0).multi_processor_count
    iters = triton.cdiv(words.numel(), programs * BLOCK)
    _stream_kernel[(triton.cdiv(words.numel(), iters * BLOCK),)](words, out, words.numel(), iters, BLOCK=BLOCK,
                                                                 num_warps=4)


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
    out = torch.empty(8192, device="cuda")
    for shape in names:
        n, k = SHAPES[shape]
        words = torch.randint(0, 2**20, (n * k // 8 + n * k // 128,), dtype=torch.int32, device="cuda")  # + scales
        stream(words, out)
        order.append(f"{shape} stream")
    torch.cuda.synchronize()
    print("launches in order:", order)


if __name__ == "__main__":
    main()
