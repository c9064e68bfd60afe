"""One call on the GPU machine: gate, then measure named sets inside a time budget, and write every result.

    python -m benchmarks.gpu_suite --set m04-m05-memory-bound --set m03-m06-offline --budget-s 560
    python -m benchmarks.gpu_suite --set m04:nanovllm --set m03/m04:skewed   # a single run; a comparison
    python -m benchmarks.gpu_suite --list                      # the sets and their rough H200 times
    python -m benchmarks.gpu_suite --unpack /path/to/suite.json  # back home: split into per-run JSON files

First the float32 gate of every engine the call measures (``gate.py``), then the sets' entries in order
(``suite_sets.py``); what does not fit in what is left of ``--budget-s`` is skipped, what overruns it is stopped.
``$OUT/suite.json`` is rewritten after every run and repeat. docs/benchmarks.md, "One GPU: gpu_suite.sh".
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import sys
import time
from pathlib import Path

from .compare import comparison_ratios, run_comparison
from .env import git_info, source_fingerprint, write_json
from .gate import CorrectnessGate, GateItem, gate_failed
from .harness import DEFAULT_MODEL, result_path, run_benchmark, save_result
from .report import report
from .runners import registered_runners, resolve_milestone_module
from .suite_sets import GATE_ITEM_S, GATE_REFERENCE_S, SETS, Compare, Entry, Gate, Run, as_members
from .workloads import WORKLOADS, milestone_key, workload_for

SAFETY_S = 2  # seconds kept back from each time limit for writing results


def expand_sets(names: list[str]) -> list[Entry]:
    """Set names, ``engine:workload`` (a single run) or ``a/b:workload`` (a comparison), comma-separated."""
    entries: list[Entry] = []
    for name in names:
        for part in name.split(","):
            if part in SETS:
                entries.extend(SETS[part])
            elif ":" in part:
                engines, workload = part.split(":", 1)
                if workload not in WORKLOADS:
                    raise SystemExit(f"unknown workload {workload!r} in {part!r}: choose from {', '.join(WORKLOADS)}")
                if "/" in engines:
                    entries.append(Compare(tuple(engines.split("/")), workload, run_s=60))
                else:
                    entries.append(Run(engines, workload, 60))
            else:
                raise SystemExit(f"unknown set {part!r}: choose from {', '.join(SETS)}, engine:workload "
                                 "or a/b:workload")
    return entries


def available(engine: str) -> str | None:
    """None if the engine can be built here, else why not."""
    if engine in registered_runners():
        return None
    try:
        __import__(resolve_milestone_module(engine))
    except Exception as error:  # not written yet, or broken: skip it, say why
        return f"{type(error).__name__}: {error}"
    return None


# Knobs that make an engine lossy by design (m13's quantization): the gate checks exact tokens, so such an engine
# is gated without them (its unquantized path); its error is measured instead (benchmarks/quant_accuracy.py).
LOSSY_KNOBS = ("quantization", "kv_cache_dtype", "calculate_kv_scales")


def gate_items(entries: list[Entry]) -> list[GateItem]:
    """Every (engine, workload, overrides) the entries measure or name, once. A lossy knob (``LOSSY_KNOBS``) is
    dropped: the engine's unquantized path is what can be gated."""
    items: list[GateItem] = []
    for entry in entries:
        for item in entry.gate_items():
            overrides = tuple((k, v) for k, v in item.overrides if k not in LOSSY_KNOBS)
            item = GateItem(item.engine, item.workload, overrides, item.tag if overrides else None)
            if item not in items:
                items.append(item)
    return items


def skipped(name: str, engine: str, workload: str, reason: str) -> dict:
    return {"name": name, "status": "skipped", "error": reason, "milestone": milestone_key(engine),
            "workload": {"name": workload}, "metrics": None}


