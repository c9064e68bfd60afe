"""Compile m08's Triton kernels for a GPU on a machine without one, so that compile errors fail on a laptop.

The CPU tests run the kernels in Triton's interpreter, which executes them as numpy code: it never type-checks a
kernel the way Triton's compiler does. A kernel can therefore pass every CPU test and still fail to compile on
the GPU; it happened once: with ``context_lens`` in int64 (as the engine's metadata has it) a loop-carried
variable changed type from int32 to int64, which the compiler rejects and the interpreter does not notice.

Triton's compiler needs no GPU, only a target. This script runs the real wrappers (``paged_decode_attention``,
``store_kv``) on small CPU tensors with every launch replaced by Triton's ``warmup`` (compile, never run) and
Triton's driver replaced by one that names the target (default sm_90: Hopper, the H200). Each launch so goes
through exactly what it goes through on the GPU (the wrapper's checks and arguments, Triton's specialisation of
them, TTIR, TTGIR, LLVM IR, PTX and, with the ptxas Triton ships, a cubin), for the direct and split paths, in
float32/float16/bfloat16, with int32 and int64 context lengths and block tables.

    python tests/compile_for_gpu.py                  # every variant for sm_90; one line each; exit 1 on a failure
    python tests/compile_for_gpu.py --arch 80        # another target (A100)
    python tests/compile_for_gpu.py --sweep-configs  # also every configuration of tests/decode_configs.py

It runs in a process of its own (``tests/test_m08_kernel.py`` starts it so), because it replaces the kernels and
Triton's driver for good; it sets ``TRITON_INTERPRET=0`` before importing triton, so that the kernels are compiled
``JITFunction``s whatever the shell says. Exit status 77 (with a reason) when this Triton cannot compile for a
target without a GPU.
"""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "0"  # compile, do not interpret: before anything imports triton

import argparse  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's milestones/, not an installed one

SKIP = 77  # the exit status of "cannot check here" (autotools' convention)
SHARED_MEMORY_PER_BLOCK = {80: 166_912, 86: 101_376, 89: 101_376, 90: 232_448}  # bytes a program may use


@dataclass
class Variant:
    """One call of a wrapper; every kernel it launches is compiled."""

    name: str
    dtype: torch.dtype
    index_dtype: tuple[torch.dtype, torch.dtype] = (torch.int32, torch.int32)  # context_lens, block_tables
    num_splits: int = 1
    num_heads: int = 16  # Qwen3-0.6B: 16 query heads on 8 K/V heads of 128 dims, 16-token blocks
    num_kv_heads: int = 8
    config: object = None  # a DecodeKernelConfig, or None for the launch table's
    kernels: list = field(default_factory=list)


class CompileOnly:
    """Stands in for a kernel in a wrapper: ``kernel[grid](*args)`` compiles for the target and launches nothing
    (the CPU tensors only describe the launch: their device does not send it to the interpreter)."""

    def __init__(self, kernel, compiled: list) -> None:
        self.kernel, self.compiled = kernel, compiled

    def __getitem__(self, grid):
        def compile_only(*args, **kwargs):
            self.compiled.append(self.kernel.warmup(*args, grid=grid, **kwargs))

        return compile_only


class TargetOnlyDriver:
    """What Triton asks its driver for while compiling: the target. Nothing here can launch."""

    def __init__(self, target) -> None:
        self.target = target

    def get_current_target(self):
        return self.target

    def get_current_device(self) -> int:
        return 0

    def get_current_stream(self, device: int | None = None) -> int:
        return 0


def cannot_compile_here() -> str | None:
    """Why this Triton cannot compile for a GPU target here, or None."""
    try:
        import triton
        from triton.backends.compiler import GPUTarget  # noqa: F401
        from triton.runtime.driver import driver
        from triton.runtime.jit import JITFunction
    except ImportError as e:
        return f"Triton is missing or too old for this check ({e})"
    if not (hasattr(driver, "set_active") and hasattr(JITFunction, "warmup")):
        return f"Triton {triton.__version__} has no driver.set_active / JITFunction.warmup"
    try:
        triton.knobs.nvidia.ptxas.path  # noqa: B018  (raises if Triton finds no ptxas)
    except Exception as e:  # noqa: BLE001  (any failure to find it means the same here)
        return f"Triton finds no ptxas, which it needs to compile for NVIDIA targets ({e})"
    return None


