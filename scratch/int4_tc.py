"""One GPU call: int4 at batch 1-16 on the tensor cores, with the nibbles turned into bf16 two at a time.

m13's tensor-core kernel (``_quantized_dot_kernel``) widens every nibble through float32: an OR, a subtraction, a
multiply by the group's scale and a conversion per weight, ~12 instructions a weight byte. Here a 32-bit word of 8
nibbles becomes 8 bf16 values in 4 shifts and 4 ``lop3`` (``(w >> 4p) & 0x000F000F | 0x43004300``: two nibbles at
once, each the bf16 128 + u), ~2 instructions a byte; the dot runs on 128 + u and takes 136 x sum(x) off per group
(u - 8 = (128 + u) - 136), and the group's scale multiplies the group's [16, BLOCK_N] result. A 16-row tile costs
the tensor cores what one row does, so batch 1, 4 and 16 cost about the same.

The step's 145 matmuls of qwen3-8b-random chained in one CUDA graph (a fixed x per matmul, outputs added into float32
with atomics, zeroed once per chain), 5 interleaved rounds: m13's GEMV (batch 1), m13's tensor-core kernel (batch
4), this kernel at batch 1, 4 and 16 for a few launches, and the stream-only chain. Each launch's output is first
checked against the float reference at every shape.

    python3 scratch/int4_tc.py OUT.json
"""

from __future__ import annotations

import json
import statistics
import sys
import time

import torch
import triton
import triton.language as tl

from benchmarks.env import environment
from milestones.common.demo import cuda_median_ms
from milestones.m13_quantization.matmul_kernels import quantized_matmul, quantized_matmul_reference
from milestones.m13_quantization.quantize import tile_int4

LAYER = ((6144, 4096), (4096, 4096), (24576, 4096), (4096, 12288))
HEAD = (151936, 4096)
GROUP = 128
WORDS = 16  # int32 words of one row's group


@triton.jit
def _pair(words, SHIFT: tl.constexpr):
    """Nibbles SHIFT/4 and SHIFT/4 + 4 of each word as bf16 bits of 128 + u (two int16)."""
    if SHIFT == 0:
        lo, hi = tl.inline_asm_elementwise(
            "{ .reg .b32 t; lop3.b32 t, $2, 0x000F000F, 0x43004300, 0xea; mov.b32 {$0, $1}, t; }",
            "=h,=h,r", [words], dtype=(tl.int16, tl.int16), is_pure=True, pack=1)
    elif SHIFT == 4:
        lo, hi = tl.inline_asm_elementwise(
            "{ .reg .b32 t; shr.u32 t, $2, 4; lop3.b32 t, t, 0x000F000F, 0x43004300, 0xea; mov.b32 {$0, $1}, t; }",
            "=h,=h,r", [words], dtype=(tl.int16, tl.int16), is_pure=True, pack=1)
    elif SHIFT == 8:
        lo, hi = tl.inline_asm_elementwise(
            "{ .reg .b32 t; shr.u32 t, $2, 8; lop3.b32 t, t, 0x000F000F, 0x43004300, 0xea; mov.b32 {$0, $1}, t; }",
            "=h,=h,r", [words], dtype=(tl.int16, tl.int16), is_pure=True, pack=1)
    else:
        lo, hi = tl.inline_asm_elementwise(
            "{ .reg .b32 t; shr.u32 t, $2, 12; lop3.b32 t, t, 0x000F000F, 0x43004300, 0xea; mov.b32 {$0, $1}, t; }",
            "=h,=h,r", [words], dtype=(tl.int16, tl.int16), is_pure=True, pack=1)
    return lo.to(tl.bfloat16, bitcast=True), hi.to(tl.bfloat16, bitcast=True)