class Suite:
    """One call: the budget clock, the records so far, and ``$OUT`` kept up to date."""

    def __init__(self, set_names: list[str], budget_s: float, model: str, device: str, dtype: str, out: Path,
                 out_env: Path | None, use_tqdm: bool, gate: bool = True) -> None:
        self.entries = expand_sets(set_names)
        self.budget_s, self.model, self.device, self.dtype = budget_s, model, device, dtype
        self.out, self.out_env, self.use_tqdm, self.gate = out, out_env, use_tqdm, gate
        self.began = time.perf_counter()
        self.meta = {"sets": set_names, "budget_s": budget_s, "model": model, "device": device, "dtype": dtype,
                     "gate": gate, "started": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
                     "entries": [describe(e) for e in self.entries],
                     "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")}
        self.gate_records: list[dict] = []
        self.results: list[dict] = []

    def left(self) -> float:
        return self.budget_s - (time.perf_counter() - self.began)

    def limit(self) -> float:  # of the next gate check, run or comparison: what is left, less the time to write it
        return max(self.left() - SAFETY_S, 1)

    def write(self, text: str | None = None, pending: list[dict] | None = None) -> None:
        if self.out_env is None:
            return
        data = {"suite": self.meta, "gate": self.gate_records, "results": self.results + (pending or [])}
        write_json(data, self.out_env / "suite.json", indent=1)
        if text is not None:
            (self.out_env / "summary.md").write_text(text)

    def keep(self, result: dict) -> None:
        self.results.append(result)
        if result.get("env") and result["status"] != "skipped":
            path = save_result(result, self.out)
            m = result.get("metrics") or {}
            print(f"    {result['name']}: {result['status']} in {result.get('total_time_s', 0):.1f} s"
                  + (f", {m['output_tokens_per_s']:.1f} out tok/s" if m.get("output_tokens_per_s") else "")
                  + f" -> {path}", flush=True)

    def _too_long(self, est_s: float, what: str = "") -> str | None:
        if est_s > self.left():
            return f"estimated {est_s:.0f} s{what} does not fit in the {self.left():.0f} s left of the budget"
        return None

    def run_gate(self) -> None:
        items = gate_items(self.entries)
        if not items:
            return
        print(f"gate: {len(items)} checks in float32: {', '.join(i.label for i in items)}", flush=True)
        gate = CorrectnessGate(self.model, self.device)
        try:
            for item in items:
                needed = 0 if item.engine in registered_runners() else (
                    GATE_ITEM_S + (0 if gate.has_reference else GATE_REFERENCE_S))
                why_not = available(item.engine) or self._too_long(needed)
                if why_not is not None:
                    self.gate_records.append({"label": item.label, "engine": milestone_key(item.engine),
                                              "workload": item.workload, "status": "skipped", "error": why_not})
                else:
                    self.gate_records.append(gate.check(item, time_limit_s=self.limit()))
                self.write()
        finally:
            gate.close()

    def _run(self, entry: Run, tag: str) -> dict | None:
        why_not = available(entry.milestone)
        skip = f"engine not available: {why_not}" if why_not else self._too_long(entry.est_s)
        if skip is not None:
            return skipped(f"{milestone_key(entry.milestone)}_{entry.workload}", entry.milestone, entry.workload, skip)
        print(f"--- {describe(entry)} {tag}", flush=True)
        self.keep(run_benchmark(entry.milestone, entry.workload, model=self.model, device=self.device,
                                dtype=self.dtype, max_requests=entry.max_requests, use_tqdm=self.use_tqdm,
                                time_limit_s=self.limit(), catch_errors=True))
        return None

    def _compare(self, entry: Compare, tag: str) -> dict | None:
        missing = {m: available(m.engine) for m in entry.members}
        members = tuple(m for m in entry.members if missing[m] is None)
        reasons = [f"{m.label}: {why}" for m, why in missing.items() if why is not None]
        skip = ("fewer than two engines available (" + "; ".join(reasons) + ")" if len(members) < 2
                else self._too_long(entry.est_s(members), f" for {entry.repeats} rounds"))
        if skip is not None:  # one record for the whole comparison: its members may be measured elsewhere
            return skipped(describe(entry), entry.members[0].engine, entry.workload, skip)
        for reason in reasons:
            print(f"    not in this comparison: {reason}", flush=True)
        print(f"--- {describe(entry)} {tag}", flush=True)
        # every member runs the same requests: the smallest default slice among them
        workload = min((workload_for(m.engine, entry.workload) for m in members), key=lambda w: w.num_requests)
        for result in run_comparison(members, workload, entry.repeats, model=self.model,
                                     device=self.device, dtype=self.dtype, ratio_metrics=entry.metrics(),
                                     use_tqdm=self.use_tqdm, time_limit_s=self.limit(),
                                     on_progress=lambda partial: self.write(pending=partial)):
            self.keep(result)
        self.results += [skipped(f"{milestone_key(m.engine)}_{entry.workload}" + (f"+{m.tag}" if m.tag else ""),
                                 m.engine, entry.workload, f"engine not available: {why}")
                         for m, why in missing.items() if why is not None]
        return None

    def run(self) -> int:
        """Gate, run every entry, report; the exit status: 1 if the gate failed or a run did not finish."""
        print(f"suite: {len(self.entries)} entries, budget {self.budget_s:.0f} s: {', '.join(self.meta['entries'])}",
              flush=True)
        if self.gate:
            self.run_gate()
        for i, entry in enumerate(self.entries, 1):
            if isinstance(entry, Gate):  # its checks ran in the gate
                continue
            tag = f"({i}/{len(self.entries)}, {time.perf_counter() - self.began:.0f} s used)"
            record = self._run(entry, tag) if isinstance(entry, Run) else self._compare(entry, tag)
            if record is not None:
                print(f"--- {describe(entry)} skipped {tag}: {record['error']}", flush=True)
                self.results.append(record)
            self.write()
        self.meta["total_time_s"] = time.perf_counter() - self.began
        text = report(self.results, self.gate_records)
        print("\n" + text, flush=True)
        self.write(text)
        failed = gate_failed(self.gate_records) or [r for r in self.results if r["status"] not in ("ok", "skipped")]
        return 1 if failed else 0


