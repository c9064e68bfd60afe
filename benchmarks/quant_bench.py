"""Microbenchmark: m13's quantized matmuls against bf16 ``F.linear`` at Qwen3-8B's layer shapes, every candidate.

    python -m benchmarks.quant_bench                 # H200: 5 shapes x batch 1-2048 x every candidate, < 3 min
    python -m benchmarks.quant_bench --quick         # the launch table only, ~1 min
    python -m benchmarks.quant_bench --device cpu --shapes 64x256 --batches 1,16 --quick   # interpreter smoke test

Each case is one matmul ``x [M, K] @ W[N, K]^T`` of one of Qwen3-8B's linear layers: bf16 through cuBLAS, int8
and int4 through ``quantized_matmul`` with each ``launch_config.CANDIDATES`` entry that runs at that M, smallest
M first until ``--budget-s`` is spent. Timed as ``kernel_bench`` times (GPU time from CUDA graphs, the weight
rotated over copies holding 4x the L2 cache); every output checked against bf16 on the dequantized weight. It
prints the launch table its measurements favour and the batch-1 sum of the 36 layers' matmuls plus the LM head.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import statistics
import sys
import time

import torch
import torch.nn.functional as F

from milestones.common.demo import positive_int_list
from milestones.m08_triton_kernel.launch_config import sm_count
from milestones.m13_quantization.launch_config import (CANDIDATES, LAUNCH_TABLE, QuantMatmulConfig,
                                                       choose_launch, choose_split_k, fits_method, regime)
from milestones.m13_quantization.matmul_kernels import quantized_matmul
from milestones.m13_quantization.quantize import (TILE_ROWS, dequantize_weight, group_major, quantize_weight,
                                                  tile_int4)

from .env import environment, save
from .kernel_bench import Timing, copies_needed, require_device

QWEN3_8B_SHAPES = {  # name -> (N, K), after m10's packing
    "qkv_proj": (6144, 4096), "o_proj": (4096, 4096), "gate_up_proj": (24576, 4096), "down_proj": (4096, 12288),
    "lm_head": (151936, 4096),
}
NUM_LAYERS = 36
BATCHES = (1, 4, 16, 64, 256, 2048)
CANDIDATE_BATCHES = {"gemv": (1, 2, 4), "small": (4, 8, 16, 32), "large": (64, 256), "prefill": (2048,)}  # if run
TOLERANCE = 2e-2  # max |out - reference| / max |reference|, reference: bf16 F.linear on the dequantized weight


@dataclasses.dataclass
class Weights:
    """``copies`` copies of one layer's weight in one format (bf16: the matrix; int8/int4: qweight, scales)."""

    method: str
    tensors: list[tuple[torch.Tensor, torch.Tensor | None]]
    nbytes: int  # of one copy, scales included


def make_weights(n: int, k: int, method: str, device: torch.device, seed: int) -> Weights:
    """As many copies as ``copies_needed`` asks for one copy's bytes."""
    dense = torch.randn((n, k), generator=torch.Generator(device=device).manual_seed(seed), device=device) * 0.02
    first = (dense.to(torch.bfloat16), None) if method == "bf16" else quantize_weight(dense, method)
    if method == "int4":  # the layout QuantizedLinear keeps: tiles where N allows, scales group by group
        first = (tile_int4(first[0]) if n % TILE_ROWS == 0 else first[0], group_major(first[1]))
    del dense
    nbytes = sum(t.numel() * t.element_size() for t in first if t is not None)
    copies = copies_needed(nbytes, device)
    clones = [(w.clone(), None if s is None else s.clone()) for w, s in [first] * (copies - 1)]
    return Weights(method, [first] + clones, nbytes)


def calls(weights: Weights, x: torch.Tensor, config: QuantMatmulConfig | None) -> list:
    if weights.method == "bf16":
        return [lambda w=w: F.linear(x, w) for w, _ in weights.tensors]
    return [lambda w=w, s=s: quantized_matmul(x, w, s, weights.method, config=config) for w, s in weights.tensors]


