"""While one client sends a hostile request, how long do ``/health`` and a running stream wait? (CPU, m09)

    python -m benchmarks.hostile_requests                       # tiny preset, CPU: prints the summary
    python -m benchmarks.hostile_requests --out local-results   # also writes <out>/cpu/hostile_requests.json

m09's server runs in this process, its event loop watched (``LoopLag``); a stream with a ``/health`` prober and
the hostile client (``HOSTILE``) run in processes of their own. Method and results: docs/m09-server.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import statistics
import threading
import time
from pathlib import Path
from queue import Empty

import httpx
import torch

from milestones.common.http_guards import DEFAULT_MAX_REQUEST_BODY_MB
from milestones.common.latency import percentile
from milestones.m11_engine_core.core import exit_with_parent

MODEL = "tiny"
BODY_LIMIT = int(DEFAULT_MAX_REQUEST_BODY_MB * 2**20)  # serve's default
HOSTILE = {"Content-Length": "30 MB body, Content-Length", "chunked": "30 MB body, chunked",
           "longest prompt": f"a prompt of {BODY_LIMIT - 64:,} characters (just under the body limit)"}


class LoopLag:
    """ASGI wrapper: when the app starts, a task on its event loop records (time, lag) every 2 ms."""

    def __init__(self, app) -> None:
        self.app, self.samples, self.task = app, [], None

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "lifespan" and self.task is None:
            self.task = asyncio.get_running_loop().create_task(self.watch())
        await self.app(scope, receive, send)

    async def watch(self) -> None:
        while True:
            start = time.perf_counter()
            await asyncio.sleep(0.002)
            now = time.perf_counter()
            self.samples.append((now, now - start - 0.002))

    def longest(self, start: float, end: float) -> float:
        return max((lag for at, lag in self.samples if start <= at <= end), default=float("nan"))


def hostile_client(url: str, name: str, ready, go, out) -> None:
    """Build one hostile request, say ``ready``, send it on ``go``; put (sent, answered, status, message) in ``out``."""
    exit_with_parent()  # a benchmark killed outright leaves no client behind
    content = b'{"model": "tiny", "prompt": "' + b"a" * (30_000_000 - 40) + b'"}'
    if name == "chunked":
        body = content  # the generator reads ``body``: ``content`` is the generator itself by then
        content = (body[start:start + (1 << 16)] for start in range(0, len(body), 1 << 16))
    elif name == "longest prompt":
        words = "the quick brown fox jumps over a lazy dog "  # real words: ~1 token per 4-5 characters
        prompt = (words * (BODY_LIMIT // len(words)))[:BODY_LIMIT - 64]
        content = json.dumps({"model": MODEL, "prompt": prompt, "max_tokens": 1}).encode()
    ready.set()
    go.wait()
    sent = time.perf_counter()  # the system's monotonic clock: every process here reads the same one
    try:
        response = httpx.post(f"{url}/v1/completions", content=content, timeout=300,
                              headers={"Content-Type": "application/json"})
        status, message = response.status_code, response.json()["error"]["message"]
    except httpx.HTTPError as error:
        status, message = None, repr(error)
    out.put((sent, time.perf_counter(), status, message))


def probes(url: str, max_tokens: int, ready, stop, out) -> None:
    """The stream (a thread) and the health prober, until ``stop``; put (chunk times, [(sent, latency)]) in ``out``."""
    exit_with_parent()  # a benchmark killed outright leaves no prober behind
    chunk_times, health = [], []

    def stream() -> None:
        body = {"model": MODEL, "prompt": [5, 6, 7, 8], "max_tokens": max_tokens, "ignore_eos": True, "stream": True}
        with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=120) as response:
            for line in response.iter_lines():
                if line.startswith("data: {"):
                    chunk_times.append(time.perf_counter())
                    ready.set()
                if stop.is_set():
                    return

    streamer = threading.Thread(target=stream)
    streamer.start()
    with httpx.Client(timeout=120) as client:
        while not stop.is_set():
            sent = time.perf_counter()
            client.get(f"{url}/health").raise_for_status()
            health.append((sent, time.perf_counter() - sent))
            time.sleep(0.01)
    streamer.join()
    out.put((chunk_times, health))


def _result(queue, worker, timeout_s: float = 300.0):
    """What ``worker`` put in ``queue``; an error at once if it ended without (its traceback is above)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            return queue.get(timeout=1)
        except Empty:
            if not worker.is_alive():
                raise RuntimeError(f"{worker.name} ended without a result (exit code {worker.exitcode})") from None
    raise TimeoutError(f"{worker.name} gave no result within {timeout_s:.0f} s")