def decode_variants(sweep_configs: dict) -> list[Variant]:
    variants = []
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        for index in (torch.int32, torch.int64):
            for splits in (1, 4):
                path = "direct" if splits == 1 else "split"
                variants.append(Variant(f"decode {path} {str(dtype)[6:]} lens/tables {str(index)[6:]}", dtype,
                                        (index, index), splits))
    for lens, tables in ((torch.int64, torch.int32), (torch.int32, torch.int64)):
        for splits in (1, 4):
            path = "direct" if splits == 1 else "split"
            variants.append(Variant(f"decode {path} bfloat16 lens {str(lens)[6:]} tables {str(tables)[6:]}",
                                    torch.bfloat16, (lens, tables), splits))
    for splits in (1, 4):  # Qwen3-4B/8B: 32 query heads on 8 K/V heads
        variants.append(Variant(f"decode {'direct' if splits == 1 else 'split'} bfloat16 group 4",
                                torch.bfloat16, (torch.int64, torch.int32), splits, num_heads=32))
    for name, config in sweep_configs.items():
        for splits in (1, 4):
            variants.append(Variant(f"sweep {name} {'direct' if splits == 1 else 'split'}", torch.bfloat16,
                                    (torch.int64, torch.int32), splits, config=config))
    return variants


def compile_decode(variant: Variant, paged_decode_attention) -> None:
    """One wrapper call at Qwen3's shape: 2 sequences, 4 blocks of 16 tokens each in a pool of 8."""
    head_dim, block_size, batch = 128, 16, 2
    lens_dtype, table_dtype = variant.index_dtype
    q = torch.zeros(batch, variant.num_heads, head_dim, dtype=variant.dtype)
    cache = torch.zeros(8, block_size, variant.num_kv_heads, head_dim, dtype=variant.dtype)
    tables = torch.arange(batch * 4, dtype=table_dtype).view(batch, 4)
    lens = torch.tensor([40, 64], dtype=lens_dtype)
    paged_decode_attention(q, cache, cache.clone(), tables, lens, head_dim ** -0.5, num_splits=variant.num_splits,
                           config=variant.config)


def compile_store(dtype: torch.dtype, slot_dtype: torch.dtype, store_kv) -> None:
    k = torch.zeros(3, 8, 128, dtype=dtype)
    cache = torch.zeros(8, 16, 8, 128, dtype=dtype)
    store_kv(k, k.clone(), cache, cache.clone(), torch.tensor([5, -1, 17], dtype=slot_dtype))


def compile_fused(dtype: torch.dtype, fused_kernels) -> None:
    """m12's fused kernels at Qwen3-0.6B's shape: 3 tokens, hidden 1024, 16 + 8 heads of 128, intermediate 3072."""
    hidden, heads, kv_heads, head_dim, inter = 1024, 16, 8, 128, 3072
    x = torch.zeros(3, hidden, dtype=dtype)
    fused_kernels.add_rms_norm(x, x.clone(), torch.zeros(hidden, dtype=dtype), 1e-6)
    qkv = torch.zeros(3, (heads + 2 * kv_heads) * head_dim, dtype=dtype)
    table = torch.zeros(64, head_dim, dtype=dtype)
    fused_kernels.qk_norm_rope(qkv, heads, kv_heads, head_dim, torch.zeros(heads + kv_heads, head_dim, dtype=dtype),
                               table, table.clone(), torch.tensor([0, 5, 63]), 1e-6)
    fused_kernels.silu_and_mul(torch.zeros(3, 2 * inter, dtype=dtype))


