"""m05's config: m04's plus the block size, the step's token budget, and the K/V memory budget."""

from __future__ import annotations

from dataclasses import dataclass, field

from milestones.m01_naive_loop.config import range_of
from milestones.m04_continuous_batching.config import EngineConfig as ContinuousBatchingConfig


@dataclass
class EngineConfig(ContinuousBatchingConfig):
    """Knobs of the paged engine (vLLM's names where vLLM has them).

    * ``block_size``: token slots per K/V block (vLLM's default, 16).
    * ``max_num_batched_tokens``: the most prompt tokens one admission step may feed (a prompt longer than that
      still runs, alone in its step, until m07 splits it). A decode step feeds one token for every running request,
      up to ``max_num_seqs``, whatever the budget; m07 makes the budget cap every step.
    * The K/V memory, at most one of: ``kv_cache_tokens`` (m04's knob: slots, rounded down to whole blocks),
      ``kv_cache_memory_bytes`` (bytes of K/V), ``gpu_memory_utilization`` (vLLM's: the fraction of the GPU's
      memory the whole engine may use; K/V gets what weights and a profiled forward pass leave). None of them:
      m04's default (room for ``max_num_seqs`` full-length requests, at most half the free GPU memory).
    * ``kv_watermark``: fraction of blocks kept free when admitting, so that running requests can grow a
      little before one must be preempted (vLLM's V0 default, 1%).
    """

    block_size: int = 16
    max_num_batched_tokens: int = 8192
    kv_cache_memory_bytes: int | None = None
    gpu_memory_utilization: float | None = field(default=None, metadata=range_of(above=0, at_most=1))
    kv_watermark: float = field(default=0.01, metadata=range_of(at_least=0, below=1))

    def __post_init__(self) -> None:
        super().__post_init__()
        given = [n for n in ("kv_cache_tokens", "kv_cache_memory_bytes", "gpu_memory_utilization")
                 if getattr(self, n) is not None]
        if len(given) > 1:
            raise ValueError(f"size the K/V cache one way only, got {' and '.join(given)}")
