"""Command line: run milestones / baselines on workloads and write one JSON per run.

    python -m benchmarks.run --milestone m01,m02 --workload single,single-sweep --device cuda
    python -m benchmarks.run --milestone m04 --workload nanovllm --config kv_cache_tokens=65536 --tag kv64k

Results go to ``<out>/<gpu-slug>/<milestone>_<workload>.json``; a table is printed at the end. The exit status is
1 if a run failed (a run the engine cannot do at all, such as m03 on ``memory-bound``, is skipped, not failed).
"""

from __future__ import annotations

import argparse
import ast
import sys

from .harness import DEFAULT_MODEL, run_benchmark, save_result
from .report import summary_table
from .runners import registered_runners
from .workloads import WORKLOADS


def config_item(text: str) -> tuple[str, object]:
    """``key=value``; the value is a Python literal where it parses (``64``, ``None``, ``True``), else a string."""
    key, sep, raw = text.partition("=")
    if not sep or not key:
        raise SystemExit(f"--config wants key=value, got {text!r}")
    try:
        return key, ast.literal_eval(raw)
    except (ValueError, SyntaxError):
        return key, raw


def comma_list(text: str) -> list[str]:
    return [v for v in text.split(",") if v]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.run", description=__doc__.split("\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--milestone", "-m", action="extend", type=comma_list, required=True,
                        help=f"m01, m02, ... or a baseline ({', '.join(registered_runners())}); repeat or "
                        "comma-separate")
    parser.add_argument("--workload", "-w", action="extend", type=comma_list, required=True,
                        help=f"one of {', '.join(WORKLOADS)}; repeat or comma-separate")
    parser.add_argument("--model", default=DEFAULT_MODEL, help="preset (tiny, qwen3-0.6b-random) or checkpoint dir")
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N")
    parser.add_argument("--dtype", default="auto", help="auto (bf16 on CUDA, fp32 on CPU), float32, bfloat16, float16")
    parser.add_argument("--out", default="benchmarks/results", help="results root; files go to <out>/<gpu-slug>/")
    parser.add_argument("--max-requests", type=int, default=None, help="run only the first N requests")
    parser.add_argument("--full", action="store_true", help="ignore the default slices of slow milestones")
    parser.add_argument("--config", action="append", type=config_item, default=[], metavar="KEY=VALUE",
                        help="engine config override, e.g. max_num_seqs=32 or kv_cache_tokens=65536")
    parser.add_argument("--seed", type=int, default=0, help="weights / sampler seed")
    parser.add_argument("--workload-seed", type=int, default=0, help="seed of the random prompts and lengths")
    parser.add_argument("--no-progress", action="store_true", help="no tqdm progress bars")
    parser.add_argument("--no-save", action="store_true", help="print the table only")
    parser.add_argument("--tag", default=None, help="append +TAG to the result names (runs with non-default knobs)")
    parser.add_argument("--no-inject", action="store_true", help="chunked, chunked-long: submit everything through "
                        "generate even where the engine has a step API")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    for w in args.workload:
        if w not in WORKLOADS:
            raise SystemExit(f"unknown workload {w!r}: choose from {', '.join(WORKLOADS)}")
    results = []
    for milestone in args.milestone:
        for workload in args.workload:
            result = run_benchmark(
                milestone, workload, model=args.model, device=args.device, dtype=args.dtype, seed=args.seed,
                workload_seed=args.workload_seed, max_requests=args.max_requests, full=args.full,
                overrides=dict(args.config), use_tqdm=not args.no_progress, catch_errors=True,
                inject=not args.no_inject, tag=args.tag)
            results.append(result)
            if result["status"] == "skipped":
                print(f"[{result['name']}] skipped: {result['error']}", flush=True)
            elif not args.no_save:
                print(f"[{result['name']}] {result['status']} -> {save_result(result, args.out)}", flush=True)
    print()
    print(summary_table(results))
    return 0 if all(r["status"] in ("ok", "skipped") for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
