"""Compile m13's Triton kernels for a GPU on a machine without one (the machinery of ``compile_for_gpu.py``).

The CPU tests run the quantized matmuls and the FP8 K/V kernels in Triton's interpreter, which never type-checks
them. This script runs the real wrappers on small CPU tensors with every launch replaced by a compile for sm_90 (the
H200): the quantized matmul in each regime and method (the GEMV with each epilogue), int4 on packed rows and in
tiles (the launch table's configurations, or with ``--candidates`` every ``benchmarks/quant_bench.py``
candidate), and m08's store and decode kernels with an FP8 cache (direct and split paths). With ``--registers``
it also runs Triton's ``ptxas -v`` on each kernel's PTX and prints the registers per thread and any spills (a
spilling configuration streams far below the copy bandwidth).

    python tests/compile_m13_for_gpu.py                        # one line per variant; exit 1 on a failure
    python tests/compile_m13_for_gpu.py --candidates --registers
    python tests/compile_m13_for_gpu.py --quick                # the launch table in bf16 (tests/test_m13_...)

Exit status 77 when this Triton cannot compile for a GPU target here (as ``compile_for_gpu.py``).
"""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "0"  # compile, do not interpret: before anything imports triton

import argparse  # noqa: E402
import json  # noqa: E402
import re  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from compile_for_gpu import SKIP, CompileOnly, TargetOnlyDriver, cannot_compile_here  # noqa: E402

QWEN3_8B_K = 4096


