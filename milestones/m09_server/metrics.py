"""Prometheus metrics: ``GET /metrics`` in the text format every monitoring stack scrapes.

Two kinds, kept apart:

* **Per request**, observed by the HTTP handlers as requests end (``ServerMetrics.record``): a counter of
  requests by how they ended (``status``: ``stop``, ``length``, ``abort`` = client left or server shut
  down, ``error`` = the engine failed, ``rejected`` = a 4xx), prompt and generated tokens, and latency
  histograms measured *at the server*, from the moment the HTTP request arrived: time to first token
  (queueing included), the gaps between tokens, and end to end.
* **Engine state**, read when scraped from the ``EngineState`` snapshot the engine thread publishes after
  every step: running and waiting requests, K/V blocks (free, total, usage), preemptions (m05 on) and
  the prefix cache (m06 on). A series the engine has no counterpart for is left out, not shown as 0.

Each app has its own ``CollectorRegistry``, so several servers (m09 and m10 in one benchmark process, or
tests) never share counters.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from .async_engine import EngineState

PREFIX = "nanoserve"
STATUSES = ("stop", "length", "abort", "error", "rejected")
# Seconds. Fine at the low end (a decode step on a GPU is a few ms), long at the top (queueing under load).
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
                   7.5, 10.0, 20.0, 40.0, 80.0)


class ServerMetrics:
    """The per-request metrics of one server, plus the collector of its engine's state."""

    def __init__(self, engine_state: Callable[[], EngineState]) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(f"{PREFIX}_requests", "Requests by how they ended", ["status"],
                                registry=self.registry)
        for status in STATUSES:
            self.requests.labels(status)  # every status shows from the start, at 0
        self.prompt_tokens = Counter(f"{PREFIX}_prompt_tokens", "Prompt tokens of requests that reached the engine",
                                     registry=self.registry)
        self.generation_tokens = Counter(f"{PREFIX}_generation_tokens", "Tokens generated", registry=self.registry)
        self.ttft = Histogram(f"{PREFIX}_time_to_first_token_seconds",
                              "From HTTP arrival to the first token (queueing included)",
                              buckets=LATENCY_BUCKETS, registry=self.registry)
        self.inter_token = Histogram(f"{PREFIX}_inter_token_latency_seconds", "Gap between consecutive tokens",
                                     buckets=LATENCY_BUCKETS, registry=self.registry)
        self.e2e = Histogram(f"{PREFIX}_e2e_request_latency_seconds", "From HTTP arrival to the last token",
                             buckets=LATENCY_BUCKETS, registry=self.registry)
        self.registry.register(EngineStateCollector(engine_state))

    def record_rejected(self) -> None:
        self.requests.labels("rejected").inc()

    def record(self, status: str, prompt_tokens: int, generation_tokens: int, token_times: list[float],
               arrival: float, end: float) -> None:
        """One request that reached the engine ended; ``token_times`` are when each output arrived."""
        self.requests.labels(status).inc()
        self.prompt_tokens.inc(prompt_tokens)
        self.generation_tokens.inc(generation_tokens)
        if token_times:
            self.ttft.observe(token_times[0] - arrival)
            for earlier, later in zip(token_times, token_times[1:]):
                self.inter_token.observe(later - earlier)
        if status in ("stop", "length"):
            self.e2e.observe(end - arrival)


class EngineStateCollector(Collector):
    """Gauges and counters read from the engine thread's latest ``EngineState`` at scrape time."""

    def __init__(self, engine_state: Callable[[], EngineState]) -> None:
        self.engine_state = engine_state

    def collect(self) -> Iterator:
        state = self.engine_state()
        yield GaugeMetricFamily(f"{PREFIX}_num_requests_running", "Requests in the running batch", value=state.running)
        yield GaugeMetricFamily(f"{PREFIX}_num_requests_waiting", "Requests queued for admission", value=state.waiting)
        if state.kv_blocks_total is not None:
            note = " (an engine without paged blocks counts one K/V slot as a block)"
            yield GaugeMetricFamily(f"{PREFIX}_kv_cache_blocks_total", "K/V cache blocks" + note,
                                    value=state.kv_blocks_total)
            yield GaugeMetricFamily(f"{PREFIX}_kv_cache_blocks_free", "Free K/V cache blocks" + note,
                                    value=state.kv_blocks_free)
            used = 1 - state.kv_blocks_free / state.kv_blocks_total if state.kv_blocks_total else 0.0
            yield GaugeMetricFamily(f"{PREFIX}_kv_cache_usage_ratio", "Fraction of K/V blocks in use", value=used)
        if state.num_preemptions is not None:
            yield CounterMetricFamily(f"{PREFIX}_num_preemptions", "Requests preempted (their K/V dropped)",
                                      value=state.num_preemptions)
        if state.prefix_cache_queried_tokens is not None:
            queried, hits = state.prefix_cache_queried_tokens, state.prefix_cache_hit_tokens or 0
            yield CounterMetricFamily(f"{PREFIX}_prefix_cache_queries", "Prompt tokens looked up in the prefix cache",
                                      value=queried)
            yield CounterMetricFamily(f"{PREFIX}_prefix_cache_hits", "Prompt tokens found in the prefix cache",
                                      value=hits)
            yield GaugeMetricFamily(f"{PREFIX}_prefix_cache_hit_rate", "Prefix cache hits / queries since start",
                                    value=hits / queried if queried else 0.0)
