"""Microbenchmark: m08's paged decode kernel against m04's gather + SDPA, for one attention layer of Qwen3-0.6B.

    python -m benchmarks.kernel_bench                    # H200: batch {1,16,64,256} x context {512,2048,8192}
    python -m benchmarks.kernel_bench --quick            # batch {1,16,64} x context 2048
    python -m benchmarks.kernel_bench --autotune-sweep   # also every SWEEP_CONFIGS entry on SWEEP_SHAPES

Each case is one decode step of one layer: ``batch`` sequences, each ``context`` keys long, random bf16 K/V
in a paged pool (16-token blocks, block tables shuffled), 16 query heads on 8 K/V heads of 128 dims.

* ``triton``: ``paged_decode_attention`` reads the pool in place through the block tables.
* ``gather``: m04's ``DecodeAttention``: ``index_select`` every row's keys and values into a dense
  ``[B, S, kv_heads, head_dim]`` copy, then masked SDPA (its K/V store is left out: both paths store alike).

Times are medians of CUDA-event timings with L2 flushed before every call (a real step reaches each layer's
K/V after the other layers' weights went through L2): the GPU's time. A second speed-up, ``b2b``, compares calls
issued back to back as an eager engine issues them, where the CPU's launch cost counts too (m04's path launches
about ten kernels, the Triton path two or three). Achieved GB/s counts the bytes the kernel cannot avoid
moving, every K/V byte once plus q and the output, and is compared with a device-to-device copy timed in the
same run (counting bytes read + written). The run fails if any case's outputs differ by more than a bf16
tolerance. Without CUDA it runs (slowly, in Triton's interpreter) at whatever tiny sizes you pass: a smoke test.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from milestones.m04_continuous_batching.kv_pool import DecodeAttention
from milestones.m08_triton_kernel.paged_decode_kernel import (DEFAULT_CONFIG, DecodeKernelConfig, choose_num_splits,
                                                              paged_decode_attention, sm_count)

from .env import environment

BATCHES = (1, 16, 64, 256)
CONTEXTS = (512, 2048, 8192)
QUICK_BATCHES, QUICK_CONTEXTS = (1, 16, 64), (2048,)
BF16_TOLERANCE = 2e-2  # max |triton - gather|: a few bf16 ulps at the outputs' magnitude (< 1)
L2_FLUSH_BYTES = 256 * 2**20  # more than any GPU's L2 (H200: 60 MB)

# Alternatives for one GPU run to choose from (see benchmarks/KERNEL_NOTES.md). ``programs_per_sm`` is what each
# configuration's registers and shared memory allow on an H200 (Triton 3.6, bf16, head_dim 128), so the split
# heuristic fills exactly one wave; name: (config, forced num_splits or None for the heuristic).
SWEEP_CONFIGS: dict[str, tuple[DecodeKernelConfig, int | None]] = {
    "t64-w4-s3 (default)": (DEFAULT_CONFIG, None),
    "t64-w4-s3 no split": (DEFAULT_CONFIG, 1),
    "t64-w4-s3 ppsm8": (dataclasses.replace(DEFAULT_CONFIG, programs_per_sm=8), None),
    "t64-w4-s2": (DecodeKernelConfig(tile_tokens=64, num_warps=4, num_stages=2, programs_per_sm=4), None),
    "t64-w4-s4": (DecodeKernelConfig(tile_tokens=64, num_warps=4, num_stages=4, programs_per_sm=2), None),
    "t64-w4-s1": (DecodeKernelConfig(tile_tokens=64, num_warps=4, num_stages=1, programs_per_sm=4), None),
    "t64-w8-s3": (DecodeKernelConfig(tile_tokens=64, num_warps=8, num_stages=3, programs_per_sm=3), None),
    "t32-w4-s3": (DecodeKernelConfig(tile_tokens=32, num_warps=4, num_stages=3, programs_per_sm=5), None),
    "t32-w4-s4": (DecodeKernelConfig(tile_tokens=32, num_warps=4, num_stages=4, programs_per_sm=4), None),
    "t16-w4-s4": (DecodeKernelConfig(tile_tokens=16, num_warps=4, num_stages=4, programs_per_sm=7), None),
    "t128-w8-s2": (DecodeKernelConfig(tile_tokens=128, num_warps=8, num_stages=2, programs_per_sm=2), None),
    "t64-w4-s3 fp32 dots": (dataclasses.replace(DEFAULT_CONFIG, dot_in_fp32=True, programs_per_sm=2), None),
}
SWEEP_SHAPES = ((1, 2048), (16, 2048), (64, 2048), (256, 2048), (1, 8192), (16, 8192))


@dataclass
class PagedCase:
    """One layer's paged K/V for ``batch`` sequences of ``context`` keys, and the metadata both paths read."""

    q: torch.Tensor  # [B, heads, head_dim]
    k_cache: torch.Tensor  # [num_blocks, block_size, kv_heads, head_dim]
    v_cache: torch.Tensor
    block_tables: torch.Tensor  # [B, blocks per sequence] int32, physical blocks shuffled
    context_lens: torch.Tensor  # [B] int32
    context: int

    @property
    def kv_bytes(self) -> int:
        """K and V bytes the attention must read: every sequence's keys, once."""
        batch, _, head_dim = self.q.shape
        kv_heads = self.k_cache.shape[2]
        return 2 * batch * self.context * kv_heads * head_dim * self.k_cache.element_size()

    @property
    def min_bytes(self) -> int:
        return self.kv_bytes + 2 * self.q.numel() * self.q.element_size()  # + q read, output written


