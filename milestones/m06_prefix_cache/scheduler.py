"""m06's scheduler: m05's, told about the prefix cache. Pure Python, no torch.

Two changes, both small:

* admission counts only the tokens a request must really compute (its prompt minus the cached prefix) against
  the step's token budget, so many requests that share a long prefix are admitted together;
* whenever a step schedules tokens that fill a block, the block is registered in the prefix cache
  (``cache_full_blocks``), so requests admitted after it (even later in the same step) can share it.
"""

from __future__ import annotations

from milestones.m05_paged_blocks.scheduler import Scheduler as PagedScheduler
from milestones.m05_paged_blocks.scheduler import SchedulerOutput
from milestones.m05_paged_blocks.sequence import Sequence

from .block_manager import PrefixCachingBlockManager


class Scheduler(PagedScheduler):
    block_manager: PrefixCachingBlockManager

    def tokens_to_compute_if_admitted(self, seq: Sequence) -> int:
        return seq.num_tokens - self.block_manager.num_cached_tokens(seq.all_token_ids)

    def admit(self, seq: Sequence) -> None:
        super().admit(seq)  # m05's: the block manager returns the cached prefix as already computed
        if seq.num_preemptions == 0:  # what the user sees: prompt tokens served from the cache at admission
            seq.num_cached_tokens = seq.num_computed_tokens

    def add_to_step(self, out: SchedulerOutput, seq: Sequence, num_new_tokens: int) -> None:
        super().add_to_step(out, seq, num_new_tokens)
        self.cache_blocks_up_to(seq, seq.num_computed_tokens + num_new_tokens)

    def cache_blocks_up_to(self, seq: Sequence, end: int) -> None:
        """Register every full block among ``seq``'s first ``end`` tokens (their K/V is computed by now)."""
        if end // self.block_manager.block_size > self.block_manager.num_registered_blocks(seq.request_id):
            self.block_manager.cache_full_blocks(seq.request_id, seq.all_token_ids, end)
