"""m12's scheduler: m07's, planning a step before the previous step's tokens are known. Pure Python, no torch.

Three rules keep that exact (``AsyncSequence`` counts each pending token as a token):

* a sequence whose last token is already launched (pending tokens reach ``max_tokens``) takes no more steps:
  it finishes when that token is read;
* a sequence with a pending token is not admitted (after a preemption): its recompute needs every id;
* a block is registered in the prefix cache only once all its token ids are known (a pending token's id is
  not): the engine registers the rest when it reads them.

A sequence that stops on EOS or a stop token is still planned into the next step (the host cannot know yet);
that step's slot for it is wasted and its token discarded.
"""

from __future__ import annotations

from milestones.m07_chunked_prefill.scheduler import Scheduler as ChunkedPrefillScheduler

from .sequence import AsyncSequence


class Scheduler(ChunkedPrefillScheduler):
    def schedulable_running(self) -> list[AsyncSequence]:
        return [seq for seq in self.running if seq.has_room_for_another_token]

    def can_admit(self, seq: AsyncSequence) -> bool:
        return seq.num_pending == 0 and super().can_admit(seq)

    def cache_blocks_up_to(self, seq: AsyncSequence, end: int) -> None:
        super().cache_blocks_up_to(seq, min(end, seq.num_known_tokens))
