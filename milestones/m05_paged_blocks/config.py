"""m05's config: m04's plus the block size, the step's token budget, and the K/V memory budget."""

from __future__ import annotations

import math
from dataclasses import dataclass

from milestones.m04_continuous_batching.config import EngineConfig as ContinuousBatchingConfig


@dataclass
class EngineConfig(ContinuousBatchingConfig):
    """Knobs of the paged engine (vLLM's names where vLLM has them).

    * ``block_size``: token slots per K/V block (vLLM's default, 16).
    * ``max_num_batched_tokens``: the most prompt tokens one admission step may feed (a prompt longer than that
      still runs, alone in its step, until m07 splits it). A decode step feeds one token for every running request,
      up to ``max_num_seqs``, whatever the budget; m07 makes the budget cap every step.
    * The K/V memory, at most one of: ``kv_cache_tokens`` (m04's knob: slots, rounded down to whole blocks),
      ``kv_cache_memory_gib`` (GiB of K/V), ``gpu_memory_utilization`` (vLLM's: the fraction of the GPU's
      memory the whole engine may use; K/V gets what weights and a profiled forward pass leave). None of them:
      m04's default (room for ``max_num_seqs`` full-length requests, at most half the free GPU memory).
    * ``kv_watermark``: fraction of blocks kept free when admitting, so that running requests can grow a
      little before one must be preempted (vLLM's V0 default, 1%).
    """

    block_size: int = 16
    max_num_batched_tokens: int = 8192
    kv_cache_memory_gib: float | None = None
    gpu_memory_utilization: float | None = None
    kv_watermark: float = 0.01

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("block_size", "max_num_batched_tokens"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        given = [n for n in ("kv_cache_tokens", "kv_cache_memory_gib", "gpu_memory_utilization")
                 if getattr(self, n) is not None]
        if len(given) > 1:
            raise ValueError(f"size the K/V cache one way only, got {' and '.join(given)}")
        memory = self.kv_cache_memory_gib
        if memory is not None and (isinstance(memory, bool) or not isinstance(memory, (int, float))
                                   or not math.isfinite(memory) or memory <= 0):
            raise ValueError(f"kv_cache_memory_gib must be a positive number of GiB, got {memory!r}")
        fraction = self.gpu_memory_utilization
        if fraction is not None and (isinstance(fraction, bool) or not isinstance(fraction, (int, float))
                                     or not 0 < fraction <= 1):
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {fraction!r}")
        if isinstance(self.kv_watermark, bool) or not isinstance(self.kv_watermark, (int, float)) \
                or not 0 <= self.kv_watermark < 1:
            raise ValueError(f"kv_watermark must be in [0, 1), got {self.kv_watermark!r}")
