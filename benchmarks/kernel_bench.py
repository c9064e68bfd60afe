"""Microbenchmark: m08's paged decode kernel against m04's gather + SDPA, for one attention layer of Qwen3-0.6B.

    python -m benchmarks.kernel_bench                    # H200: batch {1,16,64,256} x context {512,2048,8192}

Each case is one decode step of one layer (random bf16 K/V in a shuffled paged pool) through ``triton``
(``paged_decode_attention``, its launch table's choice) and ``gather`` (m04's ``DecodeAttention``). Every ``*_ms``
is GPU time from a CUDA graph (``Timing``), with calls rotating over copies of the K/V that hold 4x the L2
cache. Outputs must agree within a bf16 tolerance. What is timed and why: docs/m08-triton-kernel.md and
benchmarks/KERNEL_NOTES.md. Without CUDA: a smoke test in the interpreter.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import math
import statistics
import sys
import timeit
from collections.abc import Callable
from types import SimpleNamespace

import torch
import triton.testing

from milestones.common.demo import positive_int_list
from milestones.m04_continuous_batching.kv_pool import DecodeAttention
from milestones.m08_triton_kernel.launch_config import LAUNCH_TABLE, DecodeKernelConfig, choose_launch, sm_count
from milestones.m08_triton_kernel.paged_decode_kernel import paged_decode_attention

from .env import environment, save

BATCHES = (1, 16, 64, 256)
CONTEXTS = (512, 2048, 8192)
BF16_TOLERANCE = 2e-2  # max |triton - gather|: a few bf16 ulps at the outputs' magnitude (< 1)
L2_MULTIPLE = 4  # the rotated copies of a case hold at least this many times the L2 cache...
MAX_COPIES = 256  # ...up to this many (1 x 512 on an H200 needs about a hundred; only toy sizes reach the cap)


def l2_bytes(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).L2_cache_size if device.type == "cuda" else 0


def require_device(device: str) -> torch.device:
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit("error: --device cuda but no CUDA device is available (try --device cpu with tiny sizes)")
    return torch.device(device)


@dataclasses.dataclass
class Timing:
    """A code path is a list of callables, one per copy of its inputs; calls cycle through the copies.
    ``gpu_ms``: GPU time per call from ``do_bench_cudagraph`` (``rep_ms`` of calls in one graph, median replay),
    free of launch costs. Without CUDA it is wall time."""

    device: torch.device
    rep_ms: int = 20

    def gpu_ms(self, path: list[Callable[[], object]]) -> float:
        if self.device.type != "cuda":
            path[0]()  # warm-up (first touch of fresh buffers)
            return statistics.median(timeit.timeit(fn, number=1) * 1e3 for fn in path)
        calls = itertools.cycle(path)
        return triton.testing.do_bench_cudagraph(lambda: next(calls)(), rep=self.rep_ms, return_mode="median")

    def describe(self, what: str) -> str:
        """What ``gpu_ms`` measured, for a result's ``timing``."""
        if self.device.type != "cuda":
            return "CPU (Triton interpreter): median wall time per call"
        return (f"*_ms: GPU time per call, triton.testing.do_bench_cudagraph ({self.rep_ms} ms of calls in one CUDA "
                f"graph, median replay); calls rotate over copies of {what} holding >= {L2_MULTIPLE}x the L2 cache "
                f"({l2_bytes(self.device)} B), so each reads from DRAM")

    def copy_bandwidth_gbs(self, mib: int | None = None) -> float:
        """Device-to-device bandwidth (bytes read + written over GPU time) of an elementwise ``neg`` on a buffer far
        larger than L2 (default 1 GiB; 16 MiB on a CPU): in a CUDA graph a ``copy_`` may go to a copy engine
        (H200: ~2,700 GB/s against ~4,250 for the SMs), and a kernel's GB/s is read against what SMs reach."""
        cuda = self.device.type == "cuda"
        nbytes = (mib or (1024 if cuda else 16)) * 2**20
        src = torch.empty(nbytes // 2, dtype=torch.float16, device=self.device).uniform_(-1, 1)
        dst = torch.empty_like(src)
        gbs = 2 * (nbytes // 2) * 2 / (self.gpu_ms([lambda: torch.neg(src, out=dst)]) * 1e-3) / 1e9
        print(f"device-to-device copy: {gbs:,.0f} GB/s (read + write, {'GPU' if cuda else 'wall'} time)")
        return gbs


def config_name(config: DecodeKernelConfig) -> str:
    """``t<tile>-w<warps>-s<stages>``: a launch configuration's short name."""
    return f"t{config.tile_tokens}-w{config.num_warps}-s{config.num_stages}"


@dataclasses.dataclass
class PagedCase:
    """``copies`` disjoint copies of one layer's paged K/V for ``batch`` sequences of ``context`` keys each."""

    q: torch.Tensor  # [B, heads, head_dim]
    k_cache: torch.Tensor  # [num_blocks, block_size, kv_heads, head_dim]: every copy's blocks, shuffled together
    v_cache: torch.Tensor
    block_tables: list[torch.Tensor]  # per copy: [B, blocks per sequence] int32 (own allocation: aligned alike)
    context_lens: torch.Tensor  # [B] int32
    context: int

    @property
    def kv_bytes(self) -> int:
        """K and V bytes one call must read: every sequence's keys, once."""
        batch, _, head_dim = self.q.shape
        return 2 * batch * self.context * self.k_cache.shape[2] * head_dim * self.k_cache.element_size()

    @property
    def min_bytes(self) -> int:
        return self.kv_bytes + 2 * self.q.numel() * self.q.element_size()  # + q read, output written


def copies_needed(nbytes: int, device: torch.device, max_copies: int = MAX_COPIES) -> int:
    """Enough copies that, rotated, they hold ``L2_MULTIPLE`` times the L2 cache (2 at least; 2 on a CPU)."""
    return min(max_copies, max(2, math.ceil(L2_MULTIPLE * l2_bytes(device) / nbytes)))


def make_case(batch: int, context: int, num_heads: int, num_kv_heads: int, head_dim: int, block_size: int,
              dtype: torch.dtype, device: torch.device, seed: int = 0) -> PagedCase:
    """As many copies as ``copies_needed`` asks for one copy's K/V (the last case's copies freed first)."""
    torch.cuda.empty_cache()  # a no-op without CUDA
    copies = copies_needed(2 * batch * context * num_kv_heads * head_dim * dtype.itemsize, device)
    gen = torch.Generator(device=device).manual_seed(seed)
    blocks_per_seq = -(-context // block_size)
    num_blocks = copies * batch * blocks_per_seq
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_cache = torch.randn(shape, generator=gen, device=device, dtype=dtype)
    v_cache = torch.randn(shape, generator=gen, device=device, dtype=dtype)
    order = torch.randperm(num_blocks, generator=gen, device=device)
    tables = [t.to(torch.int32).contiguous() for t in order.view(copies, batch, blocks_per_seq)]
    q = torch.randn((batch, num_heads, head_dim), generator=gen, device=device, dtype=dtype)
    lens = torch.full((batch,), context, dtype=torch.int32, device=device)
    return PagedCase(q, k_cache, v_cache, tables, lens, context)


def gather_path(case: PagedCase) -> list:
    """m04's decode attention over the same pool: one callable per copy, each returning ``[B, heads, head_dim]``."""
    batch, num_heads, head_dim = case.q.shape
    block_size = case.k_cache.shape[1]
    positions = torch.arange(case.context, device=case.q.device)
    key_mask = (positions[None, :] < case.context_lens[:, None].long())[:, None, None, :]
    # what DecodeAttention reads of a KVPool (k[layer], v[layer]: [slots, heads, dim]) over this paged cache;
    # write() stores nothing: both paths would store the step's K/V alike
    pool = SimpleNamespace(k=case.k_cache.view(1, -1, *case.k_cache.shape[2:]),
                           v=case.v_cache.view(1, -1, *case.v_cache.shape[2:]), write=lambda *args: None)
    q = case.q[:, None]  # [B, T=1, heads, head_dim], the model's layout
    new_kv = case.k_cache.new_zeros((batch, 1, *case.k_cache.shape[2:]))  # the step's K/V: handed to write()

    def one(tables: torch.Tensor):
        # kv_indices[b, j]: the pool slot of key j of sequence b (every row is `context` keys long: no padding)
        kv_indices = tables.long()[:, positions // block_size] * block_size + positions % block_size
        attention = DecodeAttention(pool, slot_mapping=None, kv_indices=kv_indices, key_mask=key_mask)
        return lambda: attention(0, q, new_kv, new_kv).view(batch, num_heads, head_dim)

    return [one(tables) for tables in case.block_tables]


def triton_path(case: PagedCase) -> list:
    """``paged_decode_attention`` over each copy, with the launch table's choice."""
    scale, out = case.q.shape[-1] ** -0.5, torch.empty_like(case.q)
    return [lambda tables=tables: paged_decode_attention(
        case.q, case.k_cache, case.v_cache, tables, case.context_lens, scale, max_context_len=case.context,
        out=out) for tables in case.block_tables]


def max_abs_diff(path: list, reference: list) -> float:
    """max |path - reference| over the outputs of the first and the last copy."""
    return max((path[i]().float() - reference[i]().float()).abs().max().item() for i in (0, len(path) - 1))


def measure_case(case: PagedCase, timing: Timing, copy_gbs: float) -> dict:
    """The launch table's kernel against the gather path on one case: GPU times, GB/s, max |diff|."""
    batch = case.q.shape[0]
    config, splits = choose_launch(batch, case.k_cache.shape[2], case.context, sm_count(case.q.device))
    gather, triton = gather_path(case), triton_path(case)
    row = {"batch": batch, "context": case.context, "regime": "split" if splits > 1 else "direct",
           "config_name": config_name(config), "num_splits": splits, "copies": len(case.block_tables),
           "kv_bytes": case.kv_bytes, "bytes": case.min_bytes, "max_abs_diff": max_abs_diff(triton, gather)}
    row["triton_ms"], row["gather_ms"] = timing.gpu_ms(triton), timing.gpu_ms(gather)
    row["speedup"] = row["gather_ms"] / row["triton_ms"]
    row["triton_gbs"] = case.min_bytes / (row["triton_ms"] * 1e-3) / 1e9
    row["copy_fraction"] = row["triton_gbs"] / copy_gbs
    return row


def check_targets(cases: list[dict]) -> dict:
    """m08's H200 targets, where this run measured the cases they name (GPU time: ``*_ms``)."""
    by_shape = {(c["batch"], c["context"]): c for c in cases}
    targets = {}
    if (64, 2048) in by_shape:
        c = by_shape[(64, 2048)]
        targets["batch 64 x 2048: >= 65% of copy bandwidth"] = c["copy_fraction"] >= 0.65
        targets["batch 64 x 2048: >= 2.5x gather"] = c["speedup"] >= 2.5
    small = [by_shape[(b, 2048)] for b in range(1, 17) if (b, 2048) in by_shape]
    if small:
        targets["batch 1-16 x 2048: >= 4x gather"] = all(c["speedup"] >= 4 for c in small)
    return targets


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.kernel_bench", description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=positive_int_list, default=None, help="batch sizes (default 1,16,64,256)")
    parser.add_argument("--context", type=positive_int_list, default=None,
                        help="keys per sequence (default 512,2048,8192)")
    parser.add_argument("--num-heads", type=int, default=16)
    parser.add_argument("--num-kv-heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--dtype", choices=("bfloat16", "float16", "float32"), default="bfloat16")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--rep-ms", type=int, default=20, help="GPU work per CUDA graph, in ms (triton.testing's rep)")
    parser.add_argument("--copy-mib", type=int, default=None, help="copy-bandwidth buffer (default 1024; 16 on CPU)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=None, help="JSON path (default benchmarks/results/<gpu>/kernel_bench.json)")
    return parser


def run(args: argparse.Namespace) -> dict:
    device = require_device(args.device)
    if device.type == "cuda":
        torch.backends.cuda.enable_cudnn_sdp(False)  # as the engines do (m01's LLMEngine)
    timing = Timing(device, rep_ms=args.rep_ms)
    copy_gbs = timing.copy_bandwidth_gbs(args.copy_mib)
    cases = []
    for batch, context in itertools.product(args.batch or BATCHES, args.context or CONTEXTS):
        case = make_case(batch, context, args.num_heads, args.num_kv_heads, args.head_dim, args.block_size,
                         getattr(torch, args.dtype), device, args.seed)
        row = measure_case(case, timing, copy_gbs)
        cases.append(row)
        print(f"batch {batch:4d} x context {context:5d}: triton {row['triton_ms']:.4f} ms ({row['regime']}, "
              f"{row['num_splits']} splits, {row['config_name']}), gather {row['gather_ms']:.4f} ms: "
              f"{row['speedup']:.2f}x, {row['triton_gbs']:,.0f} GB/s = {row['copy_fraction']:.0%} of copy, "
              f"max |diff| {row['max_abs_diff']:.2e}", flush=True)
    timing_notes = {
        "judged_on": "triton_ms, gather_ms, speedup, triton_gbs, copy_fraction: GPU time per call",
        "gpu": timing.describe("the case's K/V"),
        "why": "GPU time is the layer's work on the GPU, what a CUDA-graph step pays and the only time a GB/s figure "
               "can be read against the copy bandwidth"}
    shape = {"num_heads": args.num_heads, "num_kv_heads": args.num_kv_heads, "head_dim": args.head_dim,
             "block_size": args.block_size, "dtype": args.dtype}
    launch_table = {regime: {"name": config_name(c), **dataclasses.asdict(c)} for regime, c in LAUNCH_TABLE.items()}
    return {"name": "kernel_bench", "env": environment(device), "shape": shape, "launch_table": launch_table,
            "num_sms": sm_count(device), "timing": timing_notes, "copy_bandwidth_gbs": copy_gbs,
            "tolerance": BF16_TOLERANCE, "cases": cases, "targets": check_targets(cases),
            "ok": all(r["max_abs_diff"] <= BF16_TOLERANCE for r in cases)}


def main(argv: list[str] | None = None) -> dict:
    args = build_parser().parse_args(argv)
    result = run(args)
    for name, ok in result["targets"].items():
        print(f"target {name} (GPU time): {'met' if ok else 'NOT met'}")
    save(result, "kernel_bench.json", args.out)
    bad = [f"{r['config_name']} {r['batch']}x{r['context']}: {r['max_abs_diff']:.3g}"
           for r in result["cases"] if not r["max_abs_diff"] <= BF16_TOLERANCE]
    if bad:
        print(f"FAILED: max |triton - gather| above {BF16_TOLERANCE} in {', '.join(bad)}", file=sys.stderr)
        raise SystemExit(1)
    return result


if __name__ == "__main__":
    main()