def make_case(batch: int, context: int, num_heads: int, num_kv_heads: int, head_dim: int, block_size: int,
              dtype: torch.dtype, device: torch.device, seed: int = 0) -> PagedCase:
    gen = torch.Generator(device=device).manual_seed(seed)
    blocks_per_seq = -(-context // block_size)
    num_blocks = batch * blocks_per_seq
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_cache = torch.randn(shape, generator=gen, device=device, dtype=dtype)
    v_cache = torch.randn(shape, generator=gen, device=device, dtype=dtype)
    tables = torch.randperm(num_blocks, generator=gen, device=device).view(batch, blocks_per_seq).to(torch.int32)
    q = torch.randn((batch, num_heads, head_dim), generator=gen, device=device, dtype=dtype)
    lens = torch.full((batch,), context, dtype=torch.int32, device=device)
    return PagedCase(q, k_cache, v_cache, tables, lens, context)


class _PoolView:
    """What m04's ``DecodeAttention`` reads from a ``KVPool`` (``k[layer]``, ``v[layer]``: ``[slots, heads, dim]``),
    over this benchmark's paged cache. ``write`` does nothing: both paths would store the step's K/V alike."""

    def __init__(self, k_cache: torch.Tensor, v_cache: torch.Tensor) -> None:
        self.k = k_cache.view(1, -1, *k_cache.shape[2:])
        self.v = v_cache.view(1, -1, *v_cache.shape[2:])

    def write(self, layer_idx: int, slot_mapping: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        pass


def gather_path(case: PagedCase):
    """m04's decode attention over the same pool: a callable returning ``[B, heads, head_dim]``."""
    batch, num_heads, head_dim = case.q.shape
    block_size = case.k_cache.shape[1]
    positions = torch.arange(case.context, device=case.q.device)
    # kv_indices[b, j]: the pool slot of key j of sequence b (every row is `context` keys long: no padding)
    kv_indices = case.block_tables.long()[:, positions // block_size] * block_size + positions % block_size
    key_mask = (positions[None, :] < case.context_lens[:, None].long())[:, None, None, :]
    attention = DecodeAttention(_PoolView(case.k_cache, case.v_cache), slot_mapping=None, kv_indices=kv_indices,
                                key_mask=key_mask)
    q = case.q[:, None]  # [B, T=1, heads, head_dim], the model's layout
    new_kv = case.k_cache.new_zeros((batch, 1, *case.k_cache.shape[2:]))  # the step's K/V: handed to write()
    return lambda: attention(0, q, new_kv, new_kv).view(batch, num_heads, head_dim)


def triton_path(case: PagedCase, config: DecodeKernelConfig, num_splits: int | None):
    scale = case.q.shape[-1] ** -0.5
    out = torch.empty_like(case.q)
    return lambda: paged_decode_attention(case.q, case.k_cache, case.v_cache, case.block_tables, case.context_lens,
                                          scale, max_context_len=case.context, num_splits=num_splits, out=out,
                                          config=config)


class Timer:
    """Median milliseconds of a callable: CUDA events with L2 flushed before each call, or wall time on a CPU."""

    def __init__(self, device: torch.device, repeats: int, warmup: int = 3, wall_calls: int = 20) -> None:
        self.device, self.repeats, self.warmup, self.wall_calls = device, repeats, warmup, wall_calls
        self.flush = torch.empty(L2_FLUSH_BYTES, dtype=torch.int8, device=device) if device.type == "cuda" else None

    def __call__(self, fn, flush_l2: bool = True) -> float:
        for _ in range(self.warmup):  # the first call compiles the kernel
            fn()
        if self.device.type != "cuda":
            times = []
            for _ in range(self.repeats):
                start = time.perf_counter()
                fn()
                times.append((time.perf_counter() - start) * 1e3)
            return statistics.median(times)
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                  for _ in range(self.repeats)]
        torch.cuda.synchronize(self.device)
        for start, end in events:
            if flush_l2:
                self.flush.zero_()
            start.record()
            fn()
            end.record()
        torch.cuda.synchronize(self.device)
        return statistics.median(start.elapsed_time(end) for start, end in events)


    def back_to_back_ms(self, fn, calls: int = 20) -> float:
        """Milliseconds per call when ``calls`` calls are issued back to back, as an eager engine issues them:
        whichever is slower, the GPU or the CPU launching the kernels. Median of 3 such loops."""
        loops = []
        for _ in range(3):
            if self.device.type == "cuda":
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                torch.cuda.synchronize(self.device)
                start.record()
                for _ in range(calls):
                    fn()
                end.record()
                end.synchronize()
                loops.append(start.elapsed_time(end) / calls)
            else:
                begin = time.perf_counter()
                for _ in range(calls):
                    fn()
                loops.append((time.perf_counter() - begin) * 1e3 / calls)
        return statistics.median(loops)


def copy_bandwidth_gbs(timer: Timer, nbytes: int) -> float:
    """Device-to-device copy bandwidth, counting the bytes read and the bytes written."""
    src = torch.empty(nbytes, dtype=torch.uint8, device=timer.device).random_(0, 255)
    dst = torch.empty_like(src)
    ms = timer(lambda: dst.copy_(src), flush_l2=False)
    return 2 * nbytes / (ms * 1e-3) / 1e9


def measure(case: PagedCase, timer: Timer, config: DecodeKernelConfig, num_splits: int | None,
            copy_gbs: float, reference: torch.Tensor, gather=None) -> dict:
    """One configuration on one case: time, GB/s, fraction of the copy bandwidth, difference from the gather path
    (and, given the gather path's callable, its times and the speed-ups)."""
    run = triton_path(case, config, num_splits)
    out = run().clone()
    ms = timer(run)
    batch, _, _ = case.q.shape
    splits = num_splits or choose_num_splits(batch, case.k_cache.shape[2], case.context, sm_count(case.q.device),
                                             config)
    gbs = case.min_bytes / (ms * 1e-3) / 1e9
    row = {"batch": batch, "context": case.context, "num_splits": splits, "kv_bytes": case.kv_bytes,
           "bytes": case.min_bytes, "triton_ms": ms, "triton_gbs": gbs, "copy_fraction": gbs / copy_gbs,
           "max_abs_diff": (out.float() - reference.float()).abs().max().item()}
    if gather is not None:
        row["gather_ms"] = timer(gather)
        row["speedup"] = row["gather_ms"] / ms
        row["triton_wall_ms"] = timer.back_to_back_ms(run, calls=timer.wall_calls)
        row["gather_wall_ms"] = timer.back_to_back_ms(gather, calls=timer.wall_calls)
        row["speedup_wall"] = row["gather_wall_ms"] / row["triton_wall_ms"]
    return row


def check_targets(cases: list[dict]) -> dict:
    """The issue's H200 targets, where this run measured the cases they name."""
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


def print_table(title: str, rows: list[dict], key: str | None = None) -> None:
    print(f"\n{title}")
    head = f"{'config':24s} " if key else ""
    print(head + f"{'batch':>5} {'context':>7} {'splits':>6} {'triton ms':>10} {'gather ms':>10} {'speedup':>8} "
          f"{'b2b':>7} {'GB/s':>8} {'of copy':>8} {'max |diff|':>10}")
    for r in rows:
        name = f"{r[key]:24s} " if key else ""
        gather = (f"{r['gather_ms']:10.4f} {r['speedup']:7.2f}x {r['speedup_wall']:6.2f}x" if "gather_ms" in r
                  else f"{'':10s} {'':8s} {'':7s}")
        print(name + f"{r['batch']:5d} {r['context']:7d} {r['num_splits']:6d} {r['triton_ms']:10.4f} {gather} "
              f"{r['triton_gbs']:8.1f} {r['copy_fraction']:7.1%} {r['max_abs_diff']:10.2e}")


def parse_ints(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.kernel_bench", description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=parse_ints, default=None, help="batch sizes (default 1,16,64,256)")
    parser.add_argument("--context", type=parse_ints, default=None, help="keys per sequence (default 512,2048,8192)")
    parser.add_argument("--quick", action="store_true", help="batch 1,16,64 at context 2048 only")
    parser.add_argument("--autotune-sweep", action="store_true", help="also time every SWEEP_CONFIGS entry")
    parser.add_argument("--sweep-shapes", default=None, help="BxC,BxC,... for the sweep (default: SWEEP_SHAPES)")
    parser.add_argument("--num-heads", type=int, default=16)
    parser.add_argument("--num-kv-heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--dtype", choices=("bfloat16", "float16", "float32"), default="bfloat16")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--repeats", type=int, default=None, help="timed calls per measurement (default 30; 2 on CPU)")
    parser.add_argument("--copy-mib", type=int, default=None, help="copy-bandwidth buffer (default 1024; 16 on CPU)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=None, help="JSON path (default benchmarks/results/<gpu>/kernel_bench.json)")
    return parser


def parse_shapes(text: str) -> tuple[tuple[int, int], ...]:
    try:
        shapes = tuple(tuple(int(x) for x in item.split("x")) for item in text.split(","))
    except ValueError:
        shapes = ()
    if not shapes or any(len(s) != 2 or min(s) < 1 for s in shapes):
        raise SystemExit(f"error: --sweep-shapes wants BATCHxCONTEXT,... (e.g. 1x2048,64x2048), got {text!r}")
    return shapes


def run(args: argparse.Namespace) -> dict:
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    if cuda:
        torch.backends.cuda.enable_cudnn_sdp(False)  # as the engines do (m01's LLMEngine)
    dtype = getattr(torch, args.dtype)
    batches = args.batch or (QUICK_BATCHES if args.quick else BATCHES)
    contexts = args.context or (QUICK_CONTEXTS if args.quick else CONTEXTS)
    timer = Timer(device, args.repeats or (30 if cuda else 2), warmup=3 if cuda else 1, wall_calls=20 if cuda else 1)
    copy_gbs = copy_bandwidth_gbs(timer, (args.copy_mib or (1024 if cuda else 16)) * 2**20)
    print(f"device-to-device copy: {copy_gbs:,.0f} GB/s (read + write)")
    shape = (args.num_heads, args.num_kv_heads, args.head_dim, args.block_size, dtype, device)

    cases = []
    for batch in batches:
        for context in contexts:
            case = make_case(batch, context, *shape, seed=args.seed)
            gather = gather_path(case)
            reference = gather().clone()
            row = measure(case, timer, DEFAULT_CONFIG, None, copy_gbs, reference, gather=gather)
            cases.append(row)
            print(f"batch {batch:4d} x context {context:5d}: triton {row['triton_ms']:.4f} ms, gather "
                  f"{row['gather_ms']:.4f} ms ({row['speedup']:.2f}x; back to back {row['speedup_wall']:.2f}x), "
                  f"{row['copy_fraction']:.0%} of copy")
            del case, gather, reference

    sweep = []
    if args.autotune_sweep:
        shapes = parse_shapes(args.sweep_shapes) if args.sweep_shapes else SWEEP_SHAPES
        for batch, context in shapes:
            case = make_case(batch, context, *shape, seed=args.seed)
            reference = gather_path(case)().clone()
            for name, (config, num_splits) in SWEEP_CONFIGS.items():
                row = measure(case, timer, config, num_splits, copy_gbs, reference)
                sweep.append({"config_name": name, "config": dataclasses.asdict(config), **row})
            del case, reference

    failures = [r for r in cases + sweep if not r["max_abs_diff"] <= BF16_TOLERANCE]
    return {
        "name": "kernel_bench",
        "env": environment(device),
        "shape": {"num_heads": args.num_heads, "num_kv_heads": args.num_kv_heads, "head_dim": args.head_dim,
                  "block_size": args.block_size, "dtype": args.dtype},
        "config": dataclasses.asdict(DEFAULT_CONFIG),
        "num_sms": sm_count(device),
        "timing": {"method": "median of CUDA-event timings, L2 flushed before each call" if cuda
                   else "median wall time (CPU: Triton interpreter)", "repeats": timer.repeats,
                   "wall": f"*_wall_ms: per call over {timer.wall_calls} calls issued back to back, no flush "
                           "(GPU time or CPU launch time, whichever is larger), median of 3 loops"},
        "copy_bandwidth_gbs": copy_gbs,
        "tolerance": BF16_TOLERANCE,
        "cases": cases,
        "targets": check_targets(cases),
        "sweep": sweep,
        "ok": not failures,
    }


def main(argv: list[str] | None = None) -> dict:
    args = build_parser().parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit("error: --device cuda but no CUDA device is available (try --device cpu with tiny sizes)")
    result = run(args)
    print_table("triton (default config) against m04's gather + SDPA", result["cases"])
    if result["sweep"]:
        print_table("--autotune-sweep", result["sweep"], key="config_name")
        for batch, context in dict.fromkeys((r["batch"], r["context"]) for r in result["sweep"]):
            rows = [r for r in result["sweep"] if (r["batch"], r["context"]) == (batch, context)]
            best = min(rows, key=lambda r: r["triton_ms"])
            print(f"best at batch {batch} x {context}: {best['config_name']} ({best['triton_ms']:.4f} ms)")
    for name, ok in result["targets"].items():
        print(f"target {name}: {'met' if ok else 'NOT met'}")
    path = Path(args.out) if args.out else Path("benchmarks/results") / result["env"]["gpu_slug"] / "kernel_bench.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2))
    print(f"-> {path}")
    if not result["ok"]:
        bad = [r for r in result["cases"] + result["sweep"] if not r["max_abs_diff"] <= BF16_TOLERANCE]
        shapes = ", ".join(f"{r.get('config_name', 'default')} {r['batch']}x{r['context']}: {r['max_abs_diff']:.3g}"
                           for r in bad)
        print(f"FAILED: max |triton - gather| above {BF16_TOLERANCE} in {shapes}", file=sys.stderr)
        raise SystemExit(1)
    return result


if __name__ == "__main__":
    main()
