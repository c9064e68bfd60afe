"""Latency and throughput figures computed from the timestamps every ``RequestOutput`` carries.

* **TTFT** (time to first token): first token time - arrival time (queueing included).
* **ITL** (inter-token latency): gaps between consecutive tokens of one request.
* **E2E** (end to end): finish time - arrival time.
* **output tokens/s**: generated tokens of all requests / wall time of the whole run.

Outputs are read by their fields (``token_ids``, ``prompt_token_ids``, ``metrics``), whichever milestone made them.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0..100) with linear interpolation between the closest ranks; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def request_latencies(outputs: Sequence[Any]) -> dict[str, list[float]]:
    """Seconds, pooled over ``outputs``: ``{"TTFT": [...], "ITL": [...], "E2E": [...]}``."""
    metrics = [o.metrics for o in outputs]
    return {"TTFT": [m.ttft for m in metrics if m.ttft is not None],
            "ITL": [gap for m in metrics for gap in m.inter_token_latencies],
            "E2E": [m.finish_time - m.arrival_time for m in metrics if m.finish_time is not None]}


def percentile_columns(latencies: dict[str, list[float]], quantiles: Sequence[int] = (50, 99)) -> dict:
    """Table columns in milliseconds: ``{"TTFT p50 (ms)": ..., "TTFT p99 (ms)": ..., "ITL p50 (ms)": ...}``."""
    columns = {}
    for name, values in latencies.items():
        for q in quantiles:
            value = percentile(values, q)
            columns[f"{name} p{q} (ms)"] = None if value is None else value * 1000
    return columns


def summarize(outputs: Sequence[Any], wall_time: float) -> dict[str, float | int | None]:
    """Counts, throughput and latency percentiles (seconds) of one run's outputs."""
    latencies = request_latencies(outputs)
    ttfts, itls = latencies["TTFT"], latencies["ITL"]
    output_tokens = sum(len(o.token_ids) for o in outputs)
    return {
        "num_requests": len(outputs),
        "prompt_tokens": sum(len(o.prompt_token_ids) for o in outputs),
        "output_tokens": output_tokens,
        "wall_time_s": wall_time,
        "output_tokens_per_s": output_tokens / wall_time if wall_time > 0 else None,
        "ttft_p50_s": percentile(ttfts, 50),
        "ttft_p99_s": percentile(ttfts, 99),
        "itl_mean_s": statistics.fmean(itls) if itls else None,
        "itl_p50_s": percentile(itls, 50),
        "itl_p99_s": percentile(itls, 99),
        "itl_max_s": max(itls) if itls else None,
    }
