"""int4 at 33-512 rows of x with W's tile as the tensor cores' A operand (registers), x as B (shared memory).

m13's large regime unpacks W into a bf16 scratch and calls cuBLAS (0.44-0.46x bf16's step at batch 64); its dot
kernel puts the unpacked W tile in the B operand (through shared memory). Here out^T = W x^T: each program holds
BLOCK_N rows of W (the wgmma's M) and BLOCK_M rows of x (its N, up to 256), so W is read once for up to 256 rows.
Run on the GPU: python scratch/int4_wide.py --out DIR  (the float32 check, then each shape and M, interleaved).
Compile here: python scratch/int4_wide.py --compile  (PTX: wgmma with a register A, shared stores in the loop).
"""
from __future__ import annotations

import argparse
import json
import os
import sys

if "--compile" in sys.argv:
    os.environ["TRITON_INTERPRET"] = "0"
import torch
import triton
import triton.language as tl

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from milestones.m13_quantization.weight_unpacking import MAGIC, _int4_rows, _unpack_int4  # noqa: E402

GROUP = 128


@triton.jit
def _int4_wide_kernel(x_ptr, w_ptr, s_ptr, out_ptr, M, N, K, stride_xm, stride_sn, stride_sg, stride_om,
                      BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr, GROUP: tl.constexpr,
                      SCALE_AFTER: tl.constexpr, STAGES: tl.constexpr, GROUP_N: tl.constexpr,
                      SPLIT: tl.constexpr = 1):
    pid = tl.program_id(0)
    split = tl.program_id(1)  # slices of K: each writes float32 sums to its own plane of out (summed after)
    num_m = tl.cdiv(M, BLOCK_M)
    pid_m = pid % num_m  # the programs of one W tile run side by side: W from memory about once
    pid_n = pid // num_m
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < M
    HALF: tl.constexpr = GROUP // 2
    j = tl.arange(0, HALF)
    w_rows, group_stride = _int4_rows(w_ptr, cols, 0, K, True, HALF, GROUP)
    acc = tl.zeros([BLOCK_N, BLOCK_M], tl.float32)
    per_split = K // GROUP // SPLIT
    for g in tl.range(split * per_split, (split + 1) * per_split, num_stages=STAGES):
        b = tl.load(w_rows + (g * group_stride + j)[None, :]).to(tl.int32)  # [BLOCK_N, HALF]
        scale = tl.load(s_ptr + cols * stride_sn + g * stride_sg)[:, None]
        lo, hi = _unpack_int4(b, MAGIC)
        xt = x_ptr + rows[None, :] * stride_xm + (g * GROUP + j)[:, None]  # [HALF, BLOCK_M]: x^T
        x_lo = tl.load(xt, mask=row_ok[None, :], other=0.0)
        x_hi = tl.load(xt + HALF, mask=row_ok[None, :], other=0.0)
        if SCALE_AFTER:  # -8..7 are exact in bf16: one rounding less, one FMA per output and group more
            part = tl.dot(lo.to(x_lo.dtype), x_lo)
            part = tl.dot(hi.to(x_lo.dtype), x_hi, part)
            acc += part * scale
        else:
            acc = tl.dot((lo * scale).to(x_lo.dtype), x_lo, acc)
            acc = tl.dot((hi * scale).to(x_lo.dtype), x_hi, acc)
    out = out_ptr + split * M * N + rows[None, :] * stride_om + cols[:, None]
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=row_ok[None, :])


