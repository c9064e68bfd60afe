"""Microbenchmark: m08's paged decode kernel against m04's gather + SDPA, for one attention layer of Qwen3-0.6B.

    python -m benchmarks.kernel_bench                    # H200: batch {1,16,64,256} x context {512,2048,8192}
    python -m benchmarks.kernel_bench --autotune-sweep   # also every SWEEP_CONFIGS entry, and the LAUNCH_TABLE
                                                         # those measurements favour
    python -m benchmarks.kernel_bench --launch-costs     # instead: one eager launch taken apart (launch_costs.json)

Each case is one decode step of one layer (random bf16 K/V in a shuffled paged pool) through ``triton``
(``paged_decode_attention``, its launch table's choice) and ``gather`` (m04's ``DecodeAttention``). The headline
``*_ms`` is GPU time from a CUDA graph (``Timing``), with calls rotating over copies of the K/V that hold 4x the
L2 cache; ``*_wall_ms`` and ``*_host_ms`` are eager. Outputs must agree within a bf16 tolerance. What is timed
and why: docs/m08-triton-kernel.md and benchmarks/KERNEL_NOTES.md. Without CUDA: a smoke test in the interpreter.

``--launch-costs``: where the host time of one eager launch goes, each part alone (the median of ``--rounds`` rounds
of ``--iterations`` back-to-back calls): an ``nn.Module`` returning its input (``python_call_us``),
``torch.cuda._sleep(0)`` (``raw_launch_us``), ``torch.add`` on 16 elements (``torch_op_us``), a 16 x 16
``nn.Linear`` (``module_op_us``), a one-program Triton kernel (``triton_launch_us``), and one ``torch.add``
replayed in a CUDA graph (``graph_kernel_us``, GPU time). On a CPU: the Python and dispatcher parts only.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import math
import statistics
import sys
import time
import timeit
from collections.abc import Callable
from dataclasses import dataclass

import torch
import triton
import triton.language as tl
import triton.testing
from tabulate import tabulate

from milestones.common.demo import positive_int, positive_int_list
from milestones.m04_continuous_batching.kv_pool import DecodeAttention
from milestones.m08_triton_kernel.launch_config import (LAUNCH_TABLE, DecodeKernelConfig, choose_launch,
                                                        choose_num_splits, sm_count)
from milestones.m08_triton_kernel.paged_decode_kernel import paged_decode_attention

from .env import default_path, environment, write_json

BATCHES = (1, 16, 64, 256)
CONTEXTS = (512, 2048, 8192)
BF16_TOLERANCE = 2e-2  # max |triton - gather|: a few bf16 ulps at the outputs' magnitude (< 1)
L2_MULTIPLE = 4  # the rotated copies of a case hold at least this many times the L2 cache...
MAX_COPIES = 256  # ...up to this many (1 x 512 on an H200 needs about a hundred; only toy sizes reach the cap)
MIN_EAGER_CALLS = 20  # calls per eager loop on a GPU, at least


def _config(tile: int, warps: int, stages: int, programs_per_sm: int, **more) -> DecodeKernelConfig:
    return DecodeKernelConfig(tile_tokens=tile, num_warps=warps, num_stages=stages, programs_per_sm=programs_per_sm,
                              **more)


# Candidates for LAUNCH_TABLE, each timed in both regimes (see benchmarks/KERNEL_NOTES.md, sections 4 and 6).
# ``programs_per_sm`` is each configuration's occupancy on an H200 when it splits (Triton 3.6, bf16, head_dim 128,
# from its registers and shared memory), so its split heuristic fills exactly one wave; ``ppsm8`` and ``min1`` ask
# what more (or shorter) slices buy.
SWEEP_CONFIGS: dict[str, DecodeKernelConfig] = {
    "t64-w4-s3": _config(64, 4, 3, 3), "t64-w4-s3 ppsm8": _config(64, 4, 3, 8),
    "t64-w4-s3 min1": _config(64, 4, 3, 3, min_tiles_per_split=1),
    "t64-w4-s2": _config(64, 4, 2, 4), "t64-w4-s4": _config(64, 4, 4, 2), "t64-w4-s1": _config(64, 4, 1, 4),
    "t64-w8-s3": _config(64, 8, 3, 3), "t32-w4-s2": _config(32, 4, 2, 7), "t32-w4-s3": _config(32, 4, 3, 6),
    "t32-w4-s4": _config(32, 4, 4, 4), "t16-w4-s4": _config(16, 4, 4, 7), "t128-w8-s2": _config(128, 8, 2, 2),
    "t64-w4-s3 fp32 dots": _config(64, 4, 3, 2, dot_in_fp32=True),
}
SWEEP_SHAPES = ((1, 512), (1, 2048), (1, 8192), (4, 2048), (16, 2048), (16, 8192), (32, 2048), (64, 2048),
                (256, 2048))


def l2_bytes(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).L2_cache_size if device.type == "cuda" else 0


def int_pairs(text: str) -> tuple[tuple[int, int], ...]:
    """argparse ``type=`` for ``AxB,AxB,...`` (positive integers), e.g. ``1x2048,64x2048``."""
    try:
        pairs = tuple(tuple(int(x) for x in item.split("x")) for item in text.split(","))
    except ValueError:
        pairs = ()
    if not pairs or any(len(p) != 2 or min(p) < 1 for p in pairs):
        raise argparse.ArgumentTypeError(f"expected AxB pairs of positive integers (e.g. 64x2048), got {text!r}")
    return pairs


def require_device(device: str) -> torch.device:
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit("error: --device cuda but no CUDA device is available (try --device cpu with tiny sizes)")
    return torch.device(device)


@dataclass
class Timing:
    """A code path is a list of callables, one per copy of its inputs; calls cycle through the copies.
    ``gpu_ms``: GPU time per call from ``do_bench_cudagraph`` (``rep_ms`` of calls in one graph, median replay),
    free of launch costs; ``eager_ms``: (wall, host) ms per call issued back to back from Python (wall: GPU or
    CPU, whichever was slower; host: the CPU's time to issue one). Without CUDA every figure is wall time."""

    device: torch.device
    rep_ms: int = 20
    loops: int = 3

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

    def eager_ms(self, path: list[Callable[[], object]]) -> tuple[float, float]:
        cuda = self.device.type == "cuda"
        n = max(len(path), MIN_EAGER_CALLS) if cuda else len(path)
        walls, hosts = [], []
        for _ in range(self.loops):
            if cuda:
                torch.cuda.synchronize(self.device)
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
            begin = time.perf_counter()
            for i in range(n):
                path[i % len(path)]()
            hosts.append((time.perf_counter() - begin) * 1e3 / n)
            if cuda:
                end.record()
                end.synchronize()
            walls.append(start.elapsed_time(end) / n if cuda else hosts[-1])
        return statistics.median(walls), statistics.median(hosts)

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
    """The sweep's name for ``config``, or its repr if the sweep has none."""
    return next((name for name, c in SWEEP_CONFIGS.items() if c == config), repr(config))


@dataclass
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
              dtype: torch.dtype, device: torch.device, copies: int = 2, seed: int = 0) -> PagedCase:
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


