"""m02_kv_cache: prefill once, then decode one token per step against a contiguous per-request K/V cache.

New here: ``kv_cache.py`` (the cache and the attention that uses it) and ``engine.py`` (prefill + decode).
"""

from milestones.m01_naive_loop import EngineConfig, RequestOutput, SamplingParams

from .engine import LLMEngine

__all__ = ["EngineConfig", "LLMEngine", "RequestOutput", "SamplingParams"]
