"""Interleaved repeats, ratios that survive a noisy host: build every engine once, warm each up, then alternate
timed runs, A, B, A, B, A, B, and take each ratio pair by pair (docs/benchmarks.md, "Interleaved repeats").

    results = run_comparison([Member("m03"), Member("m04")], get_workload("offline"), repeats=3,
                             model="tiny", device="cpu", dtype="auto")

Each member's result is a ``harness`` result whose figures are its median run's, plus ``repeats`` (every run),
``spread`` (``[min, max]`` of the headline figures) and ``comparison`` (members, ratio metrics, residency).
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from milestones.m01_naive_loop.config import EngineConfig
from milestones.m01_naive_loop.loader import parameter_count

from .harness import (BenchmarkTimeout, build_runner, free_memory, jsonable, measure, new_result, record_failure,
                      result_name, time_limit)
from .runners import (Runner, WorkloadNotSupported, cannot_run, holds_kv_pool, kv_bytes_per_token, kv_tokens_needed,
                      model_config)
from .workloads import Workload

HEADLINE_KEYS = ("output_tokens_per_s", "wall_time_s", "ttft_p50_s", "ttft_p99_s", "itl_mean_s", "itl_p50_s",
                 "itl_p99_s", "itl_max_s", "running_mean", "running_mean_while_waiting")
GROUP_KEYS = ("ttft_p50_s", "itl_p50_s", "itl_p99_s", "itl_max_s")
MEMORY_FRACTION = 0.85  # of free GPU memory that engines sharing the GPU may plan to use
ACTIVATION_MARGIN = 8 * 2**30  # activations of a big prefill step, and the allocator's slack


@dataclass(frozen=True)
class Member:
    """One engine of a comparison: a milestone or registered runner, with config overrides and a name tag."""

    engine: str
    overrides: tuple[tuple[str, object], ...] = ()
    tag: str | None = None

    @property
    def label(self) -> str:
        return self.engine + (f"+{self.tag}" if self.tag else "")


def plan_residency(members: Sequence[Member], workload: Workload, model: str, device: str, dtype: str) -> dict:
    """Whether the members fit on the GPU together; the estimate behind the answer, for the JSON."""
    config = EngineConfig(model=model, device=device, dtype=dtype)
    resolved = config.resolve_device()
    if resolved.type != "cuda":
        return {"residency": "together", "reason": "not on a GPU"}
    torch_dtype = config.resolve_dtype(resolved)
    shape = model_config(model)
    per_token = kv_bytes_per_token(shape, torch_dtype)
    default_pool = (int(workload.kv_budget_gib * 2**30) if workload.kv_budget_gib is not None
                    else kv_tokens_needed(workload) * per_token)
    with_pool = [m for m in members if holds_kv_pool(m.engine)]
    pool = max((dict(m.overrides).get("kv_cache_memory_bytes", default_pool) for m in with_pool), default=0)
    rows = min(workload.max_num_seqs or 1, workload.num_requests)
    per_batch = 0 if len(with_pool) == len(members) else rows * workload.max_seq_len * per_token
    weights = parameter_count(shape) * torch_dtype.itemsize
    planned = len(members) * weights + len(with_pool) * pool + per_batch + ACTIVATION_MARGIN  # pool: the largest
    free = torch.cuda.mem_get_info(resolved)[0]
    together = planned <= MEMORY_FRACTION * free
    return {"residency": "together" if together else "one at a time", "planned_bytes": planned, "free_bytes": free,
            "reason": f"weights + {len(with_pool)} K/V pool(s) of {pool / 2**30:.1f} GiB + largest per-batch K/V "
                      f"{per_batch / 2**30:.1f} GiB + {ACTIVATION_MARGIN / 2**30:.0f} GiB for activations = "
                      f"{planned / 2**30:.1f} GiB against "
                      f"{MEMORY_FRACTION:.0%} of {free / 2**30:.1f} GiB free"}


def _lookup(record: dict, path: str):
    """``metrics.<key>``, ``groups.<group>.<key>`` or ``sweep.<prompt_len>.<key>`` of a result or repeat."""
    head, *rest = path.split(".")
    if head == "sweep":
        return next((row.get(rest[1]) for row in record.get("sweep") or [] if str(row["prompt_len"]) == rest[0]),
                    None)
    value = record.get(head)
    for key in rest:  # a dict that may be null (no groups) at any level
        value = (value or {}).get(key)
    return value


def _spread(repeats: list[dict]) -> dict:
    paths = [f"metrics.{k}" for k in HEADLINE_KEYS]
    paths += [f"groups.{g}.{k}" for g in (repeats[0].get("groups") or {}) for k in GROUP_KEYS]
    spread = {}
    for path in paths:
        values = [_lookup(r, path) for r in repeats]
        if all(isinstance(v, (int, float)) for v in values):
            spread[path] = [min(values), max(values)]
    return spread


def aggregate(result: dict, runs: list[dict]) -> None:
    """Fill ``result`` from its timed runs: the median run's figures, every run's metrics, the spread."""
    if not runs:
        return
    _, median = statistics.median_low((r["metrics"]["wall_time_s"], k) for k, r in enumerate(runs))
    for key in ("metrics", "groups", "sweep", "phases", "per_step", "tokens"):
        result[key] = runs[median][key]
    result["tokens"] = {**runs[median]["tokens"],
                        "identical_across_repeats": len({r["tokens"]["sha256"] for r in runs}) == 1}
    result["repeats"] = [{"repeat": k, "metrics": r["metrics"], "groups": r["groups"], "sweep": r["sweep"],
                          "tokens_sha256": r["tokens"]["sha256"]} for k, r in enumerate(runs)]
    result["spread"] = _spread(runs)
    result["comparison"]["median_repeat"] = median


def pair_ratios(num: dict, den: dict, path: str) -> list[float]:
    """``num / den`` for each repeat index both have (runs k of two members were neighbours in time)."""
    ratios = []
    for a, b in zip(num.get("repeats") or [], den.get("repeats") or []):
        x, y = _lookup(a, path), _lookup(b, path)
        if isinstance(x, (int, float)) and isinstance(y, (int, float)) and y:
            ratios.append(x / y)
    return ratios


def summarize_ratios(ratios: list[float]) -> dict | None:
    if not ratios:
        return None
    return {"median": statistics.median(ratios), "min": min(ratios), "max": max(ratios), "n": len(ratios)}


def comparison_ratios(results: Sequence[dict]) -> list[dict]:
    """Each comparison among ``results`` (id, workload, members, reference, residency) with ``ratios``: every member
    against the reference on every ratio metric, ``{numerator, denominator, metric, median, min, max, n}``."""
    groups: dict[str, dict[str, dict]] = {}
    for r in results:
        if r.get("comparison") and r.get("repeats"):
            groups.setdefault(r["comparison"]["id"], {})[r["comparison"]["label"]] = r
    summaries = []
    for runs in groups.values():
        info = next(iter(runs.values()))["comparison"]
        summary = {k: info[k] for k in ("id", "workload", "members", "reference", "residency")}
        summary["ratios"] = []
        reference = runs.get(info["reference"])
        for label in info["members"][1:] if reference is not None else ():
            for metric in info.get("ratio_metrics") or ["metrics.output_tokens_per_s"]:
                ratio = summarize_ratios(pair_ratios(runs[label], reference, metric)) if label in runs else None
                if ratio is not None:
                    summary["ratios"].append({"numerator": label, "denominator": info["reference"], "metric": metric,
                                              **ratio})
        summaries.append(summary)
    return summaries


def run_comparison(members: Sequence[Member], workload: Workload, repeats: int = 3, *, model: str, device: str,
                   dtype: str, seed: int = 0, ratio_metrics: Sequence[str] = ("metrics.output_tokens_per_s",),
                   use_tqdm: bool = False, time_limit_s: float | None = None,
                   on_progress: Callable[[list[dict]], None] | None = None,
                   log: Callable[[str], None] | None = print) -> list[dict]:
    """Build every member once (once per run if they cannot share the GPU), warm each up, then run ``repeats``
    rounds of one timed run per member; one result per member. ``on_progress`` gets the results after every run
    (the suite rewrites ``suite.json``); ``time_limit_s`` bounds the whole comparison."""
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    comparison = _Comparison(list(members), workload, repeats, dict(model=model, device=device, dtype=dtype,
                                                                   seed=seed), list(ratio_metrics), use_tqdm,
                             on_progress, log or (lambda _msg: None))
    return comparison.run(time_limit_s)


class _Comparison:
    """The state of one comparison while it runs: results, timed runs so far, built runners, live members."""

    def __init__(self, members: list[Member], workload: Workload, repeats: int, engine_kwargs: dict,
                 ratio_metrics: list[str], use_tqdm: bool, on_progress, log) -> None:
        self.members, self.workload, self.repeats = members, workload, repeats
        self.engine_kwargs, self.use_tqdm, self.on_progress, self.log = engine_kwargs, use_tqdm, on_progress, log
        self.labels = [m.label for m in members]
        self.id = f"{workload.name}:{'/'.join(self.labels)}"
        info = {"id": self.id, "members": self.labels, "reference": self.labels[0], "workload": workload.name,
                "repeats_planned": repeats, "ratio_metrics": ratio_metrics,
                "order": "one timed run per member per round, in member order", "residency": None}
        self.results = [new_result(result_name(m.engine, workload, workload.slice is not None, m.tag), m.engine,
                                   workload, engine_kwargs["model"], engine_kwargs["device"], engine_kwargs["dtype"])
                        for m in members]
        for result, label in zip(self.results, self.labels):
            result["comparison"] = {**info, "label": label}
        self.runs: list[list[dict]] = [[] for _ in members]  # the timed runs of each member so far
        self.runners: dict[int, Runner] = {}  # built runners, by member index
        self.active = list(range(len(members)))  # members still in the comparison
        self.rebuilt: set[str] = set()  # members built again before every run (a cache they cannot reset)
        self.together = True

    def run(self, time_limit_s: float | None) -> list[dict]:
        began = time.perf_counter()
        try:
            with time_limit(time_limit_s):
                for i in list(self.active):
                    self._guarded(i, self._check_can_run)
                self._plan_residency()
                if self.together:
                    for i in list(self.active):
                        self._guarded(i, self._build_and_keep)
                for round_ in range(self.repeats):
                    for i in list(self.active):
                        if self._guarded(i, self._timed_run):
                            self._progress(i, round_)
                for i in self.active:
                    self.results[i]["status"] = "ok"
        except BenchmarkTimeout as error:
            for i in self.active:
                record_failure(self.results[i], error)
                self.results[i]["error"] += f" after {len(self.runs[i])} of {self.repeats} timed runs"
        finally:
            for runner in self.runners.values():
                with contextlib.suppress(Exception):
                    runner.close()
            self.runners.clear()
            free_memory()
        total = time.perf_counter() - began
        for i, result in enumerate(self.results):
            aggregate(result, self.runs[i])
            result["total_time_s"] = total
            result["comparison"]["rebuilt_before_each_run"] = self.labels[i] in self.rebuilt
        return [jsonable(r) for r in self.results]

    def _check_can_run(self, i: int) -> None:
        reason = cannot_run(self.members[i].engine, self.workload, self.engine_kwargs["model"])
        if reason is not None:
            raise WorkloadNotSupported(reason)

    def _plan_residency(self) -> None:
        """Keep at least two members that can run the workload, or none, and decide whether they share the GPU."""
        if len(self.members) > 1 and len(self.active) == 1:  # nothing left to compare with: spend no time
            i = self.active.pop()
            self.results[i].update(status="skipped", error="no other engine of the comparison can run "
                                                           f"{self.workload.name}: nothing to compare it with")
        plan = plan_residency([self.members[i] for i in self.active], self.workload, self.engine_kwargs["model"],
                              self.engine_kwargs["device"], self.engine_kwargs["dtype"])
        for result in self.results:
            result["comparison"].update(residency=plan["residency"], residency_reason=plan["reason"])
        self.together = plan["residency"] == "together"
        self.log(f"[{self.id}] {self.repeats} rounds; engines {plan['residency']} ({plan['reason']})")

    def _build(self, i: int) -> Runner:
        free_memory()
        m = self.members[i]
        return build_runner(m.engine, self.workload, self.results[i], **self.engine_kwargs,
                            overrides=dict(m.overrides) or None)

    def _build_and_keep(self, i: int) -> None:
        self.runners[i] = self._build(i)

    def _timed_run(self, i: int) -> None:
        """One timed run of member ``i``, from the same state as its other runs."""
        if not self.together:
            runner = self._build(i)
            try:
                self.runs[i].append(measure(runner, self.workload, self.use_tqdm))
            finally:
                runner.close()
                free_memory()
            return
        if self.runs[i] and not self.runners[i].reset():
            self.runners.pop(i).close()  # what the last run left would help this one: start afresh
            self.runners[i] = self._build(i)
            self.rebuilt.add(self.labels[i])
        self.runs[i].append(measure(self.runners[i], self.workload, self.use_tqdm))

    def _guarded(self, i: int, step: Callable[[int], None]) -> bool:
        """Run ``step(i)`` for member ``i``; if it fails (other than by the clock) or cannot run the workload, the
        member leaves the comparison with its error recorded, and False is returned."""
        try:
            step(i)
            return True
        except BenchmarkTimeout:
            raise
        except Exception as error:  # noqa: BLE001 - this member fails; the others go on
            record_failure(self.results[i], error)
            self.log(f"[{self.results[i]['name']}] {self.results[i]['status']}: {self.results[i]['error']}")
            self.active.remove(i)
            runner = self.runners.pop(i, None)
            if runner is not None:
                with contextlib.suppress(Exception):
                    runner.close()
            return False

    def _progress(self, i: int, round_: int) -> None:
        last = self.runs[i][-1]["metrics"]
        self.log(f"[{self.results[i]['name']}] round {round_ + 1}/{self.repeats}: {last['wall_time_s']:.2f} s"
                 + (f", {last['output_tokens_per_s']:.1f} out tok/s" if last.get("output_tokens_per_s") else ""))
        if self.on_progress is not None:
            for k, result in enumerate(self.results):
                aggregate(result, self.runs[k])
            self.on_progress([jsonable(r) for r in self.results])
