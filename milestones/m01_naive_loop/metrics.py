"""Latency and throughput figures computed from the timestamps every ``RequestOutput`` carries.

* **TTFT** (time to first token): first token time - arrival time.
* **ITL** (inter-token latency): gaps between consecutive tokens of one request.
* **output tokens/s**: generated tokens of all requests / wall time of the whole run.
"""

from __future__ import annotations

import statistics

from .request import RequestOutput


def percentile(values: list[float], q: float) -> float | None:
    """The q-th percentile (0..100) with linear interpolation; None for an empty list."""
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def summarize(outputs: list[RequestOutput], wall_time: float) -> dict[str, float | int | None]:
    ttfts = [o.metrics.ttft for o in outputs if o.metrics.ttft is not None]
    itls = [gap for o in outputs for gap in o.metrics.inter_token_latencies]
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
