"""m06's engine: m05's, with the prefix-caching block manager and scheduler swapped in.

Nothing in the forward pass changes: a request admitted with a cached prefix simply starts with
``num_computed_tokens`` > 0, so its step feeds only the tokens after the prefix, and the attention metadata
(context length, block table) already points its queries at the shared blocks. What is new is bookkeeping:
``num_cached_tokens`` on every output, and the cache's hit rate in ``stats``.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from milestones.m01_naive_loop.request import Request, RequestOutput
from milestones.m05_paged_blocks.engine import LLMEngine as PagedEngine
from milestones.m05_paged_blocks.scheduler import SchedulerOutput
from milestones.m05_paged_blocks.stats import PagedEngineStats

from .block_manager import PrefixCachingBlockManager
from .config import EngineConfig
from .scheduler import Scheduler


@dataclass
class CachedRequestOutput(RequestOutput):
    """m01's output plus ``num_cached_tokens``: prompt tokens whose K/V came from the prefix cache."""

    num_cached_tokens: int = 0


@dataclass
class PrefixCacheStats(PagedEngineStats):
    """* ``prefix_cache_queried_tokens``: tokens looked up at admission; ``prefix_cache_hit_tokens``: found."""

    prefix_cache_queried_tokens: int = 0
    prefix_cache_hit_tokens: int = 0

    @property
    def prefix_cache_hit_rate(self) -> float | None:
        queried = self.prefix_cache_queried_tokens
        return self.prefix_cache_hit_tokens / queried if queried else None

    def as_dict(self) -> dict:
        return {**super().as_dict(), "prefix_cache_hit_rate": self.prefix_cache_hit_rate}


class LLMEngine(PagedEngine):
    milestone = "m06_prefix_cache"
    scheduler_class = Scheduler  # m07 swaps in its chunking scheduler
    config: EngineConfig
    stats: PrefixCacheStats

    def __init__(self, config: EngineConfig | None = None) -> None:
        super().__init__(config if config is not None else EngineConfig())

    def make_block_manager(self) -> PrefixCachingBlockManager:
        return PrefixCachingBlockManager(self.kv_pool.num_blocks, self.config.block_size,
                                         enable_caching=self.config.enable_prefix_caching)

    def make_scheduler(self) -> Scheduler:
        paged = super().make_scheduler()  # m05's, with the block manager above; keep its settings
        return self.scheduler_class(paged.max_num_seqs, paged.max_num_batched_tokens, self.block_manager,
                                    paged.watermark_blocks)

    def new_stats(self) -> PrefixCacheStats:
        return PrefixCacheStats()

    def record_step(self, out: SchedulerOutput) -> None:
        super().record_step(out)
        for seq in out.admitted:
            if seq.num_preemptions == 0:  # first admission: the prompt, as the user sent it
                self.stats.prefix_cache_queried_tokens += seq.num_prompt_tokens
                self.stats.prefix_cache_hit_tokens += seq.num_cached_tokens

    def kv_slots_holding_tokens(self) -> int:
        # A block in n tables is computed tokens of each of its n requests, but holds them in one set of slots.
        manager = self.block_manager
        return super().kv_slots_holding_tokens() - manager.num_shared_references * manager.block_size

    def reset_prefix_cache(self) -> bool:
        """Forget every cached prefix, as vLLM's ``reset_prefix_cache``: a measurement that repeats a workload
        starts each run cold. Only on an idle engine; returns whether it was done."""
        return self.block_manager.reset_cache()

    def make_output(self, request: Request) -> CachedRequestOutput:
        base = super().make_output(request)
        return CachedRequestOutput(**{f.name: getattr(base, f.name) for f in fields(base)},
                                   num_cached_tokens=getattr(request, "num_cached_tokens", 0))
