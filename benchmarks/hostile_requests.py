"""While one client sends a hostile request, how long do ``/health`` and a running stream wait?

    python -m benchmarks.hostile_requests                       # tiny preset, CPU: prints the table
    python -m benchmarks.hostile_requests --out local-results   # also writes <out>/cpu/hostile_requests.json

The server is ``python -m milestones.m09_server serve`` in a process of its own (the clients here must not share
its interpreter). For each hostile request, three clients run at once:

* a **stream**: one streamed completion (``ignore_eos``, long enough to outlast the hostile request), each
  chunk's arrival time recorded;
* a **health prober**: ``GET /health`` back to back (10 ms apart), each one's latency recorded;
* the **hostile client**, which sends its request once the other two have run for ``--quiet-s`` seconds.

It reports, over the hostile request's lifetime (send to answer) and over the quiet seconds before it, the
slowest ``/health`` answer and the longest gap between two chunks of the stream. The hostile requests: a 30 MB
body with a ``Content-Length`` (413 before a byte is parsed), the same body chunked (counted as it arrives, 413),
and the longest prompt the body limit lets through (tokenized in a tokenizer thread, then refused for its
length). A diagnostic for m09's page, not a milestone; its figures are CPU timings of a busy machine.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

from .env import environment

REPO = Path(__file__).resolve().parents[1]
MODEL = "tiny"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_server(port: int, max_model_len: int) -> subprocess.Popen:
    command = [sys.executable, "-m", "milestones.m09_server", "serve", "--model", MODEL, "--device", "cpu",
               "--port", str(port), "--max-model-len", str(max_model_len), "--log-level", "warning"]
    server = subprocess.Popen(command, cwd=REPO, stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"the server exited during startup (code {server.returncode})")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return server
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    server.kill()
    raise TimeoutError("the server did not start within 300 s")


def hostile_requests(body_limit: int) -> dict[str, tuple[dict, object]]:
    """name -> (headers, content): what each hostile client sends to /v1/completions."""
    big = b'{"model": "tiny", "prompt": "' + b"a" * (30_000_000 - 40) + b'"}'
    json_headers = {"Content-Type": "application/json"}

    def chunked():
        for start in range(0, len(big), 1 << 16):
            yield big[start:start + (1 << 16)]

    words = "the quick brown fox jumps over a lazy dog "  # real words: BPE's usual ~1 token per 4-5 characters
    prompt = (words * (body_limit // len(words)))[:body_limit - 64]
    longest = json.dumps({"model": MODEL, "prompt": prompt, "max_tokens": 1}).encode()
    return {"30 MB body, Content-Length": (json_headers, big),
            "30 MB body, chunked": (json_headers, chunked()),
            f"{len(prompt):,}-character prompt (under the body limit)": (json_headers, longest)}


class Probes:
    """The stream and the health prober, each in a thread, recording times until ``stop``."""

    def __init__(self, url: str, max_tokens: int) -> None:
        self.url, self.max_tokens = url, max_tokens
        self.chunk_times: list[float] = []
        self.health: list[tuple[float, float]] = []  # (sent, latency)
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self.stream, daemon=True),
                        threading.Thread(target=self.probe_health, daemon=True)]

    def __enter__(self) -> Probes:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout=60)

    def stream(self) -> None:
        body = {"model": MODEL, "prompt": [5, 6, 7, 8], "max_tokens": self.max_tokens, "ignore_eos": True,
                "stream": True}
        with httpx.stream("POST", f"{self.url}/v1/completions", json=body, timeout=120) as response:
            for line in response.iter_lines():
                if line.startswith("data: {"):
                    self.chunk_times.append(time.perf_counter())
                if self.stop.is_set():
                    return

    def probe_health(self) -> None:
        with httpx.Client(timeout=120) as client:
            while not self.stop.is_set():
                sent = time.perf_counter()
                client.get(f"{self.url}/health").raise_for_status()
                self.health.append((sent, time.perf_counter() - sent))
                time.sleep(0.01)

    def summary(self, start: float, end: float) -> dict:
        """The slowest /health answer sent within [start, end], and the longest chunk gap ending in it."""
        latencies = [latency for sent, latency in self.health if start <= sent <= end]
        gaps = [b - a for a, b in zip(self.chunk_times, self.chunk_times[1:]) if start <= b <= end]
        return {"health_probes": len(latencies), "health_max_ms": 1e3 * max(latencies, default=float("nan")),
                "health_p50_ms": 1e3 * statistics.median(latencies) if latencies else float("nan"),
                "stream_chunks": len(gaps), "stream_max_gap_ms": 1e3 * max(gaps, default=float("nan"))}


def measure(url: str, name: str, headers: dict, content, quiet_s: float, max_tokens: int) -> dict:
    with Probes(url, max_tokens) as probes:
        time.sleep(quiet_s)
        sent = time.perf_counter()
        try:
            response = httpx.post(f"{url}/v1/completions", headers=headers, content=content, timeout=300)
            status, message = response.status_code, response.json()["error"]["message"]
        except httpx.HTTPError as error:
            status, message = None, repr(error)
        answered = time.perf_counter()
        time.sleep(0.2)  # a last probe after the answer
    return {"request": name, "status": status, "message": message, "answered_s": answered - sent,
            "during": probes.summary(sent, answered), "quiet_before": probes.summary(sent - quiet_s, sent)}


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.hostile_requests", description=__doc__.split("\n")[0])
    parser.add_argument("--max-model-len", type=int, default=8192, help="the server's (tiny's own: 8192)")
    parser.add_argument("--quiet-s", type=float, default=1.0, help="seconds of probes before each hostile request")
    parser.add_argument("--max-tokens", type=int, default=4000, help="the probing stream's length")
    parser.add_argument("--out", type=Path, default=None, help="write <out>/cpu/hostile_requests.json")
    args = parser.parse_args(argv)

    port = free_port()
    server = start_server(port, args.max_model_len)
    url = f"http://127.0.0.1:{port}"
    try:
        results = [measure(url, name, headers, content, args.quiet_s, args.max_tokens)
                   for name, (headers, content) in hostile_requests(4 * 2**20).items()]
    finally:
        server.terminate()
        server.wait(timeout=60)
    for result in results:
        during, quiet = result["during"], result["quiet_before"]
        print(f"{result['request']}: {result['status']} after {result['answered_s']:.2f} s ({result['message'][:90]})")
        print(f"    /health slowest {during['health_max_ms']:.1f} ms over {during['health_probes']} probes "
              f"(quiet before: {quiet['health_max_ms']:.1f} ms); stream's longest gap "
              f"{during['stream_max_gap_ms']:.1f} ms over {during['stream_chunks']} chunks "
              f"(quiet before: {quiet['stream_max_gap_ms']:.1f} ms)")
    if args.out is not None:
        target = args.out / "cpu" / "hostile_requests.json"
        target.parent.mkdir(parents=True, exist_ok=True)
        record = {"benchmark": "hostile_requests", "model": MODEL, "max_model_len": args.max_model_len,
                  "cpu_count": os.cpu_count(), "env": environment("cpu"), "results": results}
        target.write_text(json.dumps(record, indent=2) + "\n")
        print(f"wrote {target}")
    return results


if __name__ == "__main__":
    main()