def compile_prefill(dtype: torch.dtype, num_heads: int, paged_prefill_kernel, fp8: bool = False) -> None:
    """m12's prefill kernel as the engine calls it: int64 lengths and starts, int32 tables and tiles; 2 chunks."""
    head_dim, kv_heads = 128, 8
    q = torch.zeros(40, num_heads, head_dim, dtype=dtype)
    cache = torch.zeros(8, 16, kv_heads, head_dim, dtype=torch.float8_e4m3fn if fp8 else dtype)
    tables = torch.arange(8, dtype=torch.int32).view(2, 4)
    scales = dict(k_scale=torch.ones(1), v_scale=torch.ones(1)) if fp8 else {}
    tiles = torch.zeros(3, dtype=torch.int32)
    paged_prefill_kernel.paged_prefill_attention(q, cache, cache.clone(), torch.empty_like(q), tables,
                                                 torch.tensor([50, 64]), torch.tensor([0, 30, 40]), tiles,
                                                 tiles.clone(), head_dim ** -0.5, **scales)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python tests/compile_for_gpu.py", description=__doc__.split("\n")[0])
    parser.add_argument("--arch", type=int, default=90, help="CUDA compute capability x10 (default 90: Hopper)")
    parser.add_argument("--sweep-configs", action="store_true", help="also every tests/decode_configs.py configuration")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of lines")
    args = parser.parse_args(argv)
    reason = cannot_compile_here()
    if reason:
        print(f"SKIP: {reason}")
        return SKIP

    from triton.backends.compiler import GPUTarget
    from triton.runtime.driver import driver

    from milestones.m08_triton_kernel import paged_decode_kernel, store_kv_kernel
    from milestones.m12_async_scheduling import fused_kernels, paged_prefill_kernel

    driver.set_active(TargetOnlyDriver(GPUTarget("cuda", args.arch, 32)))
    compiled: list = []
    for module, names in ((paged_decode_kernel, ("_paged_decode_kernel", "_combine_splits_kernel")),
                          (store_kv_kernel, ("_store_kv_kernel",)),
                          (fused_kernels, ("_add_rms_norm_kernel", "_qk_norm_rope_kernel", "_silu_and_mul_kernel")),
                          (paged_prefill_kernel, ("_paged_prefill_kernel",))):
        for name in names:
            setattr(module, name, CompileOnly(getattr(module, name).compiled, compiled))
    paged_decode_kernel.runs_interpreted = lambda device: False  # so the wrapper picks its GPU code paths
    paged_prefill_kernel.runs_interpreted = lambda device: False

    sweep = {}
    if args.sweep_configs:
        from decode_configs import SWEEP_CONFIGS
        sweep = SWEEP_CONFIGS
    jobs = [(v.name, lambda v=v: compile_decode(v, paged_decode_kernel.paged_decode_attention))
            for v in decode_variants(sweep)]
    jobs += [(f"store_kv {str(dtype)[6:]} slots {str(slots)[6:]}",
              lambda d=dtype, s=slots: compile_store(d, s, store_kv_kernel.store_kv))
             for dtype, slots in ((torch.float32, torch.int64), (torch.float16, torch.int32),
                                  (torch.bfloat16, torch.int64), (torch.bfloat16, torch.int32))]
    jobs += [(f"m12 fused kernels {str(dtype)[6:]}", lambda d=dtype: compile_fused(d, fused_kernels))
             for dtype in (torch.float32, torch.bfloat16)]
    jobs += [(f"m12 prefill {str(dtype)[6:]} {heads} heads{' fp8 cache' if fp8 else ''}",
              lambda d=dtype, h=heads, f=fp8: compile_prefill(d, h, paged_prefill_kernel, f))
             for dtype, heads, fp8 in ((torch.float32, 16, False), (torch.float16, 16, False),
                                       (torch.bfloat16, 16, False), (torch.bfloat16, 32, False),
                                       (torch.bfloat16, 16, True), (torch.bfloat16, 32, True))]
    limit = SHARED_MEMORY_PER_BLOCK.get(args.arch)
    results = []
    for name, job in jobs:
        start = len(compiled)
        try:
            job()
            kernels = compiled[start:]
            too_big = [k.name for k in kernels if limit is not None and k.metadata.shared > limit]
            error = f"shared memory above {limit} bytes in {too_big}" if too_big else None
        except Exception as e:  # noqa: BLE001  (every failure is reported, the rest still compile)
            kernels, error = compiled[start:], f"{type(e).__name__}: {e}"
        results.append({"variant": name, "ok": error is None, "error": error,
                        "kernels": [{"name": k.name, "stages": list(k.asm), "shared_bytes": k.metadata.shared,
                                     "num_warps": k.metadata.num_warps, "num_stages": k.metadata.num_stages}
                                    for k in kernels]})
    failures = [r for r in results if not r["ok"]]
    if args.json:
        print(json.dumps({"target": f"cuda:{args.arch}", "triton": __import__("triton").__version__,
                          "results": results, "ok": not failures}))
    else:
        for r in results:
            kernels = ", ".join(f"{k['name']} ({'/'.join(k['stages'][1:])}, {k['shared_bytes']} B smem)"
                                for k in r["kernels"])
            print(f"{'ok  ' if r['ok'] else 'FAIL'} {r['variant']}: {kernels}")
            if r["error"]:
                print("     " + r["error"].replace("\n", "\n     "))
        print(f"{len(results) - len(failures)}/{len(results)} variants compiled for sm_{args.arch}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
