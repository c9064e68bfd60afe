"""m05_paged_blocks: K/V in fixed-size blocks handed out as tokens arrive; packed batches; preemption.

New here: ``block_manager.py`` (free list, reference counts, block tables; no torch), ``sequence.py`` (a request
that knows how much of it is computed), ``scheduler.py`` (token budget, blocks on demand, preemption by
recompute; no torch), ``paged_attention.py`` (the paged cache, per-step attention metadata, and attention that
reads K/V through the block tables in plain torch) and ``engine.py`` (packed ``[T]`` batches).
"""

from milestones.m01_naive_loop import RequestOutput, SamplingParams

from .config import EngineConfig
from .engine import LLMEngine

__all__ = ["EngineConfig", "LLMEngine", "RequestOutput", "SamplingParams"]