def reference(weights: Weights, x: torch.Tensor) -> torch.Tensor:
    w, s = weights.tensors[0]  # bf16 F.linear on the dequantized weight
    return F.linear(x, w if s is None else dequantize_weight(w, s, weights.method, torch.bfloat16)).float()


def relative_error(out: torch.Tensor, expected: torch.Tensor) -> float:
    return ((out.float() - expected).abs().max() / expected.abs().max().clamp(min=1e-30)).item()


def candidates_for(method: str, m: int, only: frozenset[str] | None) -> dict[str, QuantMatmulConfig]:
    """Configurations timed for ``method`` at ``M`` rows: the launch table's entry, and every candidate of every
    regime that runs at this ``M`` (only those named in ``only``, if given: none for ``--quick``)."""
    table = {f"table {regime(m, method)}": LAUNCH_TABLE[method][regime(m, method)]}
    found = {name: config for kind, configs in CANDIDATES.items() if m in CANDIDATE_BATCHES[kind]
             for name, config in configs.items() if fits_method(config, method) and (only is None or name in only)}
    return found | {name: c for name, c in table.items() if c not in found.values()}


def measure_case(name: str, n: int, k: int, m: int, weights: Weights, timing: Timing, copy_gbs: float,
                 only: frozenset[str] | None, seed: int) -> list[dict]:
    """One shape at ``M`` rows in one format: cuBLAS for bf16, each applicable configuration for int8 / int4."""
    method, device = weights.method, timing.device
    x = torch.randn((m, k), generator=torch.Generator(device=device).manual_seed(seed + m), device=device,
                    dtype=torch.bfloat16)
    expected = reference(weights, x)
    options = {"cuBLAS": None} if method == "bf16" else candidates_for(method, m, only)
    rows = []
    for config_name, config in options.items():
        if config_name.startswith("table "):  # what the engine launches: gemv's block_n fitted to N
            config = choose_launch(method, m, n, k, sm_count(device))[0]
        path = calls(weights, x, config)
        error = relative_error(path[0](), expected)
        ms = timing.gpu_ms(path)
        moved = weights.nbytes + x.numel() * x.element_size() + m * n * 2
        gbs = moved / (ms * 1e-3) / 1e9
        in_table = config is None or config_name.startswith("table ")
        rows.append({"shape": name, "n": n, "k": k, "m": m, "method": method, "config_name": config_name,
                     "config": None if config is None else dataclasses.asdict(config), "in_table": in_table,
                     "split_k": None if config is None else choose_split_k(m, n, k, sm_count(device), config),
                     "ms": ms, "bytes": moved, "gbs": gbs, "copy_fraction": gbs / copy_gbs,
                     "max_rel_error": error, "copies": len(weights.tensors)})
        print(f"  {name:12s} {method:4s} M={m:<4d} {config_name:26s} {ms * 1e3:9.1f} us {gbs:7.0f} GB/s "
              f"({rows[-1]['copy_fraction']:.0%} of copy)  err {error:.1e}", flush=True)
    return rows


