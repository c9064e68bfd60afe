"""While one client sends a hostile request, how long do ``/health`` and a running stream wait?

    python -m benchmarks.hostile_requests                       # tiny preset, CPU: prints the summary
    python -m benchmarks.hostile_requests --out local-results   # also writes <out>/cpu/hostile_requests.json

m09's server (``build_app`` in a ``ServerThread``, as the tests run it, with ``serve``'s defaults) runs in this
process. For each round of each hostile request, three clients run at once, in two processes of their own (so
that no client waits for the server's GIL, nor the probes for the hostile client's):

* a **stream**: one streamed completion (``ignore_eos``, long enough to outlast the hostile request), each
  chunk's arrival time recorded;
* a **health prober**: ``GET /health`` every 10 ms, each one's latency recorded;
* the **hostile client**, which sends its request after ``--quiet-s`` seconds of the other two.

Meanwhile the server's own event loop is watched: a task that sleeps 2 ms at a time records how late it wakes
(the loop's lag: how long some callback kept it busy, or the machine kept the process off the CPU). The summary,
over ``--repeats`` rounds: ``/health`` latency (median, 99th percentile, slowest), the stream's longest gap
between chunks and the loop's longest lag, while the hostile request was in flight and in the quiet seconds
before it (on a busy machine the quiet figures are its own noise). The hostile requests: a 30 MB body with a
``Content-Length`` (413 before a byte is parsed), the same body chunked (counted as it arrives, 413), and the
longest prompt the body limit lets through (tokenized in a tokenizer thread, then refused for its length).
A diagnostic for m09's page, not a milestone: CPU timings of whatever machine runs it.
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

import torch

from milestones.common.http_guards import DEFAULT_MAX_REQUEST_BODY_MB

MODEL = "tiny"
BODY_LIMIT = int(DEFAULT_MAX_REQUEST_BODY_MB * 2**20)  # serve's default


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


# --------------------------------------------------------------------------- the clients (processes of their own)


def hostile_client(url: str, name: str, ready, go, out) -> None:
    """Build one hostile request, say ``ready``, send it on ``go``; put (sent, answered, status, message) in ``out``."""
    import httpx

    big = b'{"model": "tiny", "prompt": "' + b"a" * (30_000_000 - 40) + b'"}'
    content = big
    if name == "chunked":
        content = (big[start:start + (1 << 16)] for start in range(0, len(big), 1 << 16))
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
    """The stream and the health prober, until ``stop``; put (chunk times, [(sent, latency)]) in ``out``."""
    import httpx

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

    def probe() -> None:
        with httpx.Client(timeout=120) as client:
            while not stop.is_set():
                sent = time.perf_counter()
                client.get(f"{url}/health").raise_for_status()
                health.append((sent, time.perf_counter() - sent))
                time.sleep(0.01)

    threads = [threading.Thread(target=stream), threading.Thread(target=probe)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    out.put((chunk_times, health))


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
        sent, answered, status, message = hostile_out.get(timeout=300)
        time.sleep(0.2)  # a last probe after the answer
        stop.set()
        chunk_times, health = probes_out.get(timeout=300)
    finally:
        stop.set()
        go.set()
        for worker in workers:
            worker.join(timeout=60)
            if worker.is_alive():
                worker.kill()
    return {"status": status, "message": message, "sent": sent, "answered": answered, "quiet_s": quiet_s,
            "chunk_times": chunk_times, "health": health}


# --------------------------------------------------------------------------- the summary


def window(round_: dict, lag: LoopLag, start: float, end: float) -> dict:
    chunks = round_["chunk_times"]
    return {"health_s": [latency for sent, latency in round_["health"] if start <= sent <= end],
            "stream_gaps_s": [b - a for a, b in zip(chunks, chunks[1:]) if start <= b <= end],
            "loop_lag_s": lag.longest(start, end)}


def summary(windows: list[dict]) -> dict:
    """Over the rounds' windows: /health median, p99 and slowest; the stream's longest gap; the loop's longest lag."""
    health = sorted(h for w in windows for h in w["health_s"]) or [float("nan")]
    gaps = [g for w in windows for g in w["stream_gaps_s"]]
    return {"health_probes": len(health), "health_p50_ms": 1e3 * statistics.median(health),
            "health_p99_ms": 1e3 * health[min(len(health) - 1, int(0.99 * len(health)))],
            "health_max_ms": 1e3 * health[-1], "stream_gaps": len(gaps),
            "stream_max_gap_ms": 1e3 * max(gaps, default=float("nan")),
            "loop_max_lag_ms": 1e3 * max(w["loop_lag_s"] for w in windows)}


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
    names = {"Content-Length": "30 MB body, Content-Length", "chunked": "30 MB body, chunked",
             "longest prompt": f"a prompt of {BODY_LIMIT - 64:,} characters (just under the body limit)"}
    results = []
    with ServerThread(app) as server:
        for name, label in names.items():
            rounds = [client_round(server.url, name, args.quiet_s, args.max_tokens) for _ in range(args.repeats)]
            during = [window(r, app, r["sent"], r["answered"]) for r in rounds]
            quiet = [window(r, app, r["sent"] - r["quiet_s"], r["sent"]) for r in rounds]
            results.append({"request": label, "statuses": [r["status"] for r in rounds],
                            "message": rounds[0]["message"], "answered_s": [r["answered"] - r["sent"] for r in rounds],
                            "during": summary(during), "quiet_before": summary(quiet)})
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
