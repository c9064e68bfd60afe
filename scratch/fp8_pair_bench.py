"""Scratch (kept at one commit, run by one GPU call): one layer's paged decode kernel on an H200, bf16 cache against the FP8 paths.

    python scratch/fp8_pair_bench.py                                  # bf16, old FP8 (byte loads), new FP8 (words)
    python scratch/fp8_pair_bench.py --paths bf16,old,new,bits,cvt2   # also the evaluation's other widenings
    python scratch/fp8_pair_bench.py --new-configs 128:4:3,128:4:2,64:4:3,128:4:4   # the new path at other launches

Qwen3-0.6B's shape (16 query heads, 8 K/V heads, head_dim 128, 16-token blocks), each (batch, keys) of
``--shapes``; every sequence has ``keys`` keys in blocks scattered over the pool. Each path is timed with
``triton.testing.do_bench_cudagraph`` (median of its repetitions), paths interleaved A, B, C, A, B, C, ...
``--repeats`` times; the median of the repeats is printed as TB/s of K/V bytes read (batch x keys x 8 heads x 128
dims x 2 (K, V) x bytes a value). Each output is checked against a float32 attention of the same values (for FP8
the dequantized ones): relative RMS error.

Paths: ``bf16`` m08's kernel on a bf16 cache (LAUNCH_TABLE); ``old`` the FP8 kernel before this branch
(scratch/old_paged_decode_kernel.py: byte loads, FP8_LAUNCH_TABLE); ``new`` this branch's kernel (int16 word loads,
PTX prmt + cvt.rn.f16x2.e4m3x2); ``bits`` / ``cvt2`` the evaluation copy (scratch/eval_paged_decode_kernel.py)
with the e4m3 -> fp16 bit trick in PTX (7 instructions per 4 values) / two cvt then two prmt (4 per 4 values).
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

HEADS, KV_HEADS, HEAD_DIM, BLOCK = 16, 8, 128, 16


def load_copy(name: str, path: Path):
    """A copy of paged_decode_kernel.py imported inside m08's package (its relative imports resolve there)."""
    full = f"milestones.m08_triton_kernel.{name}"
    spec = importlib.util.spec_from_file_location(full, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[full] = module
    spec.loader.exec_module(module)
    return module


def reference(q, k, v, tables, keys):
    """float32 attention of each sequence's keys (k, v: float32 [num_blocks, BLOCK, KV_HEADS, HEAD_DIM])."""
    batch = q.shape[0]
    kk = k[tables.long()].reshape(batch, keys, KV_HEADS, HEAD_DIM).repeat_interleave(HEADS // KV_HEADS, dim=2)
    vv = v[tables.long()].reshape(batch, keys, KV_HEADS, HEAD_DIM).repeat_interleave(HEADS // KV_HEADS, dim=2)
    scores = torch.einsum("bhd,bthd->bht", q.float(), kk) * HEAD_DIM ** -0.5
    return torch.einsum("bht,bthd->bhd", scores.softmax(-1), vv)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--paths", default="bf16,old,new")
    parser.add_argument("--shapes", default="176x1024,64x2048", help="batch x keys, comma-separated")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rep-ms", type=int, default=100, help="do_bench_cudagraph's rep (ms of replays)")
    parser.add_argument("--new-configs", default="", help="tile:warps:stages,... extra launches of the new path")
    parser.add_argument("--out", type=Path, help="also write the figures as JSON here (with benchmarks.env)")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("needs CUDA")
        return 1
    import triton

    from milestones.m08_triton_kernel import paged_decode_kernel as new
    from milestones.m08_triton_kernel.launch_config import DecodeKernelConfig
    from milestones.m13_quantization.fp8_kv_cache import to_fp8

    old = load_copy("_old_paged_decode_kernel", ROOT / "scratch" / "old_paged_decode_kernel.py")
    paths = args.paths.split(",")
    evaluation = None
    if {"bits", "cvt2"} & set(paths):
        evaluation = load_copy("_eval_paged_decode_kernel", ROOT / "scratch" / "eval_paged_decode_kernel.py")
    configs = {}
    for text in filter(None, args.new_configs.split(",")):
        tile, warps, stages = map(int, text.split(":"))
        configs[f"new@t{tile}w{warps}s{stages}"] = DecodeKernelConfig(tile_tokens=tile, num_warps=warps,
                                                                      num_stages=stages)
    paths += list(configs)
    device = torch.device("cuda")
    records = []
    gen = torch.Generator(device=device).manual_seed(0)
    print(f"{torch.cuda.get_device_name()}  triton {triton.__version__}  torch {torch.__version__}")
    for shape in args.shapes.split(","):
        batch, keys = map(int, shape.split("x"))
        blocks_per_seq = keys // BLOCK
        num_blocks = batch * blocks_per_seq
        tables = torch.randperm(num_blocks, device=device, generator=gen).view(batch, blocks_per_seq).to(torch.int32)
        lens = torch.full((batch,), keys, dtype=torch.int32, device=device)
        q = torch.randn(batch, HEADS, HEAD_DIM, device=device, generator=gen).to(torch.bfloat16)
        k = torch.randn(num_blocks, BLOCK, KV_HEADS, HEAD_DIM, device=device, generator=gen).to(torch.bfloat16)
        v = torch.randn(num_blocks, BLOCK, KV_HEADS, HEAD_DIM, device=device, generator=gen).to(torch.bfloat16)
        k_scale = (k.float().abs().amax() / 200).reshape(1)
        v_scale = (v.float().abs().amax() / 100).reshape(1)
        k8, v8 = to_fp8(k, k_scale), to_fp8(v, v_scale)
        scales = dict(k_scale=k_scale, v_scale=v_scale)
        out = torch.empty_like(q)
        ref_bf16 = reference(q, k.float(), v.float(), tables, keys)
        ref_fp8 = reference(q, k8.float() * k_scale, v8.float() * v_scale, tables, keys)

        def call(path):
            """(function, bytes a value, reference) of one path."""
            if path == "bf16":
                return (lambda: new.paged_decode_attention(q, k, v, tables, lens, HEAD_DIM ** -0.5, out=out,
                                                           max_context_len=keys)), 2, ref_bf16
            if path == "old":
                return (lambda: old.paged_decode_attention(q, k8, v8, tables, lens, HEAD_DIM ** -0.5, out=out,
                                                           max_context_len=keys, **scales)), 1, ref_fp8
            if path == "new":
                return (lambda: new.paged_decode_attention(q, k8, v8, tables, lens, HEAD_DIM ** -0.5, out=out,
                                                           max_context_len=keys, **scales)), 1, ref_fp8
            if path in ("bits", "cvt2"):
                def run(widen={"bits": 1, "cvt2": 2}[path]):
                    evaluation.FP8_PAIRS, evaluation.FP8_WIDEN = True, widen
                    evaluation.paged_decode_attention(q, k8, v8, tables, lens, HEAD_DIM ** -0.5, out=out,
                                                      max_context_len=keys, **scales)
                return run, 1, ref_fp8
            config = configs[path]
            return (lambda: new.paged_decode_attention(q, k8, v8, tables, lens, HEAD_DIM ** -0.5, out=out,
                                                       max_context_len=keys, config=config, **scales)), 1, ref_fp8

        errors, times = {}, {path: [] for path in paths}
        for path in paths:  # warm up (compile) and check
            fn, _, ref = call(path)
            out.zero_()
            fn()
            torch.cuda.synchronize()
            errors[path] = ((out.float() - ref).pow(2).mean().sqrt() / ref.pow(2).mean().sqrt()).item()
        for _ in range(args.repeats):
            for path in paths:
                fn, _, _ = call(path)
                times[path].append(triton.testing.do_bench_cudagraph(fn, rep=args.rep_ms, return_mode="median"))
        print(f"\nbatch {batch} x {keys} keys (splits: {new.choose_launch(batch, KV_HEADS, keys, new.sm_count(device))[1]}"
              f" bf16, {new.choose_launch(batch, KV_HEADS, keys, new.sm_count(device), new.FP8_LAUNCH_TABLE)[1]} fp8)")
        base = None
        for path in paths:
            _, width, _ = call(path)
            ms = statistics.median(times[path])
            tbs = batch * keys * KV_HEADS * HEAD_DIM * 2 * width / (ms * 1e-3) / 1e12
            base = base or ms
            records.append({"batch": batch, "keys": keys, "path": path, "median_us": ms * 1e3, "tb_per_s": tbs,
                            "repeats_us": [t * 1e3 for t in times[path]], "rel_rms_error": errors[path]})
            print(f"  {path:16s} {ms * 1e3:8.1f} us  {tbs:5.2f} TB/s  x{base / ms:4.2f} vs {paths[0]}  "
                  f"rel RMS err {errors[path]:.5f}  (repeats {', '.join(f'{t * 1e3:.1f}' for t in times[path])} us)")
    if args.out:
        from benchmarks.env import environment, write_json

        write_json({"kind": "fp8_pair_bench", "env": environment(device), "paths": paths, "repeats": args.repeats,
                    "note": "one layer's paged decode kernel, do_bench_cudagraph medians, paths interleaved",
                    "results": records}, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