def matmul_jobs(candidates: bool, quick: bool = False):
    """(name, call) for every quantized matmul variant."""
    from milestones.m13_quantization import epilogue_matmuls, integer_norm, matmul_kernels
    from milestones.m13_quantization.launch_config import CANDIDATES, LAUNCH_TABLE, fits_method
    from milestones.m13_quantization.quantize import tile_int4

    configs = []
    for method, table in LAUNCH_TABLE.items():
        configs += [(method, f"table {regime}", config) for regime, config in table.items()]
    if candidates:
        configs += [(method, f"candidate {name}", config) for regime in CANDIDATES
                    for name, config in CANDIDATES[regime].items() for method in ("int8", "int4")
                    if fits_method(config, method)]
    jobs = []
    for method, label, config in configs:
        rows = {"gemv": (1, 4), "dot": (16, 256), "swap_ab": (64, 20, 256),
                "dequant": (256,)}[config.kernel][:1 if quick else None]
        for dtype in (torch.bfloat16,) if quick else (torch.bfloat16, torch.float16, torch.float32):
            for m in rows:
                def job(method=method, config=config, m=m, dtype=dtype):
                    n, k = 256, QWEN3_8B_K
                    x = torch.zeros(m, k, dtype=dtype)
                    if method == "int8":
                        w, s = torch.zeros(n, k, dtype=torch.int8), torch.ones(n)
                    else:  # the engine's layout (tiles) and packed rows
                        w, s = torch.zeros(n, k // 2, dtype=torch.uint8), torch.ones(n, k // 128)
                    for weight in (w, tile_int4(w)) if method == "int4" else (w,):
                        matmul_kernels.quantized_matmul(x, weight, s, method, config=config)
                        if config.kernel != "gemv":
                            continue
                        for split_k in (None, 4) if m == 1 else (None,):
                            launch = dict(config=config, split_k=split_k)
                            if split_k:
                                matmul_kernels.quantized_matmul(x, weight, s, method, **launch)
                            # the epilogues (gemv_epilogues.py): SiLU * up, and the add + norm
                            epilogue_matmuls.quantized_silu_and_mul(x, weight, s, method, **launch)
                            epilogue_matmuls.quantized_add_rms_norm(x, weight, s, method,
                                                                    torch.zeros(m, n, dtype=dtype),
                                                                    torch.ones(n, dtype=dtype), 1e-6, **launch)
                    if config.kernel == "gemv":  # the norm over Qwen3-8B's hidden size: its widest load
                        hidden = 4096
                        w, s = (torch.zeros(hidden, k, dtype=torch.int8), torch.ones(hidden)) if method == "int8" else \
                            (tile_int4(torch.zeros(hidden, k // 2, dtype=torch.uint8)), torch.ones(hidden, k // 128))
                        epilogue_matmuls.quantized_add_rms_norm(x, w, s, method, torch.zeros(m, hidden, dtype=dtype),
                                                                torch.ones(hidden, dtype=dtype), 1e-6, config=config)
                        if method == "int4":  # the norm that writes the next GEMV's x as integers too
                            integer_norm.add_rms_norm_int16(torch.zeros(m, hidden, dtype=dtype),
                                                            torch.zeros(m, hidden, dtype=dtype),
                                                            torch.ones(hidden, dtype=dtype), 1e-6)
                            if dtype != torch.float32 and config.unpack == "dp4a":  # slices left to readers
                                readers_jobs(x, w, s, m, hidden, dtype, config)
                jobs.append((f"matmul {method} {label} M={m} {str(dtype)[6:]}", job))
    return jobs


def readers_jobs(x, w, s, m, hidden, dtype, config):
    """int4 on dp4a: a GEMV leaving its slices, the norms that add them (exact and deferred, or the deferred one in
    the GEMV's finish: ``gemv_epilogues.deferred_norm_when_last``; layer 0's with nothing to add), and the readers
    of either deferred norm's rows (``deferred_readers_jobs``)."""
    from milestones.m13_quantization import deferred_norm, epilogue_matmuls, integer_norm

    def zeros():
        return torch.zeros(m, hidden, dtype=dtype)

    sums = epilogue_matmuls.quantized_matmul_slices(x, w, s, "int4", config=config, split_k=4)
    integer_norm.add_rms_norm_int16(sums, zeros(), torch.ones(hidden, dtype=dtype), 1e-6)
    deferred_norm.deferred_rms_norm(zeros(), torch.ones(hidden, dtype=dtype), 1e-6)  # layer 0's: nothing added
    # the deferred norm's rows from its own kernel (4 parts of the sum of squares a row) and from the GEMV's
    # finish (a part a group): their readers compile once for each
    ones = torch.ones(hidden, dtype=dtype)
    for rows in (deferred_norm.deferred_add_rms_norm(sums, zeros(), ones, 1e-6),
                 epilogue_matmuls.quantized_deferred_add_norm(x, w, s, "int4", zeros(), ones, 1e-6, config=config,
                                                              split_k=4)):
        deferred_readers_jobs(rows, x, w, s, m, dtype, config)


def deferred_readers_jobs(rows, x, w, s, m, dtype, config):
    """gate_up's GEMV and q/k norm + RoPE reading a deferred norm's rows: the slices q/k/v leaves, rotated, written
    into a cache (``kv_at_rope.py``) or inside the decode kernel (``rope_in_decode.py``)."""
    from milestones.m05_paged_blocks.paged_attention import PagedKVCache
    from milestones.m10_cuda_graphs.graph_runner import GraphDecodeAttention
    from milestones.m13_quantization import epilogue_matmuls, kv_at_rope, rope_in_decode, sliced_sums
    from milestones.m13_quantization.fp8_kv_cache import FP8PagedKVCache

    epilogue_matmuls.quantized_silu_and_mul(rows, w, s, "int4", config=config)
    epilogue_matmuls.quantized_silu_and_mul_int16(rows, w, s, "int4")  # a group a program (SILU_WORDS_GEMV)
    heads, kv_heads, dim = 24, 4, 128  # q/k/v: 4,096 outputs
    table = torch.zeros(64, dim, dtype=dtype)
    qkv = epilogue_matmuls.deferred_matmul_slices(rows, w, s, "int4", config=config)
    rope_args = (heads, kv_heads, dim, torch.ones(heads + kv_heads, dim, dtype=dtype), table, table,
                 torch.zeros(m, dtype=torch.long), 1e-6)
    sliced_sums.sliced_qk_norm_rope(qkv, *rope_args)
    for cache_dtype in (dtype, torch.float8_e4m3fn):  # K/V written into the cache (kv_at_rope.py)
        cache = torch.zeros(64, kv_heads, dim, dtype=cache_dtype)
        scales = {"k_scale": torch.ones(1), "v_scale": torch.ones(1)} if cache_dtype != dtype else {}
        sliced_sums.sliced_qk_norm_rope(qkv, *rope_args, cache=kv_at_rope.CacheSlots(
            cache, cache.clone(), torch.arange(m), **scales))
    for cache_class in (PagedKVCache, FP8PagedKVCache):  # and in the decode kernel's programs, direct and split
        for bound in (64, 4096):
            graph = GraphDecodeAttention(cache_class(1, 8, 16, kv_heads, dim, dtype, x.device), torch.arange(m),
                                         torch.zeros((m, 8), dtype=torch.int32), torch.ones(m, dtype=torch.int32),
                                         bound)
            rope_in_decode.rope_decode_attention(graph, 0, qkv, *rope_args)


def fp8_jobs(quick: bool = False):
    """m08's kernels on an FP8 cache: the store (quantize) and the decode (dequantize), direct and split."""
    from milestones.m08_triton_kernel import paged_decode_kernel, store_kv_kernel

    fp8 = torch.float8_e4m3fn
    jobs = []
    for dtype in (torch.bfloat16,) if quick else (torch.bfloat16, torch.float16, torch.float32):
        def store(dtype=dtype):
            k = torch.zeros(3, 8, 128, dtype=dtype)
            cache = torch.zeros(8, 16, 8, 128, dtype=fp8)
            scale = torch.ones(1)
            store_kv_kernel.store_kv(k, k.clone(), cache, cache.clone(), torch.tensor([5, -1, 17]),
                                     k_scale=scale, v_scale=scale)
        jobs.append((f"store_kv fp8 from {str(dtype)[6:]}", store))
        for splits in (1, 4):
            def decode(dtype=dtype, splits=splits):
                q = torch.zeros(2, 32, 128, dtype=dtype)
                cache = torch.zeros(8, 16, 8, 128, dtype=fp8)
                tables = torch.arange(8, dtype=torch.int32).view(2, 4)
                lens = torch.tensor([40, 64])
                scale = torch.ones(1)
                paged_decode_kernel.paged_decode_attention(q, cache, cache.clone(), tables, lens, 128 ** -0.5,
                                                           num_splits=splits, k_scale=scale, v_scale=scale)
            jobs.append((f"decode fp8 {'direct' if splits == 1 else 'split'} q {str(dtype)[6:]}", decode))
    return jobs


def ptxas_registers(ptx: str, arch: int) -> str:
    """``ptxas -v``'s summary of one kernel: registers per thread, spill stores/loads."""
    from triton.backends.nvidia.compiler import get_ptxas

    suffix = "a" if arch == 90 else ""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "kernel.ptx"
        path.write_text(ptx)
        result = subprocess.run([get_ptxas(arch).path, "-v", f"--gpu-name=sm_{arch}{suffix}", str(path),
                                 "-o", str(Path(tmp) / "kernel.cubin")], capture_output=True, text=True)
    text = result.stderr + result.stdout
    registers = re.search(r"Used (\d+) registers", text)
    spills = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", text)
    if not registers:
        return "ptxas: " + " | ".join(text.strip().splitlines()[:3])[:300]
    summary = f"{registers.group(1)} registers"
    if spills and (int(spills.group(1)) or int(spills.group(2))):
        summary += f", SPILLS {spills.group(1)} B stored / {spills.group(2)} B loaded"
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python tests/compile_m13_for_gpu.py", description=__doc__.split("\n")[0])
    parser.add_argument("--arch", type=int, default=90, help="CUDA compute capability x10 (default 90: Hopper)")
    parser.add_argument("--candidates", action="store_true", help="also every quant_bench candidate configuration")
    parser.add_argument("--registers", action="store_true", help="registers and spills per kernel (ptxas -v)")
    parser.add_argument("--quick", action="store_true",
                        help="the launch table in bfloat16 only, one M per kernel (what the test runs)")
    parser.add_argument("--only", default=None, help="only variants whose name contains this text")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of lines")
    args = parser.parse_args(argv)
    reason = cannot_compile_here()
    if reason:
        print(f"SKIP: {reason}")
        return SKIP

    from triton.backends.compiler import GPUTarget
    from triton.runtime.driver import driver

    from milestones.m08_triton_kernel import paged_decode_kernel, store_kv_kernel
    from milestones.m13_quantization import (deferred_norm, dequant_matmul, integer_dots, integer_norm,
                                             matmul_kernels, rope_in_decode, sliced_sums, swap_ab_matmul)

    driver.set_active(TargetOnlyDriver(GPUTarget("cuda", args.arch, 32)))
    compiled: list = []
    for module, names in ((matmul_kernels, ("_quantized_gemv_kernel", "_quantized_dot_kernel")),
                          (integer_dots, ("_int16_x_kernel",)),
                          (integer_norm, ("_add_rms_norm_int16_kernel", "_slices_add_rms_norm_int16_kernel")),
                          (deferred_norm, ("_deferred_norm_kernel",)), (sliced_sums, ("_sliced_qk_norm_rope_kernel",)),
                          (rope_in_decode, ("_rope_decode_kernel",)),
                          (dequant_matmul, ("_dequantize_kernel",)), (swap_ab_matmul, ("_swap_ab_kernel",)),
                          (paged_decode_kernel, ("_paged_decode_kernel", "_combine_splits_kernel")),
                          (store_kv_kernel, ("_store_kv_kernel",))):
        for name in names:
            setattr(module, name, CompileOnly(getattr(module, name).compiled, compiled))
    dequant_matmul.F.linear = lambda x, w, bias=None: x.new_empty((x.shape[0], w.shape[0]))  # nothing to run
    # the GPU's code paths, not the interpreter's (bf16 dots, the decode kernel's PTX widening of an FP8 cache)
    matmul_kernels.runs_interpreted = lambda device: False
    swap_ab_matmul.runs_interpreted = lambda device: False
    paged_decode_kernel.runs_interpreted = lambda device: False
    store_kv_kernel.runs_interpreted = lambda device: False
    sliced_sums.runs_interpreted = lambda device: False  # RoPE's FP8 K/V: the compiled conversion's rounding
    rope_in_decode.runs_interpreted = lambda device: False

    jobs = matmul_jobs(args.candidates, args.quick) + fp8_jobs(args.quick)
    if args.only:
        jobs = [(name, job) for name, job in jobs if args.only in name]
    results = []
    for name, job in jobs:
        start = len(compiled)
        try:
            job()
            error = None
        except Exception as e:  # noqa: BLE001  (every failure is reported, the rest still compile)
            error = f"{type(e).__name__}: {e}"
        kernels = compiled[start:]
        results.append({"variant": name, "ok": error is None, "error": error,
                        "kernels": [{"name": k.name, "shared_bytes": k.metadata.shared,
                                     "registers": ptxas_registers(k.asm["ptx"], args.arch) if args.registers else None}
                                    for k in kernels]})
    failures = [r for r in results if not r["ok"]]
    if args.json:
        print(json.dumps({"target": f"cuda:{args.arch}", "results": results, "ok": not failures}))
    else:
        for r in results:
            kernels = ", ".join(f"{k['name']} ({k['shared_bytes']} B smem"
                                + (f", {k['registers']}" if k["registers"] else "") + ")" for k in r["kernels"])
            print(f"{'ok  ' if r['ok'] else 'FAIL'} {r['variant']}: {kernels}")
            if r["error"]:
                print("     " + r["error"].replace("\n", "\n     ")[:3000])
        print(f"{len(results) - len(failures)}/{len(results)} variants compiled for sm_{args.arch}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
