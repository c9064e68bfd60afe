"""m05's counters: m01's, plus what paging and preemption add."""

from __future__ import annotations

from dataclasses import dataclass, field

from milestones.common.engine_stats import EngineStats


@dataclass
class PagedEngineStats(EngineStats):
    """* ``num_blocks`` / ``block_size``: the K/V cache's size (blocks of slots).
    * ``blocks_used_peak``: the most blocks held at once; ``blocks_used_per_step`` the count after every step.
    * ``num_preemptions``: requests that gave their blocks back to be recomputed later.
    * ``recomputed_tokens``: tokens computed again after a preemption (prompt and generated ones).
    """

    num_blocks: int = 0
    block_size: int = 0
    blocks_used_peak: int = 0
    blocks_used_per_step: list[int] = field(default_factory=list)
    num_preemptions: int = 0
    recomputed_tokens: int = 0

    def record_blocks(self, used: int, total: int, block_size: int) -> None:
        self.blocks_used_peak = max(self.blocks_used_peak, used)
        self.blocks_used_per_step.append(used)
        self.num_blocks, self.block_size = total, block_size