def recommend(rows: list[dict]) -> dict:
    """Per method and regime: the configuration whose times, over every shape and batch of the regime it was
    timed at, are closest to the best time reached there (geometric mean of time / best; 1.0: best everywhere)."""
    table = {"int8": {}, "int4": {}}
    for method, kind in itertools.product(table, ("gemv", "small", "large", "prefill")):
        times: dict[str, dict] = {}  # config name -> (shape, M) -> ms, over the cells of this method and regime
        for r in rows:
            if r["method"] == method and regime(r["m"], method) == kind:
                times.setdefault(r["config_name"], {})[(r["shape"], r["m"])] = r["ms"]
        cells = {cell for per_config in times.values() for cell in per_config}
        best = {cell: min(t[cell] for t in times.values() if cell in t) for cell in cells}
        scores = {name: statistics.geometric_mean([t[c] / best[c] for c in cells])
                  for name, t in times.items() if t.keys() == cells}
        if scores:
            name = min(scores, key=scores.get)
            config = next(r["config"] for r in rows if r["config_name"] == name and r["method"] == method)
            table[method][kind] = {"config_name": name, "score": scores[name], "config": config,
                                   "scores": dict(sorted(scores.items(), key=lambda item: item[1]))}
    paste = ["LAUNCH_TABLE: dict[str, dict[str, QuantMatmulConfig]] = {"]
    for method, regimes in table.items():
        paste.append(f"    \"{method}\": {{")
        paste += [f"        \"{kind}\": {QuantMatmulConfig(**entry['config'])!r},  # {entry['config_name']}"
                  for kind, entry in regimes.items()]
        paste.append("    },")
    paste.append("}")
    return {"table": table, "paste": "\n".join(paste)}


def batch1_sums(rows: list[dict]) -> dict:
    """At M = 1: 36 x (qkv + o + gate_up + down) + lm_head, with the launch table's configuration (and with the
    best candidate per shape), per method; the ratio bf16 / method."""
    def total(times: dict) -> float:
        return NUM_LAYERS * sum(times[s] for s in QWEN3_8B_SHAPES if s != "lm_head") + times["lm_head"]

    sums = {}
    for method in ("bf16", "int8", "int4"):  # bf16 first: the others' speed-ups are against it
        at1 = [r for r in rows if r["method"] == method and r["m"] == 1]
        if {r["shape"] for r in at1} != set(QWEN3_8B_SHAPES):
            continue
        table = {r["shape"]: r["ms"] for r in at1 if r["in_table"]}
        best = {shape: min(r["ms"] for r in at1 if r["shape"] == shape) for shape in QWEN3_8B_SHAPES}
        sums[method] = {"table_ms": total(table) if table.keys() == best.keys() else None, "best_ms": total(best)}
        for key in ("table_ms", "best_ms") if method != "bf16" and "bf16" in sums else ():
            if sums[method][key] and sums["bf16"][key]:
                sums[method][key.replace("_ms", "_speedup")] = sums["bf16"][key] / sums[method][key]
    return sums


def parse_shapes(text: str) -> dict[str, tuple[int, int]]:
    """argparse ``type=`` for ``"NxK,NxK"`` -> {"NxK": (N, K)}: positive integers, K a multiple of 128."""
    try:
        pairs = [tuple(int(x) for x in item.split("x")) for item in text.split(",")]
    except ValueError:
        pairs = []
    if not pairs or any(len(p) != 2 or min(p) < 1 or p[1] % 128 for p in pairs):
        raise argparse.ArgumentTypeError(f"expected NxK pairs with K a multiple of 128 (e.g. 4096x4096), got {text!r}")
    return {f"{n}x{k}": (n, k) for n, k in pairs}


def parse_candidates(text: str) -> frozenset[str]:
    """argparse ``type=`` for comma-separated names of ``launch_config.CANDIDATES``."""
    names, known = frozenset(filter(None, map(str.strip, text.split(",")))), {n for c in CANDIDATES.values() for n in c}
    if not names or names - known:
        raise argparse.ArgumentTypeError(f"unknown {sorted(names - known) or text!r}: use {', '.join(sorted(known))}")
    return names


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.quant_bench", description=__doc__.split("\n")[0])
    only = parser.add_mutually_exclusive_group()
    only.add_argument("--quick", dest="candidates", action="store_const", const=frozenset(),
                      help="the launch table's configuration only")
    parser.add_argument("--methods", type=lambda t: t.split(","), default=["bf16", "int8", "int4"],
                        help="formats to time (default bf16,int8,int4)")
    parser.add_argument("--shapes", type=parse_shapes, default=None, help="NxK,... (default: Qwen3-8B's five)")
    parser.add_argument("--batches", type=positive_int_list, default=BATCHES,
                        help="rows of x (default 1,4,16,64,256,2048)")
    only.add_argument("--candidates", type=parse_candidates, help="names from launch_config.CANDIDATES to time "
                      "beside the table's entry, each at its regime's CANDIDATE_BATCHES (default: all)")
    parser.add_argument("--budget-s", type=float, default=150.0, help="stop starting new cases after this long")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--rep-ms", type=int, default=20, help="ms of graph replays per GPU time (do_bench_cudagraph)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=None, help="JSON path (default benchmarks/results/<gpu>/quant_bench.json)")
    return parser