def client_round(url: str, name: str, quiet_s: float, max_tokens: int) -> dict:
    """One round: the probes for ``quiet_s`` (from the stream's first token), then the hostile request beside them."""
    context = multiprocessing.get_context("spawn")
    probes_ready, hostile_ready, go, stop = (context.Event() for _ in range(4))
    probes_out, hostile_out = context.Queue(), context.Queue()
    workers = [context.Process(target=probes, args=(url, max_tokens, probes_ready, stop, probes_out)),
               context.Process(target=hostile_client, args=(url, name, hostile_ready, go, hostile_out))]
    for worker in workers:
        worker.start()
    try:
        if not (probes_ready.wait(300) and hostile_ready.wait(300)):
            raise TimeoutError("the client processes did not start within 300 s")
        time.sleep(0.5 + quiet_s)  # the processes' start-up settles first
        go.set()
        sent, answered, status, message = _result(hostile_out, workers[1])
        time.sleep(0.2)  # a last probe after the answer
        stop.set()
        chunk_times, health = _result(probes_out, workers[0])
    finally:
        stop.set()
        go.set()
        for worker in workers:
            worker.join(timeout=60)
            if worker.is_alive():
                worker.kill()
    return {"status": status, "message": message, "sent": sent, "answered": answered, "quiet_s": quiet_s,
            "chunk_times": chunk_times, "health": health}


def summary(rounds: list[dict], lag: LoopLag, quiet: bool) -> dict:
    """Over the rounds, while the hostile request was in flight (or in the quiet seconds before it): ``/health``
    median, p99 and slowest, the stream's longest gap, the loop's longest lag."""
    health, gaps, lags = [], [], []
    for r in rounds:
        start, end = (r["sent"] - r["quiet_s"], r["sent"]) if quiet else (r["sent"], r["answered"])
        health += [latency for sent, latency in r["health"] if start <= sent <= end]
        gaps += [b - a for a, b in zip(r["chunk_times"], r["chunk_times"][1:]) if start <= b <= end]
        lags.append(lag.longest(start, end))
    health = health or [float("nan")]
    return {"health_probes": len(health), "health_p50_ms": 1e3 * statistics.median(health),
            "health_p99_ms": 1e3 * percentile(health, 99), "health_max_ms": 1e3 * max(health), "stream_gaps": len(gaps),
            "stream_max_gap_ms": 1e3 * max(gaps, default=float("nan")), "loop_max_lag_ms": 1e3 * max(lags)}


def line(stats: dict) -> str:
    return (f"/health p50 {stats['health_p50_ms']:.1f} ms, p99 {stats['health_p99_ms']:.1f}, slowest "
            f"{stats['health_max_ms']:.1f} ({stats['health_probes']} probes); stream's longest gap "
            f"{stats['stream_max_gap_ms']:.1f} ms; event loop's longest lag {stats['loop_max_lag_ms']:.1f} ms")


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.hostile_requests", description=__doc__.split("\n")[0])
    parser.add_argument("--max-model-len", type=int, default=8192, help="the server's (tiny's own: 8192)")
    parser.add_argument("--quiet-s", type=float, default=1.0, help="seconds of probes before each hostile request")
    parser.add_argument("--max-tokens", type=int, default=4000, help="the probing stream's length")
    parser.add_argument("--repeats", type=int, default=3, help="rounds per hostile request")
    parser.add_argument("--out", type=Path, default=None, help="write <out>/cpu/hostile_requests.json")
    args = parser.parse_args(argv)

    from milestones.common.server_thread import ServerThread
    from milestones.m09_server import EngineConfig, LLMEngine
    from milestones.m09_server.app import build_app

    from .env import environment, write_json

    torch.set_num_threads(1)  # the tiny model gains nothing from more, and a busy machine's OpenMP stalls add noise
    engine = LLMEngine(EngineConfig(model=MODEL, device="cpu", max_model_len=args.max_model_len))
    app = LoopLag(build_app(engine, served_model_name=MODEL))
    results = []
    with ServerThread(app) as server:
        for name, label in HOSTILE.items():
            rounds = [client_round(server.url, name, args.quiet_s, args.max_tokens) for _ in range(args.repeats)]
            results.append({"request": label, "statuses": [r["status"] for r in rounds],
                            "message": rounds[0]["message"], "answered_s": [r["answered"] - r["sent"] for r in rounds],
                            "during": summary(rounds, app, quiet=False),
                            "quiet_before": summary(rounds, app, quiet=True)})
    for result in results:
        answered = ", ".join(f"{s:.2f}" for s in result["answered_s"])
        print(f"{result['request']}: {result['statuses']} after {answered} s\n    ({result['message'][:110]})")
        print(f"    during: {line(result['during'])}\n    before: {line(result['quiet_before'])}")
    print(f"(load average {', '.join(f'{x:.1f}' for x in os.getloadavg())} on {os.cpu_count()} CPUs)")
    if args.out is not None:
        record = {"benchmark": "hostile_requests", "model": MODEL, "max_model_len": args.max_model_len,
                  "repeats": args.repeats, "cpu_count": os.cpu_count(), "load_average": os.getloadavg(),
                  "env": environment("cpu"), "results": results}
        print(f"wrote {write_json(record, args.out / 'cpu' / 'hostile_requests.json')}")
    return results


if __name__ == "__main__":
    main()
