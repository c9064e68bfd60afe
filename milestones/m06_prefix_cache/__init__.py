"""m06_prefix_cache: full blocks found again by a chained hash, so shared prompt prefixes are computed once.

New here: ``block_manager.py`` (hash -> block lookups, shared blocks, an LRU pool of freed blocks; no torch),
``scheduler.py`` (budget counts only uncached tokens; full blocks registered as they are scheduled; no torch),
``engine.py`` (``num_cached_tokens`` on every output, hit rate in ``stats``; ``enable_prefix_caching``).
"""

from milestones.m01_naive_loop import SamplingParams

from .config import EngineConfig
from .engine import CachedRequestOutput as RequestOutput
from .engine import LLMEngine

__all__ = ["EngineConfig", "LLMEngine", "RequestOutput", "SamplingParams"]