def int4_wide(x, qweight, scales, n, k, block_n=128, block_m=64, warps=4, stages=3, scale_after=False,
              group_n=1, warmup_only=False, split=1):
    m = x.shape[0]
    out = x.new_empty((m, n)) if split == 1 else torch.empty((split, m, n), device=x.device)
    grid = (triton.cdiv(m, block_m) * (n // block_n), split)
    args = (x, qweight, scales, out, m, n, k, x.stride(0), scales.stride(0), scales.stride(1), out.stride(-2))
    kw = dict(BLOCK_N=block_n, BLOCK_M=block_m, GROUP=GROUP, SCALE_AFTER=scale_after, STAGES=stages,
              GROUP_N=group_n, SPLIT=split, num_warps=warps, num_stages=stages)
    if warmup_only:
        return _int4_wide_kernel.warmup(*args, grid=grid, **kw)
    _int4_wide_kernel[grid](*args, **kw)
    return out if split == 1 else out.sum(0).to(x.dtype)


CONFIGS = {  # name: (block_n, block_m, warps, stages, scale_after[, split]); split 0: enough programs for 2 an SM
    "n128-m64-w4-s3": (128, 64, 4, 3, False),
    "n64-m64-w4-s4": (64, 64, 4, 4, False),
    "n64-m128-w4-s3": (64, 128, 4, 3, False),
    "n128-m128-w8-s3": (128, 128, 8, 3, False),
    "n128-m64-w8-s3": (128, 64, 8, 3, False),
    "n256-m64-w8-s3": (256, 64, 8, 3, False),
    "n64-m64-w4-s4 split": (64, 64, 4, 4, False, 0),
    "n128-m64-w8-s3 split": (128, 64, 8, 3, False, 0),
    "n64-m128-w4-s3 split": (64, 128, 4, 3, False, 0),
}


def auto_split(m, n, k, block_n, block_m, num_sms=132, per_sm=2):
    """The fewest equal slices of K's groups that give at least per_sm programs an SM."""
    programs = triton.cdiv(m, block_m) * (n // block_n)
    groups = k // GROUP
    for s in range(1, groups + 1):
        if groups % s == 0 and programs * s >= per_sm * num_sms:
            return s
    return groups
SHAPES = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (24576, 4096), "down": (4096, 12288),
          "lm_head": (151936, 4096)}


def compile_here():
    import re
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
    from compile_for_gpu import TargetOnlyDriver
    from triton.backends.compiler import GPUTarget
    from triton.runtime.driver import driver
    driver.set_active(TargetOnlyDriver(GPUTarget("cuda", 90, 32)))
    n, k = 4096, 4096
    w = torch.zeros(n // 16, k // GROUP, 16, 64, dtype=torch.uint8)
    s = torch.ones(k // GROUP, n).t()
    for name, c in CONFIGS.items():
        bn, bm = c[:2]
        for m in sorted({64, bm}):
            x = torch.zeros(m, k, dtype=torch.bfloat16)
            kk = int4_wide(x, w, s, n, k, *c[:5], warmup_only=True, split=2 if len(c) > 5 else 1)
            ptx = kk.asm["ptx"]
            wg = re.findall(r"wgmma\.mma_async[^\n]*", ptx)
            print(f"{name:24s} m={m:3d} shared={kk.metadata.shared:6d} wgmma={len(wg)} "
                  f"reg-A={sum('{' in l.split(',', 1)[1][:40] for l in wg) if wg else 0} "
                  f"st.shared={ptx.count('st.shared')} ld.shared={ptx.count('ld.shared')} "
                  f"ldmatrix={ptx.count('ldmatrix')} cp.async={ptx.count('cp.async')}")
            if wg:
                print("   ", wg[0].split("}", 1)[1][:90])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--out", default=None)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--ms", default="64,128,256")
    ap.add_argument("--shapes", default=",".join(SHAPES))
    args = ap.parse_args()
    if args.compile:
        return compile_here()
    run_gpu(args)


def run_gpu(args):
    from milestones.m13_quantization.dequant_matmul import quantized_matmul_reference
    from milestones.m13_quantization.matmul_kernels import quantized_matmul
    from milestones.m13_quantization.quantize import QuantizedLinear
    torch.manual_seed(0)
    dev = "cuda"
    ms = [int(v) for v in args.ms.split(",")]
    results = {"check": [], "timing": []}
    # float32 check first: every config against the float reference, on a small shape
    n, k = 512, 1024
    lin = torch.nn.Linear(k, n, bias=False)
    q = QuantizedLinear.from_linear(lin.to(dev), "int4")
    for m in (33, 64, 100, 256):
        x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
        ref = quantized_matmul_reference(x.float(), q.qweight, q.scales, "int4")
        for name, c in CONFIGS.items():
            bn, bm, warps, stages, after = c[:5]
            sp = auto_split(m, n, k, bn, bm) if len(c) > 5 else 1
            out = int4_wide(x, q.qweight, q.scales, n, k, bn, bm, warps, stages, after, split=sp).float()
            err = ((out - ref).norm() / ref.norm()).item()
            results["check"].append({"m": m, "config": name, "rel_error": err})
            assert err < 1e-2, (m, name, err)
    print("check: every config within 1e-2 of the float reference (max",
          max(c["rel_error"] for c in results["check"]), ")")

    def graph_time(fn, reps=20):
        s = torch.cuda.Stream()
        with torch.cuda.stream(s):
            fn()
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for _ in range(reps):
                fn()
        g.replay(); torch.cuda.synchronize()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(); g.replay(); b.record(); torch.cuda.synchronize()
        return a.elapsed_time(b) * 1000 / reps

    copies = 4
    for shape in args.shapes.split(","):
        n, k = SHAPES[shape]
        ws = [torch.randn(n, k, device=dev, dtype=torch.bfloat16) * 0.02 for _ in range(2 if n > 100000 else copies)]
        qs = []
        for w in ws:
            lin = torch.nn.Linear(k, n, bias=False, device=dev, dtype=torch.bfloat16)
            lin.weight.data.copy_(w)
            qs.append(QuantizedLinear.from_linear(lin, "int4"))
        for m in ms:
            x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
            cands = {"bf16 cuBLAS": lambda i: torch.nn.functional.linear(x, ws[i]),
                     "m13 table": lambda i: quantized_matmul(x, qs[i].qweight, qs[i].scales, "int4")}
            for name, c in CONFIGS.items():
                bn, bm = c[:2]
                if bm > 64 and m <= 64:
                    continue
                sp = auto_split(m, n, k, bn, bm) if len(c) > 5 else 1
                if len(c) > 5 and sp == 1:
                    continue
                cands[f"wide {name}{sp if sp > 1 else ''}"] = (
                    lambda i, c=c[:5], sp=sp: int4_wide(x, qs[i].qweight, qs[i].scales, n, k, *c, split=sp))
            times = {c: [] for c in cands}
            for _ in range(args.rounds):
                for c, fn in cands.items():
                    cnt = [0]

                    def step(fn=fn):
                        fn(cnt[0] % len(qs)); cnt[0] += 1
                    times[c].append(graph_time(step))
            for c, ts in times.items():
                ts.sort()
                rec = {"shape": shape, "n": n, "k": k, "m": m, "candidate": c, "us_median": ts[len(ts) // 2],
                       "us_min": ts[0], "us_max": ts[-1]}
                results["timing"].append(rec)
                print(f"{shape:8s} m={m:3d} {c:28s} {rec['us_median']:8.1f} us ({ts[0]:.1f}-{ts[-1]:.1f})")
            del x
        del ws, qs
        torch.cuda.empty_cache()
    if args.out:
        sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
        from benchmarks.env import environment
        results["env"] = environment()
        json.dump(results, open(os.path.join(args.out, "int4_wide.json"), "w"), indent=1)


if __name__ == "__main__":
    main()
