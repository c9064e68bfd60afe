"""m07_chunked_prefill: long prompts are split across steps, sharing each step with the running decodes.

New here: ``scheduler.py`` (one token budget per step: decodes first, then prompt chunks, then new requests;
no torch) and ``config.py`` (``max_num_batched_tokens`` now caps prompts too). The engine only swaps the
scheduler: since m05 a step is any packed mix of sequences and token counts.
"""

from milestones.m01_naive_loop import SamplingParams
from milestones.m06_prefix_cache import RequestOutput

from .config import EngineConfig
from .engine import LLMEngine

__all__ = ["EngineConfig", "LLMEngine", "RequestOutput", "SamplingParams"]
