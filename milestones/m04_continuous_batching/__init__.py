"""m04_continuous_batching: a scheduler rebuilds the batch every step; the step API appears.

New here: ``scheduler.py`` and ``kv_allocator.py`` (pure Python, no torch), ``kv_pool.py`` (one K/V pool and
the attention over it) and ``engine.py`` (``add_request`` / ``step`` / ``has_unfinished`` / ``abort``).
"""

from milestones.m01_naive_loop import RequestOutput, SamplingParams

from .config import EngineConfig
from .engine import LLMEngine

__all__ = ["EngineConfig", "LLMEngine", "RequestOutput", "SamplingParams"]