def run(args: argparse.Namespace) -> dict:
    began = time.perf_counter()
    device = require_device(args.device)
    timing = Timing(device, rep_ms=args.rep_ms)
    copy_gbs = timing.copy_bandwidth_gbs()
    shapes = args.shapes or QWEN3_8B_SHAPES
    # each weight made once (quantizing the LM head takes a moment), kept for every batch size
    weights = {(name, method): make_weights(n, k, method, device, args.seed)
               for name, (n, k) in shapes.items() for method in args.methods}
    print(f"weights made ({time.perf_counter() - began:.0f} s)", flush=True)
    rows, skipped = [], []
    for m in args.batches:  # batch 1 first: the figure the targets are about
        for name, (n, k) in shapes.items():
            for method in args.methods:
                if time.perf_counter() - began > args.budget_s:
                    skipped.append(f"{name} {method} M={m}")
                    continue
                rows += measure_case(name, n, k, m, weights[name, method], timing, copy_gbs, args.candidates, args.seed)
    if skipped:
        print(f"time budget ({args.budget_s:.0f} s) spent: not measured: {', '.join(skipped)}", flush=True)
    timing_notes = {"gpu": timing.describe("the weight"),
                    "bytes": "the weight (qweight + scales, or the bf16 matrix), x and the output, each once"}
    return {"name": "quant_bench", "env": environment(device),
            "shapes": {name: {"n": n, "k": k} for name, (n, k) in shapes.items()},
            "launch_table": {m: {k: dataclasses.asdict(c) for k, c in t.items()} for m, t in LAUNCH_TABLE.items()},
            "num_sms": sm_count(device), "timing": timing_notes, "copy_bandwidth_gbs": copy_gbs, "tolerance": TOLERANCE,
            "candidates": None if args.candidates is None else sorted(args.candidates),
            "rows": rows, "recommended": recommend(rows), "batch1_sums": batch1_sums(rows),
            "total_s": time.perf_counter() - began, "skipped": skipped,
            "ok": all(r["max_rel_error"] <= TOLERANCE for r in rows)}


def main(argv: list[str] | None = None) -> dict:
    args = build_parser().parse_args(argv)
    result = run(args)
    print("\nrecommended launch table (paste into milestones/m13_quantization/launch_config.py):")
    print(result["recommended"]["paste"])
    for method, entry in result["batch1_sums"].items():
        speedups = {k: round(v, 2) for k, v in entry.items() if k.endswith("speedup")}
        print(f"batch-1 sum of Qwen3-8B's matmuls, {method}: table {entry['table_ms']} ms, best {entry['best_ms']:.3f} "
              f"ms {speedups or ''}")
    save(result, "quant_bench.json", args.out, indent=1)
    if not result["ok"]:
        bad = [f"{r['shape']} {r['method']} M={r['m']} {r['config_name']}: {r['max_rel_error']:.3g}"
               for r in result["rows"] if not r["max_rel_error"] <= TOLERANCE]
        print(f"FAILED: relative error above {TOLERANCE} in {'; '.join(bad)}", file=sys.stderr)
        raise SystemExit(1)
    return result


if __name__ == "__main__":
    main()