@triton.jit
def _tc_kernel(x_ptr, w_ptr, s_ptr, out_ptr, M, N, K, k_per_split, stride_xm, stride_sn,
               BLOCK_N: tl.constexpr, STAGES: tl.constexpr):
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rows = tl.arange(0, 16)
    row_ok = rows < M
    j = tl.arange(0, 16)
    w_rows = w_ptr + ((cols // 16) * (K // 128) * 256 + (cols % 16) * 16)[:, None]  # tiles of int32 words
    c = tl.arange(0, 128)  # column c = 8 w + 2 p + h of the unpacked tile holds input 4w + p//2 + 2h + 64 (p % 2)
    e = c % 8
    perm = 4 * (c // 8) + (e // 2) // 2 + 2 * (e % 2) + 64 * ((e // 2) % 2)
    acc = tl.zeros([16, BLOCK_N], tl.float32)
    k_start = pid_k * k_per_split
    for kg in tl.range(k_start, k_start + k_per_split, 128, num_stages=STAGES):
        g = kg // 128
        words = tl.load(w_rows + (g * 256 + j)[None, :])  # [BLOCK_N, 16]
        scale = tl.load(s_ptr + cols * stride_sn + g)
        x = tl.load(x_ptr + rows[:, None] * stride_xm + (kg + perm)[None, :], mask=row_ok[:, None], other=0.0)
        x = x.to(tl.bfloat16)
        l0, h0 = _pair(words, 0)
        l1, h1 = _pair(words, 4)
        l2, h2 = _pair(words, 8)
        l3, h3 = _pair(words, 12)
        tile = tl.join(tl.join(tl.join(l0, h0), tl.join(l1, h1)), tl.join(tl.join(l2, h2), tl.join(l3, h3)))
        tile = tl.reshape(tile, [BLOCK_N, 128])
        part = tl.dot(x, tl.trans(tile))  # [16, BLOCK_N]: sum x (128 + u)
        xsum = tl.sum(x.to(tl.float32), axis=1)
        acc += (part - 136.0 * xsum[:, None]) * scale[None, :]
    out = out_ptr + rows[:, None] * N + cols[None, :]
    tl.atomic_add(out, acc, mask=row_ok[:, None], sem="relaxed")


def tc_matmul(x, words, scales, out, n, k, block_n, split, stages, warps):
    k_per_split = k // split
    _tc_kernel[(n // block_n, split)](x, words, scales, out, x.shape[0], n, k, k_per_split, x.stride(0),
                                     scales.stride(0), BLOCK_N=block_n, STAGES=stages, num_warps=warps)


def splits_for(n, k, block_n, sms, per_sm):
    programs = n // block_n
    split = 1
    while programs * split < per_sm * sms and (k // 128) % (split * 2) == 0 and split < 16:
        split *= 2
    return split


def graphed(fn):
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph


LAUNCHES = [(64, 4, 3, 2), (64, 4, 4, 2), (128, 4, 3, 2), (64, 4, 3, 4), (32, 4, 3, 4)]  # block_n, warps, stages, /SM


def main(out_path: str) -> None:
    began = time.perf_counter()
    dev = torch.device("cuda")
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    shapes = [s for _ in range(36) for s in LAYER] + [HEAD]
    weights = {}
    for n, k in set(shapes):  # one weight per shape, reused by its 36 layers: the chain reads each from DRAM
        packed = torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, device=dev)
        weights[n, k] = (tile_int4(packed), torch.rand(n, k // 128, device=dev) * 0.01)
    # a weight per layer, so that every matmul reads DRAM (4 GB in all, as the step)
    layer_weights = [(tile_int4(torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, device=dev)),
                      torch.rand(n, k // 128, device=dev) * 0.01) for n, k in shapes]
    xs = {m: {k: torch.randn(m, k, dtype=torch.bfloat16, device=dev) for k in (4096, 12288)} for m in (1, 4, 16)}
    outs = torch.zeros(16 * sum(n for n, _ in shapes), dtype=torch.float32, device=dev)
    result = {"name": "int4_tc", "env": environment("cuda"), "launches": LAUNCHES, "errors": {}, "check": {}}

    # correctness: each launch at each shape against the float reference (batch 4)
    for launch in LAUNCHES:
        block_n, warps, stages, per_sm = launch
        worst = 0.0
        for (n, k), (w, s) in weights.items():
            x = xs[4][k]
            out = torch.zeros(4, n, dtype=torch.float32, device=dev)
            try:
                tc_matmul(x, w.view(torch.int32), s, out, n, k, block_n, splits_for(n, k, block_n, sms, per_sm),
                          stages, warps)
            except Exception as error:
                result["errors"][str(launch)] = f"{type(error).__name__}: {error}"[:2000]
                print(f"{launch}: {result['errors'][str(launch)]}", flush=True)
                break
            ref = quantized_matmul_reference(x.float(), w, s, "int4")
            worst = max(worst, ((out - ref).norm() / ref.norm()).item())
        result["check"][str(launch)] = worst
        print(f"launch {launch}: worst relative error vs the float reference {worst:.2e}", flush=True)

    def chain_tc(m, launch):
        block_n, warps, stages, per_sm = launch
        def run():
            outs.zero_()
            offset = 0
            for (n, k), (w, s) in zip(shapes, layer_weights):
                tc_matmul(xs[m][k], w.view(torch.int32), s, outs[offset:offset + m * n].view(m, n), n, k, block_n,
                          splits_for(n, k, block_n, sms, per_sm), stages, warps)
                offset += m * n
        return run

    def chain_m13(m):
        def run():
            for (n, k), (w, s) in zip(shapes, layer_weights):
                quantized_matmul(xs[m][k], w, s, "int4")
        return run

    fns = {"m13-int4-b1": chain_m13(1), "m13-int4-b4": chain_m13(4)}
    good = [l for l in LAUNCHES if str(l) not in result["errors"] and result["check"].get(str(l), 1) < 1e-2]
    for launch in good:
        fns[f"tc-b1 {launch}"] = chain_tc(1, launch)
    if good:
        fns[f"tc-b4 {good[0]}"] = chain_tc(4, good[0])
        fns[f"tc-b16 {good[0]}"] = chain_tc(16, good[0])
    graphs = {}
    for name, fn in fns.items():
        try:
            graphs[name] = graphed(fn)
        except Exception as error:
            result["errors"][name] = f"{type(error).__name__}: {error}"[:2000]
            print(f"{name}: {result['errors'][name]}", flush=True)
    times = {name: [] for name in graphs}
    for round_ in range(5):
        for name, graph in graphs.items():
            times[name].append(cuda_median_ms(graph.replay, 20))
        print(f"round {round_ + 1}: " + ", ".join(f"{n} {t[-1]:.3f}" for n, t in times.items()), flush=True)
    result["ms"] = times
    result["summary"] = {n: {"median_ms": statistics.median(t), "min_ms": min(t), "max_ms": max(t)}
                         for n, t in times.items()}
    for n, s in result["summary"].items():
        print(f"{n}: {s['median_ms']:.3f} ms ({s['min_ms']:.3f}-{s['max_ms']:.3f})", flush=True)
    result["total_s"] = time.perf_counter() - began
    with open(out_path, "w") as f:
        json.dump(result, f, indent=1, default=str)
    print(f"-> {out_path}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "int4_tc.json")