def describe(entry: Entry) -> str:
    if isinstance(entry, Run):
        return f"{entry.milestone}:{entry.workload}" + (f"[:{entry.max_requests}]" if entry.max_requests else "")
    if isinstance(entry, Compare):
        return f"{'/'.join(m.label for m in entry.members)}:{entry.workload} x{entry.repeats}"
    return f"gate {'/'.join(m.label for m in as_members(entry.engines))} on {', '.join(entry.workloads)}"


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


def replaced_comparison(result: dict, out: Path) -> str | None:
    """The other comparison of the same commit whose per-run file ``result`` is about to overwrite, if any (a
    two-GPU call can measure m04 on nanovllm beside m03 on one GPU and beside m05 on the other: one file)."""
    path = result_path(result, out)
    if not path.is_file() or not isinstance(result.get("comparison"), dict):
        return None
    try:
        old = json.loads(path.read_text())
    except ValueError:
        return None
    commits = [((r.get("env") or {}).get("git_commit") or "")[:7] for r in (old, result)]
    old_id = (old.get("comparison") or {}).get("id")
    return old_id if commits[0] == commits[1] and old_id and old_id != result["comparison"]["id"] else None


def unpack(path: Path, out: Path) -> None:
    data = json.loads(path.read_text())
    results = data["results"] if isinstance(data, dict) and "results" in data else data
    gate = data.get("gate") or [] if isinstance(data, dict) else []
    local = {**git_info(), "source_sha256": source_fingerprint()}
    slug_dir = None
    for result in results:
        if result.get("status") == "skipped" or not result.get("env"):
            print(f"{result['name']}: {result.get('status')} ({result.get('error')}), not written")
            continue
        note = attach_git(result, local)
        replaced = replaced_comparison(result, out)
        written = save_result(result, out)
        if replaced:
            print(f"warning: {written.name} held {replaced} of the same call; it now holds "
                  f"{result['comparison']['id']}. To keep both, save one under a tag (see AGENTS.md)")
        slug_dir = written.parent
        print(f"{result['name']}: {result['status']} -> {written}  [{note}]")
    suite = data.get("suite") if isinstance(data, dict) else None
    if slug_dir is not None and suite and suite.get("started"):
        stamp = suite["started"].replace(":", "").replace("-", "").split("+")[0]
        # two suite processes of one call (one per GPU) start in the same second: the sets tell them apart
        sets = "+".join(suite.get("sets") or [])
        call = slug_dir / "calls" / (f"{stamp}_{sets}.json" if sets else f"{stamp}.json")
        envs = [r["env"] for r in results if r.get("env")]
        record = {"suite": suite, "git_commit": envs[0].get("git_commit") if envs else None,
                  "gate": gate, "comparisons": comparison_ratios(results)}
        print(f"call record -> {write_json(record, call, indent=1)}")
    print("\n" + report(results, gate))


def list_sets() -> None:
    for name, entries in SETS.items():
        est = [None if isinstance(e, Gate) else e.est_s if isinstance(e, Run) else e.est_s() for e in entries]
        measuring = sum(s for s in est if s is not None)
        checks = len([i for i in gate_items(entries) if i.engine not in registered_runners()])
        gate = GATE_REFERENCE_S + checks * GATE_ITEM_S if checks else 0
        print(f"{name}: ~{measuring + gate:.0f} s on an H200 (measuring ~{measuring:.0f} s, gate of {checks} "
              f"engine:workload pairs ~{gate:.0f} s)")
        for e, seconds in zip(entries, est):
            print(f"    {describe(e)}" + ("" if seconds is None else f"  ~{seconds:.0f} s"))
    print(f"\nthe gate: ~{GATE_ITEM_S} s per engine:workload pair, plus ~{GATE_REFERENCE_S} s once per call "
          "(--no-gate skips it)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gpu_suite", description=__doc__.split("\n")[0])
    parser.add_argument("--set", action="append", default=[],
                        help=f"{', '.join(SETS)}; or engine:workload, or a/b:workload (a comparison); "
                             "repeat or comma-separate")
    parser.add_argument("--budget-s", type=float, default=float(os.environ.get("SUITE_BUDGET_S", 510)),
                        help="seconds for the whole call (default 510, under the 9-minute call limit)")
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--out", default="benchmarks/results", help="results root; files go to <out>/<gpu-slug>/")
    parser.add_argument("--no-gate", action="store_true", help="skip the float32 correctness gate")
    parser.add_argument("--no-progress", action="store_true")
    parser.add_argument("--list", action="store_true", help="print the sets and exit")
    parser.add_argument("--unpack", type=Path, help="split a fetched suite.json into <out>/<gpu-slug>/*.json")
    args = parser.parse_args(argv)
    if args.list:
        list_sets()
        return 0
    if args.unpack:
        if not args.unpack.is_file():
            parser.error(f"--unpack: no such file {args.unpack}")
        unpack(args.unpack, Path(args.out))
        return 0
    if not args.set:
        parser.error("give at least one --set (see --list)")
    out_env = Path(os.environ["OUT"]) if os.environ.get("OUT") else None
    return Suite(args.set, args.budget_s, args.model, args.device, args.dtype, Path(args.out), out_env,
                 use_tqdm=not args.no_progress, gate=not args.no_gate).run()


if __name__ == "__main__":
    sys.exit(main())
