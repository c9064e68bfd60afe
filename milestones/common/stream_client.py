"""Streaming clients for a demo: concurrent completions through the official ``openai`` client, timed as they arrive.

What m09's demo needs from a client, as your own code would do it (``benchmarks/load_client.py`` is the
benchmark's heavier tool: hang-ups, error counts, hundreds of streams). Each stream records when it was sent,
when each chunk with text arrived, when it ended, its text and the token count of the usage chunk.
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from dataclasses import dataclass, field

from .latency import percentile_columns


@dataclass
class Stream:
    sent: float
    chunk_times: list[float] = field(default_factory=list)
    done: float = 0.0
    text: str = ""
    tokens: int = 0


async def stream_completion(client, model: str, prompt: list[int] | str, max_tokens: int) -> Stream:
    """One greedy streamed completion of exactly ``max_tokens`` tokens (vLLM's ``ignore_eos``)."""
    result = Stream(time.perf_counter())
    chunks = await client.completions.create(model=model, prompt=prompt, max_tokens=max_tokens, stream=True,
                                             temperature=0, stream_options={"include_usage": True},
                                             extra_body={"ignore_eos": True})
    async for chunk in chunks:
        for choice in chunk.choices:
            result.chunk_times.append(time.perf_counter())
            result.text += choice.text
        if chunk.usage is not None:  # the last chunk: the server's count of the tokens
            result.tokens = chunk.usage.completion_tokens
    result.done = time.perf_counter()
    return result


async def stream_all(url: str, model: str, prompts: list, max_tokens: int, rate: float = math.inf,
                     seed: int = 0, api_key: str = "none") -> tuple[list[Stream], float]:
    """Every prompt as its own stream, all at once or with Poisson arrivals at ``rate`` per second; returns the
    streams in prompt order and the wall time from the first send to the last token. ``api_key``: the server's
    ``--api-key`` (the client sends ``Authorization: Bearer <api_key>``; a server without one ignores it)."""
    import openai

    rng = random.Random(seed)
    async with openai.AsyncOpenAI(base_url=f"{url}/v1", api_key=api_key, max_retries=0) as client:
        start, tasks = time.perf_counter(), []
        for prompt in prompts:
            tasks.append(asyncio.create_task(stream_completion(client, model, prompt, max_tokens)))
            if math.isfinite(rate):
                await asyncio.sleep(rng.expovariate(rate))
        streams = list(await asyncio.gather(*tasks))
    return streams, time.perf_counter() - start


def table_row(label: str, streams: list[Stream], wall_s: float) -> dict:
    """A demo table's row: requests, output tokens, wall s, output tok/s, and TTFT, ITL and E2E percentiles as
    ``latency.percentile_columns`` names them, timed at the client."""
    tokens = sum(s.tokens for s in streams)
    latencies = {"TTFT": [s.chunk_times[0] - s.sent for s in streams if s.chunk_times],
                 "ITL": [b - a for s in streams for a, b in zip(s.chunk_times, s.chunk_times[1:])],
                 "E2E": [s.done - s.sent for s in streams]}
    return {"label": label, "requests": len(streams), "output tokens": tokens, "wall s": wall_s,
            "output tok/s": tokens / wall_s, **percentile_columns(latencies)}
