"""m07's engine: m06's, with the chunking scheduler swapped in.

Nothing else changes. Since m05 the engine has fed whatever ``(sequence, new tokens)`` the scheduler chose as
one packed ``[T]`` batch, written the new K/V through the slot mapping, and sampled only for sequences whose
step reaches their newest token. So a step that holds 16 decode tokens and a 496-token slice of a prompt is
just another packed batch; the slice's sequence does not sample, and its next chunk continues from
``num_computed_tokens`` in the next step.
"""

from __future__ import annotations

from milestones.m06_prefix_cache.engine import LLMEngine as PrefixCacheEngine

from .config import EngineConfig
from .scheduler import Scheduler


class LLMEngine(PrefixCacheEngine):
    milestone = "m07_chunked_prefill"
    scheduler_class = Scheduler
    config: EngineConfig

    def __init__(self, config: EngineConfig | None = None) -> None:
        super().__init__(config if config is not None else EngineConfig())
