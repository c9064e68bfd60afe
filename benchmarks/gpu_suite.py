"""One call on the GPU machine: run named sets of benchmarks inside a time budget, write every result.

    bash benchmarks/gpu_suite.sh --set m01-m02                 # what the shell wrapper runs:
    python -m benchmarks.gpu_suite --set m01-m02 --set baselines --budget-s 510
    python -m benchmarks.gpu_suite --set m04:nanovllm --set m04:chunked   # single runs, milestone:workload
    python -m benchmarks.gpu_suite --list                      # the sets and their rough H200 times
    python -m benchmarks.gpu_suite --unpack /path/to/suite.json  # back home: split into per-run JSON files

Runs go one after another in this process, each with its own engine, warm-up and freed memory. Before a run
starts, the suite checks that its rough H200 estimate still fits in what is left of ``--budget-s``; a run
that does not fit is recorded as ``skipped``, and a run that overruns what is left is stopped and recorded
as ``timeout``, so the call always ends inside the budget. Milestones that do not exist yet are skipped.

Every result goes to ``<out>/<gpu-slug>/<milestone>_<workload>.json`` on the machine, and all of them together
to ``$OUT/suite.json`` (the device tool brings back at most 8 files, so one combined file), with
``$OUT/summary.md`` holding the tables. ``--unpack`` turns a fetched ``suite.json`` into the per-run files.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from .env import git_info, source_fingerprint
from .harness import (BASELINES, DEFAULT_MODEL, resolve_milestone_module, result_path, run_benchmark,
                      save_result, summary_table)
from .workloads import WORKLOADS, milestone_key


@dataclass(frozen=True)
class Entry:
    milestone: str
    workload: str
    est_s: float  # rough H200 time including build and warm-up; used to decide what still fits
    max_requests: int | None = None
    overrides: tuple[tuple[str, object], ...] = ()  # engine config fields, e.g. (("max_num_seqs", 16),)
    tag: str | None = None  # appended to the result name so variants do not overwrite the documented run


# H200 seconds (qwen3-0.6b-random, bf16, transformers 5.17), build + warm-up + timed run: measured for smoke and
# m01-m02 (first H200 run, rounded up); m03-m04 and full-size baselines are estimates until measured.
SETS: dict[str, list[Entry]] = {
    "smoke": [  # every engine on a few requests: does it all run here? (~70 s)
        Entry("m01", "single-sweep", 6, max_requests=2),
        Entry("m02", "offline", 12, max_requests=4),
        Entry("m03", "offline", 10, max_requests=8),
        Entry("m04", "offline", 10, max_requests=8),
        Entry("hf-static", "offline", 15, max_requests=8),
        Entry("hf-cb", "offline", 15, max_requests=8),
    ],
    "m01-m02": [  # measured: ~170 s
        Entry("m01", "single", 8),
        Entry("m02", "single", 8),
        Entry("m01", "single-sweep", 10),
        Entry("m02", "single-sweep", 10),
        Entry("m02", "prefix", 8),        # default slice: 8 requests
        Entry("m01", "offline", 25),      # default slice: 8 requests
        Entry("m02", "nanovllm", 70),     # default slice: 8 requests
        Entry("m02", "offline", 80),      # default slice: 32 requests
    ],
    "m03-m04": [  # estimated: ~360 s
        Entry("m03", "single", 8),
        Entry("m04", "single", 8),
        Entry("m03", "prefix", 8),
        Entry("m04", "prefix", 8),
        Entry("m03", "chunked", 15),
        Entry("m04", "chunked", 15),
        Entry("m03", "offline", 25),
        Entry("m04", "offline", 35),
        Entry("m04", "nanovllm", 100),
        Entry("m03", "nanovllm", 140),
    ],
    # The batch-size sweep of m03 (static batches of 8 ... 64) on the first 64 `offline` requests.
    "m03-batch-sweep": [
        Entry("m03", "offline", est, max_requests=64, overrides=(("max_num_seqs", size),), tag=f"bs{size}")
        for size, est in ((8, 35), (16, 20), (32, 14), (64, 10))
    ],
    # Issues 3 and 4 in one call, most important first (what does not fit the budget is skipped).
    "h200-offline": [
        Entry("hf-static", "offline", 60),
        Entry("m03", "offline", 25),
        Entry("m04", "offline", 35),
        Entry("hf-cb", "offline", 40),
        Entry("m01", "single", 8),
        Entry("m02", "single", 8),
        Entry("m01", "single-sweep", 10),
        Entry("m02", "single-sweep", 10),
        Entry("m02", "offline", 35, max_requests=16),
    ],
    # nanovllm for the baselines on its first 64 requests (one static batch), our engines on the same slice.
    "h200-nanovllm-slice": [
        Entry(name, "nanovllm", est, max_requests=64)
        for name, est in (("hf-static", 110), ("hf-cb", 110), ("m03", 40), ("m04", 40))
    ],
    "long-sweep": [Entry("m01", "long-sweep", 30), Entry("m02", "long-sweep", 20)],
    "skewed": [Entry("m03", "skewed", 45), Entry("m04", "skewed", 30)],
    "baselines": [  # estimated: ~410 s
        Entry("hf-static", "offline", 30),
        Entry("hf-cb", "offline", 40),
        Entry("hf-cb", "nanovllm", 150),
        Entry("hf-static", "nanovllm", 190),
    ],
}

# (label, numerator run, denominator run, metric). Metrics: "metrics.<key>", "sweep.<prompt_len>.<key>",
# "groups.<group>.<key>". Results of this call are used first, then earlier files in <out>/<gpu-slug>/.
RATIOS = [
    ("m01 / m02 ITL mean, single (512 prompt)", "m01_single", "m02_single", "metrics.itl_mean_s"),
    ("m01 / m02 ITL mean, sweep at 64", "m01_single-sweep", "m02_single-sweep", "sweep.64.itl_mean_s"),
    ("m01 / m02 ITL mean, sweep at 2048", "m01_single-sweep", "m02_single-sweep", "sweep.2048.itl_mean_s"),
    ("m02 / m01 out tok/s, offline (slices)", "m02_offline", "m01_offline", "metrics.output_tokens_per_s"),
    ("m03 / m02 out tok/s, offline (m02 on a slice)", "m03_offline", "m02_offline", "metrics.output_tokens_per_s"),
    ("m04 / m03 out tok/s, offline", "m04_offline", "m03_offline", "metrics.output_tokens_per_s"),
    ("m04 / m03 out tok/s, nanovllm", "m04_nanovllm", "m03_nanovllm", "metrics.output_tokens_per_s"),
    ("m03 / m02 out tok/s, nanovllm (m02 on a slice)", "m03_nanovllm", "m02_nanovllm",
     "metrics.output_tokens_per_s"),
    ("m03 useful token fraction, offline", "m03_offline", None, "metrics.useful_token_fraction"),
    ("m04 useful token fraction, offline", "m04_offline", None, "metrics.useful_token_fraction"),
    ("m03 / hf-static out tok/s, offline", "m03_offline", "hf-static_offline", "metrics.output_tokens_per_s"),
    ("m04 / hf-cb out tok/s, offline", "m04_offline", "hf-cb_offline", "metrics.output_tokens_per_s"),
    ("m04 / hf-cb out tok/s, nanovllm", "m04_nanovllm", "hf-cb_nanovllm", "metrics.output_tokens_per_s"),
    ("hf-cb / hf-static out tok/s, nanovllm", "hf-cb_nanovllm", "hf-static_nanovllm", "metrics.output_tokens_per_s"),
    ("m03 / m04 decoder ITL p99, chunked", "m03_chunked", "m04_chunked", "groups.decoder.itl_p99_s"),
    ("m04 / m03 TTFT p50, prefix", "m04_prefix", "m03_prefix", "metrics.ttft_p50_s"),
]


def expand_sets(names: list[str]) -> list[Entry]:
    entries: list[Entry] = []
    for name in names:
        for part in name.split(","):
            if part in SETS:
                entries.extend(SETS[part])
            elif ":" in part:
                milestone, workload = part.split(":", 1)
                if workload not in WORKLOADS:
                    raise SystemExit(f"unknown workload {workload!r} in {part!r}")
                entries.append(Entry(milestone, workload, 60))
            else:
                raise SystemExit(f"unknown set {part!r}: choose from {', '.join(SETS)} or milestone:workload")
    return entries


def available(milestone: str) -> str | None:
    """None if the milestone can run here, else why not."""
    if milestone in BASELINES:
        return None
    try:
        module = resolve_milestone_module(milestone)
        __import__(module)
    except Exception as error:  # not written yet, or broken: skip it, say why
        return f"{type(error).__name__}: {error}"
    return None


def _lookup(result: dict | None, path: str):
    if result is None or result.get("status") != "ok":
        return None
    head, *rest = path.split(".")
    if head == "metrics":
        return (result.get("metrics") or {}).get(rest[0])
    if head == "sweep":
        for row in result.get("sweep") or []:
            if str(row["prompt_len"]) == rest[0]:
                return row.get(rest[1])
        return None
    if head == "groups":
        return ((result.get("groups") or {}).get(rest[0]) or {}).get(rest[1])
    return None


def ratio_rows(results: list[dict], results_dir: Path | None) -> list[list]:
    by_name = {r["name"]: r for r in results if r.get("status") == "ok"}

    def get(name: str) -> tuple[dict | None, str]:
        if name in by_name:
            return by_name[name], "this call"
        if results_dir is not None and (path := results_dir / f"{name}.json").is_file():
            try:
                return json.loads(path.read_text()), "earlier file"
            except (OSError, ValueError):
                pass
        return None, ""

    rows = []
    for label, num_name, den_name, metric in RATIOS:
        num, src_n = get(num_name)
        num_v = _lookup(num, metric)
        if den_name is None:
            if num_v is not None:
                rows.append([label, f"{num_v:.3f}", src_n])
            continue
        den, src_d = get(den_name)
        den_v = _lookup(den, metric)
        if num_v is None or not den_v:
            continue
        sources = src_n if src_n == src_d else f"{src_n} / {src_d}"
        rows.append([label, f"{num_v / den_v:.2f}x", sources])
    return rows


def ratio_table(results: list[dict], results_dir: Path | None) -> str:
    from tabulate import tabulate

    rows = ratio_rows(results, results_dir)
    if not rows:
        return "(no ratio has both of its runs yet)"
    return tabulate(rows, headers=["ratio", "value", "from"], tablefmt="github")


def _write_out(out_env: Path | None, suite: dict, results: list[dict], text: str | None = None) -> None:
    if out_env is None:
        return
    out_env.mkdir(parents=True, exist_ok=True)
    (out_env / "suite.json").write_text(json.dumps({"suite": suite, "results": results}, indent=1) + "\n")
    if text is not None:
        (out_env / "summary.md").write_text(text)


def run_suite(set_names: list[str], budget_s: float, model: str, device: str, dtype: str, out: Path,
              out_env: Path | None, use_tqdm: bool) -> list[dict]:
    entries = expand_sets(set_names)
    began = time.perf_counter()
    suite = {"sets": set_names, "budget_s": budget_s, "model": model, "device": device, "dtype": dtype,
             "started": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
             "entries": [f"{e.milestone}:{e.workload}" + (f"[:{e.max_requests}]" if e.max_requests else "")
                         for e in entries]}
    print(f"suite: {len(entries)} runs, budget {budget_s:.0f} s: {', '.join(suite['entries'])}", flush=True)
    results: list[dict] = []
    slug_dir: Path | None = None
    for i, entry in enumerate(entries, 1):
        elapsed = time.perf_counter() - began
        left = budget_s - elapsed
        tag = f"({i}/{len(entries)}, {elapsed:.0f} s used)"
        why_not = available(entry.milestone)
        skip = None
        if why_not is not None:
            skip = f"milestone not available: {why_not}"
        elif entry.est_s > left:
            skip = f"estimated {entry.est_s:.0f} s does not fit in the {left:.0f} s left of the budget"
        if skip is not None:
            print(f"--- {entry.milestone}:{entry.workload} skipped {tag}: {skip}", flush=True)
            results.append({"name": f"{milestone_key(entry.milestone)}_{entry.workload}", "status": "skipped",
                            "error": skip, "milestone": milestone_key(entry.milestone),
                            "workload": {"name": entry.workload}, "metrics": None})
            _write_out(out_env, suite, results)
            continue
        print(f"--- {entry.milestone}:{entry.workload} {tag}", flush=True)
        result = run_benchmark(entry.milestone, entry.workload, model=model, device=device, dtype=dtype,
                               max_requests=entry.max_requests, use_tqdm=use_tqdm,
                               overrides=dict(entry.overrides) or None, tag=entry.tag,
                               time_limit_s=max(left - 2, 1), catch_errors=True)
        results.append(result)
        if result.get("env"):
            path = save_result(result, out) if result["status"] != "skipped" else None
            slug_dir = result_path(result, out).parent
            m = result.get("metrics") or {}
            print(f"    {result['status']} in {result.get('total_time_s', 0):.1f} s"
                  + (f", {m['output_tokens_per_s']:.1f} out tok/s" if m.get("output_tokens_per_s") else "")
                  + (f", ITL mean {m['itl_mean_s'] * 1e3:.2f} ms" if m.get("itl_mean_s") else "")
                  + (f" -> {path}" if path else ""), flush=True)
        _write_out(out_env, suite, results)
    suite["total_time_s"] = time.perf_counter() - began
    text = report(results, slug_dir)
    print("\n" + text, flush=True)
    _write_out(out_env, suite, results, text)
    return results


def report(results: list[dict], slug_dir: Path | None) -> str:
    ran = [r for r in results if r.get("status") != "skipped"]
    skipped = [r for r in results if r.get("status") == "skipped"]
    parts = ["## Runs", "", summary_table(ran) if ran else "(none ran)"]
    if skipped:
        parts += ["", "## Skipped", ""] + [f"- {r['name']}: {r['error']}" for r in skipped]
    parts += ["", "## Ratios", "", ratio_table(results, slug_dir), ""]
    return "\n".join(parts)


def attach_git(result: dict, local: dict | None = None) -> str:
    """Give a result that came back without a git commit the local one, if the code that ran is the local code
    (same ``source_sha256``). Returns what was done, for the log."""
    env = result.get("env") or {}
    if env.get("git_commit"):
        return f"git {env['git_commit'][:10]} ({env.get('git_source')})"
    local = local if local is not None else {**git_info(), "source_sha256": source_fingerprint()}
    if not env.get("source_sha256") or env["source_sha256"] != local.get("source_sha256") or not local.get("git_commit"):
        return "git commit unknown: the code that ran differs from this checkout (left null)"
    env.update(git_commit=local["git_commit"], git_dirty=local["git_dirty"],
               git_source="unpack: local checkout with the same source_sha256")
    return f"git {local['git_commit'][:10]}{' + uncommitted changes' if local['git_dirty'] else ''} (from unpack)"


def unpack(path: Path, out: Path) -> None:
    data = json.loads(path.read_text())
    results = data["results"] if isinstance(data, dict) and "results" in data else data
    local = {**git_info(), "source_sha256": source_fingerprint()}
    slug_dir = None
    for result in results:
        if result.get("status") == "skipped" or not result.get("env"):
            print(f"{result['name']}: {result.get('status')} ({result.get('error')}), not written")
            continue
        note = attach_git(result, local)
        written = save_result(result, out)
        slug_dir = written.parent
        print(f"{result['name']}: {result['status']} -> {written}  [{note}]")
    print("\n" + report(results, slug_dir))


def list_sets() -> None:
    for name, entries in SETS.items():
        total = sum(e.est_s for e in entries)
        print(f"{name} (~{total:.0f} s on an H200):")
        for e in entries:
            print(f"    {e.milestone}:{e.workload}" + (f" (first {e.max_requests})" if e.max_requests else "")
                  + f"  ~{e.est_s:.0f} s")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gpu_suite", description=__doc__.split("\n")[0])
    parser.add_argument("--set", action="append", default=[],
                        help=f"{', '.join(SETS)}, or milestone:workload; repeat or comma-separate")
    parser.add_argument("--budget-s", type=float, default=float(os.environ.get("SUITE_BUDGET_S", 510)),
                        help="seconds for all runs of this call (default 510, under the 9-minute call limit)")
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--out", default="benchmarks/results", help="results root; files go to <out>/<gpu-slug>/")
    parser.add_argument("--no-progress", action="store_true")
    parser.add_argument("--list", action="store_true", help="print the sets and exit")
    parser.add_argument("--unpack", type=Path, help="split a fetched suite.json into <out>/<gpu-slug>/*.json")
    args = parser.parse_args(argv)
    if args.list:
        list_sets()
        return 0
    if args.unpack:
        unpack(args.unpack, Path(args.out))
        return 0
    if not args.set:
        parser.error("give at least one --set (see --list)")
    out_env = Path(os.environ["OUT"]) if os.environ.get("OUT") else None
    results = run_suite(args.set, args.budget_s, args.model, args.device, args.dtype, Path(args.out), out_env,
                        use_tqdm=not args.no_progress)
    return 0 if all(r["status"] in ("ok", "skipped") for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
