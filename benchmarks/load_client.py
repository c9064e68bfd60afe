"""A streaming load client: many concurrent ``/v1/completions`` streams, timed at the client (``online.py`` and the
m09 notebook use it). Each request is timed from when it is sent: TTFT (the first chunk with a choice), the gaps
between chunks, and end to end (``[DONE]``). Arrivals are Poisson at ``rate`` (seeded) or a burst.

The client is part of what is measured (a burst's clock runs from the first send to the last ``[DONE]``), so it is
aiohttp, as in vLLM's serving benchmark: httpx's async client cost m11's bursts 9% of their tokens/s (call 23).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import random
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import aiohttp
from tqdm.auto import tqdm

from milestones.common.latency import percentile


@dataclass
class RequestResult:
    """What the client saw of one request. ``error`` is set for an HTTP error, an error event or a dropped stream."""

    max_tokens: int
    send_time: float
    end_time: float = 0.0
    chunk_times: list[float] = field(default_factory=list)  # when each chunk with a choice arrived
    output_tokens: int | None = None  # from the usage chunk
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    error: str | None = None


async def stream_completion(session: aiohttp.ClientSession, url: str, model: str, prompt: str | Sequence[int],
                            max_tokens: int) -> RequestResult:
    """One streamed greedy completion of ``max_tokens`` (``ignore_eos``)."""
    body = {"model": model, "prompt": prompt if isinstance(prompt, str) else list(prompt), "max_tokens": max_tokens,
            "temperature": 0.0, "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
    result = RequestResult(max_tokens, time.perf_counter())
    try:
        async with session.post(f"{url}/v1/completions", json=body) as response:
            if response.status != 200:
                result.error = f"HTTP {response.status}: {(await response.read()).decode(errors='replace')[:300]}"
            else:
                await _read_events(response, result)
    except (aiohttp.ClientError, asyncio.TimeoutError) as error:
        result.error = f"{type(error).__name__}: {error}"
    result.end_time = time.perf_counter()
    if result.error is None and result.output_tokens is None:
        result.error = "the stream ended without its usage chunk"
    return result


async def _read_events(response: aiohttp.ClientResponse, result: RequestResult) -> None:
    async for raw in response.content:  # one line at a time
        line = raw.decode()
        if not line.startswith("data:"):
            continue
        payload = line[5:].strip()
        if payload == "[DONE]":
            return
        now = time.perf_counter()
        if '"finish_reason":null' in payload:  # most chunks are mid-stream tokens: timed without parsing
            result.chunk_times.append(now)
        else:
            event = json.loads(payload)
            if "error" in event:
                result.error = f"error event: {event['error'].get('message')}"
                return
            result.chunk_times += [now] * len(event.get("choices") or [])
            if usage := event.get("usage"):
                result.output_tokens, result.prompt_tokens = usage["completion_tokens"], usage["prompt_tokens"]
                result.cached_tokens = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
    result.error = "the connection closed before [DONE]"


async def run_load(url: str, model: str, requests: Sequence[tuple[str | Sequence[int], int]], rate: float,
                   seed: int = 0, progress: bool = True, desc: str = "requests") -> tuple[list[RequestResult], float]:
    """Send ``requests`` ((prompt, max_tokens) pairs) at ``rate`` per second; returns results in order and wall s.

    ``rate=math.inf`` sends them all at once. Any number of streams at once (no pool limit), with no time limit.
    """
    rng = random.Random(seed)
    connector, timeout = aiohttp.TCPConnector(limit=0), aiohttp.ClientTimeout(total=None)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        with tqdm(total=len(requests), desc=desc, unit="req", disable=not progress) as bar:
            start = time.perf_counter()
            arrival, tasks = start, []
            for i, (prompt, max_tokens) in enumerate(requests):
                if i and math.isfinite(rate):
                    arrival += rng.expovariate(rate)
                    await asyncio.sleep(max(0.0, arrival - time.perf_counter()))
                # --reliability's draw (who hangs up; retired after 0c790fd), kept: a seed keeps its arrival times
                rng.random()
                task = asyncio.create_task(stream_completion(session, url, model, prompt, max_tokens))
                task.add_done_callback(lambda _: bar.update(1))
                tasks.append(task)
            results = list(await asyncio.gather(*tasks))
    return results, time.perf_counter() - start


def summarize(results: Sequence[RequestResult], wall_s: float) -> dict:
    """Counts, throughput and latency percentiles (seconds) over the requests that completed."""
    done = [r for r in results if r.error is None]
    latencies = {"ttft": [r.chunk_times[0] - r.send_time for r in done if r.chunk_times],
                 "itl": [b - a for r in done for a, b in itertools.pairwise(r.chunk_times)],
                 "e2e": [r.end_time - r.send_time for r in done]}
    output_tokens = sum(r.output_tokens or 0 for r in done)
    return {"num_requests": len(results), "completed": len(done),
            "completed_full_length": sum(r.output_tokens == r.max_tokens for r in done),
            "errors": len(results) - len(done),
            "output_tokens": output_tokens, "prompt_tokens": sum(r.prompt_tokens or 0 for r in done),
            "cached_tokens": sum(r.cached_tokens or 0 for r in done), "wall_time_s": wall_s,
            "output_tokens_per_s": output_tokens / wall_s if wall_s > 0 else None,
            "requests_per_s": len(done) / wall_s if wall_s > 0 else None,
            **{f"{name}_p{q}_s": percentile(values, q) for name, values in latencies.items() for q in (50, 99)},
            "itl_mean_s": statistics.fmean(latencies["itl"]) if latencies["itl"] else None,
            "error_samples": sorted({r.error for r in results if r.error is not None})[:5]}
