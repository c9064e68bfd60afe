"""m04's config: m03's plus the size of the K/V pool."""

from __future__ import annotations

from dataclasses import dataclass

from milestones.m03_static_batching.config import EngineConfig as StaticBatchingConfig


@dataclass
class EngineConfig(StaticBatchingConfig):
    """``max_num_seqs``: the most requests in flight at once (the running batch is rebuilt every step).

    ``kv_cache_tokens``: capacity of the K/V pool, in tokens. ``None`` sizes it for ``max_num_seqs`` requests of
    ``max_model_len`` tokens, capped at half of the free GPU memory (512 MiB on a CPU).
    """

    kv_cache_tokens: int | None = None