class _PoolView:
    """What m04's ``DecodeAttention`` reads from a ``KVPool`` (``k[layer]``, ``v[layer]``: ``[slots, heads, dim]``),
    over this benchmark's paged cache. ``write`` does nothing: both paths would store the step's K/V alike."""

    def __init__(self, k_cache: torch.Tensor, v_cache: torch.Tensor) -> None:
        self.k = k_cache.view(1, -1, *k_cache.shape[2:])
        self.v = v_cache.view(1, -1, *v_cache.shape[2:])

    def write(self, layer_idx: int, slot_mapping: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        pass


def gather_path(case: PagedCase) -> list:
    """m04's decode attention over the same pool: one callable per copy, each returning ``[B, heads, head_dim]``."""
    batch, num_heads, head_dim = case.q.shape
    block_size = case.k_cache.shape[1]
    positions = torch.arange(case.context, device=case.q.device)
    key_mask = (positions[None, :] < case.context_lens[:, None].long())[:, None, None, :]
    pool = _PoolView(case.k_cache, case.v_cache)
    q = case.q[:, None]  # [B, T=1, heads, head_dim], the model's layout
    new_kv = case.k_cache.new_zeros((batch, 1, *case.k_cache.shape[2:]))  # the step's K/V: handed to write()

    def one(tables: torch.Tensor):
        # kv_indices[b, j]: the pool slot of key j of sequence b (every row is `context` keys long: no padding)
        kv_indices = tables.long()[:, positions // block_size] * block_size + positions % block_size
        attention = DecodeAttention(pool, slot_mapping=None, kv_indices=kv_indices, key_mask=key_mask)
        return lambda: attention(0, q, new_kv, new_kv).view(batch, num_heads, head_dim)

    return [one(tables) for tables in case.block_tables]


def triton_path(case: PagedCase, config: DecodeKernelConfig | None, num_splits: int | None) -> list:
    """``paged_decode_attention`` over each copy (``config=None``: the launch table's choice)."""
    scale, out = case.q.shape[-1] ** -0.5, torch.empty_like(case.q)
    return [lambda tables=tables: paged_decode_attention(
        case.q, case.k_cache, case.v_cache, tables, case.context_lens, scale, max_context_len=case.context,
        num_splits=num_splits, out=out, config=config) for tables in case.block_tables]


def reference_outputs(case: PagedCase) -> dict[int, torch.Tensor]:
    """The gather path's outputs on the first and the last copy: what every Triton run is compared with."""
    gather = gather_path(case)
    return {i: gather[i]().clone() for i in (0, len(gather) - 1)}


def max_abs_diff(path: list, reference: dict[int, torch.Tensor]) -> float:
    return max((path[i]().float() - out.float()).abs().max().item() for i, out in reference.items())


def measure_case(case: PagedCase, timing: Timing, copy_gbs: float) -> dict:
    """The launch table's kernel against the gather path on one case: GPU, eager and host times, GB/s, diff."""
    batch = case.q.shape[0]
    config, splits = choose_launch(batch, case.k_cache.shape[2], case.context, sm_count(case.q.device))
    gather, triton = gather_path(case), triton_path(case, None, None)
    row = {"batch": batch, "context": case.context, "regime": "split" if splits > 1 else "direct",
           "config_name": config_name(config), "num_splits": splits, "copies": len(case.block_tables),
           "kv_bytes": case.kv_bytes, "bytes": case.min_bytes,
           "max_abs_diff": max_abs_diff(triton, reference_outputs(case))}
    row["triton_ms"], row["gather_ms"] = timing.gpu_ms(triton), timing.gpu_ms(gather)
    row["speedup"] = row["gather_ms"] / row["triton_ms"]
    row["triton_gbs"] = case.min_bytes / (row["triton_ms"] * 1e-3) / 1e9
    row["copy_fraction"] = row["triton_gbs"] / copy_gbs
    (row["triton_wall_ms"], row["triton_host_ms"]), (row["gather_wall_ms"], row["gather_host_ms"]) = (
        timing.eager_ms(triton), timing.eager_ms(gather))
    row["speedup_wall"] = row["gather_wall_ms"] / row["triton_wall_ms"]
    return row


def sweep_shape(case: PagedCase, timing: Timing, copy_gbs: float) -> list[dict]:
    """Every SWEEP_CONFIGS entry on one case, direct (one slice) and split (its own heuristic's count, if > 1)."""
    batch = case.q.shape[0]
    reference = reference_outputs(case)
    rows = []
    for name, config in SWEEP_CONFIGS.items():
        splits = choose_num_splits(batch, case.k_cache.shape[2], case.context, sm_count(case.q.device), config)
        regimes = [("direct", 1)] + ([("split", splits)] if splits > 1 else [])  # a split of one is direct
        for regime, num_splits in regimes:
            path = triton_path(case, config, num_splits)
            ms = timing.gpu_ms(path)
            gbs = case.min_bytes / (ms * 1e-3) / 1e9
            rows.append({"config_name": name, "config": dataclasses.asdict(config), "regime": regime,
                         "batch": batch, "context": case.context, "num_splits": num_splits, "triton_ms": ms,
                         "triton_gbs": gbs, "copy_fraction": gbs / copy_gbs,
                         "max_abs_diff": max_abs_diff(path, reference)})
    return rows


def recommend_table(sweep: list[dict]) -> dict:
    """The (direct, split) pair of sweep configurations a launch table should hold. At each shape a table runs
    its split entry if that entry's heuristic splits there, else its direct entry; its score is the geometric mean
    over shapes of its time / the best time reached there (1.0: best everywhere). The lowest-scoring pair wins."""
    shapes = list(dict.fromkeys((r["batch"], r["context"]) for r in sweep))
    best = {s: min(r["triton_ms"] for r in sweep if (r["batch"], r["context"]) == s) for s in shapes}
    direct, split = ({(r["config_name"], (r["batch"], r["context"])): r["triton_ms"] for r in sweep
                      if r["regime"] == regime} for regime in ("direct", "split"))
    names = list(dict.fromkeys(r["config_name"] for r in sweep))

    def table_times(direct_name: str, split_name: str) -> list[tuple[str, str, float]]:
        return [("split", split_name, split[(split_name, s)]) if (split_name, s) in split
                else ("direct", direct_name, direct[(direct_name, s)]) for s in shapes]

    def score(times: list[tuple[str, str, float]]) -> float:
        return statistics.geometric_mean([ms / best[s] for s, (_, _, ms) in zip(shapes, times)])

    current = (config_name(LAUNCH_TABLE["direct"]), config_name(LAUNCH_TABLE["split"]))
    pairs = [(d, s) for d in names for s in names if all((d, shape) in direct for shape in shapes)]
    pairs.sort(key=lambda pair: pair != current)  # on a tie, keep the current table
    direct_name, split_name = min(pairs, key=lambda pair: score(table_times(*pair)))
    chosen = table_times(direct_name, split_name)
    never_split = [statistics.geometric_mean([direct[(d, s)] / best[s] for s in shapes]) for d in {d for d, _ in pairs}]
    return {
        "direct": direct_name, "split": split_name, "score": score(chosen),
        "current": {"direct": current[0], "split": current[1],
                    "score": score(table_times(*current)) if current in pairs else None},
        "never_split_best_score": min(never_split),
        "per_shape": [{"batch": b, "context": c, "regime": regime, "config_name": name, "triton_ms": ms,
                       "best_ms": best[(b, c)],
                       "best_config": min((r for r in sweep if (r["batch"], r["context"]) == (b, c)),
                                          key=lambda r: r["triton_ms"])["config_name"]}
                      for (b, c), (regime, name, ms) in zip(shapes, chosen)],
        "paste": ("LAUNCH_TABLE: dict[str, DecodeKernelConfig] = {\n"
                  f"    \"direct\": {SWEEP_CONFIGS[direct_name]!r},  # {direct_name}\n"
                  f"    \"split\": {SWEEP_CONFIGS[split_name]!r},  # {split_name}\n}}"),
    }


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


def table(rows: list[dict], columns: dict[str, str]) -> str:
    """``rows`` as a text table: header -> ``key:format`` (``key*1e3`` scales by a thousand first)."""
    def cell(row: dict, spec: str) -> str:
        key, _, fmt = spec.partition(":")
        key, _, scale = key.partition("*")
        return format(row[key] * float(scale) if scale else row[key], fmt)

    return tabulate([[cell(r, spec) for spec in columns.values()] for r in rows], headers=list(columns),
                    disable_numparse=True)


def print_cases(rows: list[dict]) -> None:
    print("\ntriton (launch table) against m04's gather + SDPA: GPU time (CUDA graph; wall on a CPU) | eager back to "
          "back | host")
    print(table(rows, {"batch": "batch:", "context": "context:", "regime": "regime:", "splits": "num_splits:",
                       "config": "config_name:", "triton ms": "triton_ms:.4f", "gather ms": "gather_ms:.4f",
                       "speedup (graph)": "speedup:.2f", "eager triton": "triton_wall_ms:.4f",
                       "eager gather": "gather_wall_ms:.4f", "speedup (eager)": "speedup_wall:.2f",
                       "triton us": "triton_host_ms*1e3:.1f", "gather us": "gather_host_ms*1e3:.1f",
                       "GB/s": "triton_gbs:.0f", "of copy": "copy_fraction:.1%", "max|diff|": "max_abs_diff:.2e"}))


def print_sweep(rows: list[dict], recommendation: dict) -> None:
    print("\n--autotune-sweep (GPU time per call)")
    print(table(rows, {"config": "config_name:", "regime": "regime:", "batch": "batch:", "context": "context:",
                       "splits": "num_splits:", "ms": "triton_ms:.4f", "GB/s": "triton_gbs:.0f",
                       "of copy": "copy_fraction:.1%"}))
    rec, current = recommendation, recommendation["current"]
    print(f"\nbest table: direct {rec['direct']}, split {rec['split']} (score {rec['score']:.3f}; 1.0 = best at every "
          f"shape); current table {current['direct']} / {current['split']}: "
          f"{current['score'] if current['score'] is None else round(current['score'], 3)}; "
          f"never splitting at best {rec['never_split_best_score']:.3f}")
    for s in rec["per_shape"]:
        print(f"  {s['batch']:4d} x {s['context']:5d}: {s['regime']:6s} {s['config_name']:22s} {s['triton_ms']:.4f} ms "
              f"(best {s['best_config']}: {s['best_ms']:.4f})")
    print("paste into milestones/m08_triton_kernel/launch_config.py:\n" + rec["paste"])


@triton.jit
def _add_one(x_ptr):
    tl.store(x_ptr, tl.load(x_ptr) + 1.0)


def launch_costs(device: torch.device, iterations: int, rounds: int) -> dict:
    """``--launch-costs``: host microseconds per call of each part alone (``timeit``, the device synced before each
    round, untimed), and the GPU microseconds of an add replayed from a CUDA graph of many."""
    cuda = device.type == "cuda"
    sync = (lambda: torch.cuda.synchronize(device)) if cuda else (lambda: None)
    identity, linear = torch.nn.Identity(), torch.nn.Linear(16, 16, device=device).requires_grad_(False)
    x, a, b, c = (torch.ones(16, device=device) for _ in range(4))
    calls = {"python_call_us": lambda: identity(x), "torch_op_us": lambda: torch.add(a, b, out=c),
             "module_op_us": lambda: linear(x), "raw_launch_us": (lambda: torch.cuda._sleep(0)) if cuda else None,
             "triton_launch_us": (lambda: _add_one[(1,)](x)) if cuda else None}
    parts = {}
    with torch.inference_mode():
        for name, call in calls.items():
            if call is not None:
                timeit.repeat(call, sync, number=max(1, iterations // 10), repeat=1)  # warm-up: compile, allocate
            parts[name] = None if call is None else statistics.median(
                timeit.repeat(call, sync, number=iterations, repeat=rounds)) / iterations * 1e6
    parts["graph_kernel_us"] = None
    if cuda:
        with torch.cuda.device(device):
            parts["graph_kernel_us"] = triton.testing.do_bench_cudagraph(lambda: torch.add(a, b, out=c),
                                                                         return_mode="median") * 1e3
    not_measured = {k: "needs a CUDA GPU (and Triton for triton_launch_us)" for k, v in parts.items() if v is None}
    return {"name": "launch_costs", "env": environment(device), "iterations": iterations, "rounds": rounds,
            "parts": parts, "not_measured": not_measured}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.kernel_bench", description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=positive_int_list, default=None, help="batch sizes (default 1,16,64,256)")
    parser.add_argument("--context", type=positive_int_list, default=None,
                        help="keys per sequence (default 512,2048,8192)")
    parser.add_argument("--autotune-sweep", action="store_true", help="also time every SWEEP_CONFIGS entry")
    parser.add_argument("--sweep-shapes", type=int_pairs, default=SWEEP_SHAPES,
                        help="BxC,BxC,... for the sweep (default: SWEEP_SHAPES)")
    parser.add_argument("--num-heads", type=int, default=16)
    parser.add_argument("--num-kv-heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--dtype", choices=("bfloat16", "float16", "float32"), default="bfloat16")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--rep-ms", type=int, default=20, help="GPU work per CUDA graph, in ms (triton.testing's rep)")
    parser.add_argument("--copy-mib", type=int, default=None, help="copy-bandwidth buffer (default 1024; 16 on CPU)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--launch-costs", action="store_true", help="instead: one eager launch taken apart")
    parser.add_argument("--iterations", type=positive_int, default=2000, help="--launch-costs: calls per round")
    parser.add_argument("--rounds", type=positive_int, default=7, help="--launch-costs: rounds (the median is kept)")
    parser.add_argument("--out", default=None,
                        help="JSON path (default benchmarks/results/<gpu>/kernel_bench.json or launch_costs.json)")
    return parser


def run(args: argparse.Namespace) -> dict:
    device = require_device(args.device)
    cuda = device.type == "cuda"
    if cuda:
        torch.backends.cuda.enable_cudnn_sdp(False)  # as the engines do (m01's LLMEngine)
    dtype = getattr(torch, args.dtype)
    timing = Timing(device, rep_ms=args.rep_ms, loops=3 if cuda else 1)
    copy_gbs = timing.copy_bandwidth_gbs(args.copy_mib)

    def case_for(batch: int, context: int) -> PagedCase:
        torch.cuda.empty_cache()  # the last case's copies (a no-op without CUDA)
        copies = copies_needed(2 * batch * context * args.num_kv_heads * args.head_dim * dtype.itemsize, device)
        return make_case(batch, context, args.num_heads, args.num_kv_heads, args.head_dim, args.block_size, dtype,
                         device, copies, args.seed)

    cases, sweep = [], []
    for batch, context in itertools.product(args.batch or BATCHES, args.context or CONTEXTS):
        row = measure_case(case_for(batch, context), timing, copy_gbs)
        cases.append(row)
        print(f"batch {batch:4d} x context {context:5d}: triton {row['triton_ms']:.4f} ms ({row['regime']}, "
              f"{row['config_name']}), gather {row['gather_ms']:.4f} ms: {row['speedup']:.2f}x (eager back to "
              f"back {row['speedup_wall']:.2f}x), {row['copy_fraction']:.0%} of copy")
    for batch, context in args.sweep_shapes if args.autotune_sweep else ():
        sweep += sweep_shape(case_for(batch, context), timing, copy_gbs)
    timing_notes = {
        "judged_on": "triton_ms, gather_ms, speedup, triton_gbs, copy_fraction: GPU time per call",
        "gpu": timing.describe("the case's K/V"),
        "wall": f"*_wall_ms: the same calls issued eagerly back to back, per call (GPU or CPU, whichever is slower), "
                f"median of {timing.loops} loops",
        "host": "*_host_ms: the CPU's time to issue one eager call (checks, arguments, launches)",
        "why": "GPU time is the layer's work on the GPU, what a CUDA-graph step pays and the only time a GB/s figure "
               "can be read against the copy bandwidth; launch cost is eager's, reported beside it"}
    shape = {"num_heads": args.num_heads, "num_kv_heads": args.num_kv_heads, "head_dim": args.head_dim,
             "block_size": args.block_size, "dtype": args.dtype}
    launch_table = {regime: {"name": config_name(c), **dataclasses.asdict(c)} for regime, c in LAUNCH_TABLE.items()}
    return {"name": "kernel_bench", "env": environment(device), "shape": shape, "launch_table": launch_table,
            "num_sms": sm_count(device), "timing": timing_notes, "copy_bandwidth_gbs": copy_gbs,
            "tolerance": BF16_TOLERANCE, "cases": cases, "targets": check_targets(cases), "sweep": sweep,
            "recommended_table": recommend_table(sweep) if sweep else None,
            "ok": all(r["max_abs_diff"] <= BF16_TOLERANCE for r in cases + sweep)}


def main(argv: list[str] | None = None) -> dict:
    args = build_parser().parse_args(argv)
    if args.launch_costs:
        result = launch_costs(require_device(args.device), args.iterations, args.rounds)
        for name, value in result["parts"].items():
            print(f"{name:18s} {'not measured' if value is None else f'{value:8.2f} us'}")
        print(f"-> {write_json(result, default_path(result, 'launch_costs.json', args.out))}")
        return result
    result = run(args)
    print_cases(result["cases"])
    if result["sweep"]:
        print_sweep(result["sweep"], result["recommended_table"])
    for name, ok in result["targets"].items():
        print(f"target {name} (GPU time): {'met' if ok else 'NOT met'}")
    print(f"-> {write_json(result, default_path(result, 'kernel_bench.json', args.out))}")
    bad = [f"{r['config_name']} {r['batch']}x{r['context']}: {r['max_abs_diff']:.3g}"
           for r in result["cases"] + result["sweep"] if not r["max_abs_diff"] <= BF16_TOLERANCE]
    if bad:
        print(f"FAILED: max |triton - gather| above {BF16_TOLERANCE} in {', '.join(bad)}", file=sys.stderr)
        raise SystemExit(1)
    return result


if __name__ == "__main__":
    main()
