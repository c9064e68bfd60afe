"""m05's scheduler: token budget, blocks allocated as tokens arrive, preemption by recompute. Pure Python.

m04 admitted a request only if its *maximum* length fitted, and then it could never run out. Here a request
gets blocks for the tokens it holds now, and one more block each time it fills one. That packs far more
requests into the same memory, with one new risk: a running request needs a block and none is free. The
answer, as in vLLM, is **preemption by recompute**:

    the most recently admitted running request gives all its blocks back and goes to the FRONT of the waiting
    queue; its tokens so far (prompt + everything it generated) are kept, and when it is admitted again they
    are all prefilled again, after which it continues exactly where it stopped.

Each step, as in m04, is either

1. **admission** (FCFS): while fewer than ``max_num_seqs`` run, the head of the queue fits in the free blocks
   (leaving a small *watermark* of free blocks so that the running requests can grow a little before anyone
   must be preempted), and the step's token budget ``max_num_batched_tokens`` allows, the head is admitted and
   all its tokens are scheduled; a head larger than the budget is admitted alone (m07 will split it instead);
2. or, if nobody was admitted, **decode**: one token for every running request, in admission order, taking a
   new block where a request's last block is full and preempting from the back when none is left.

The result is a ``SchedulerOutput``: a list of ``(sequence, number of new tokens)``, which the engine packs into
one ``[T]`` batch. m07 keeps this output and changes only the policy (decodes and prompt chunks in one step).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from milestones.m04_continuous_batching.scheduler import Scheduler as ContinuousBatchingScheduler

from .block_manager import BlockManager
from .sequence import Sequence


@dataclass
class ScheduledSequence:
    seq: Sequence
    num_new_tokens: int  # feed all_token_ids[num_computed_tokens : num_computed_tokens + num_new_tokens]


@dataclass
class SchedulerOutput:
    scheduled: list[ScheduledSequence] = field(default_factory=list)
    admitted: list[Sequence] = field(default_factory=list)  # joined the running batch this step
    preempted: list[Sequence] = field(default_factory=list)

    @property
    def num_batched_tokens(self) -> int:
        return sum(s.num_new_tokens for s in self.scheduled)

    @property
    def is_empty(self) -> bool:
        return not self.scheduled


class Scheduler(ContinuousBatchingScheduler):
    """m04's queue and running list (and its ``add`` / ``abort`` / ``remove_finished``), with blocks."""

    def __init__(self, max_num_seqs: int, max_num_batched_tokens: int, block_manager: BlockManager,
                 watermark_blocks: int = 0) -> None:
        super().__init__(max_num_seqs, block_manager)  # m04 frees finished/aborted requests via allocator.free
        self.block_manager = block_manager
        self.max_num_batched_tokens = max_num_batched_tokens
        self.watermark_blocks = watermark_blocks
        self.num_preemptions = 0

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        self.schedule_waiting(out, self.max_num_batched_tokens)
        if out.is_empty:
            self.schedule_running(out)
        return out

    # ------------------------------------------------------------------ admission

    def schedule_waiting(self, out: SchedulerOutput, budget: int) -> int:
        """Admit from the head of the queue while seats, blocks and budget allow; returns the budget left."""
        while self.waiting and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            num_new = self.tokens_to_compute_if_admitted(seq)
            if out.scheduled and num_new > budget:
                break  # the head waits for the next step; FCFS: nobody behind it jumps ahead
            if not self.can_admit(seq):
                break
            self.waiting.popleft()
            self.admit(seq)
            self.running.append(seq)
            out.admitted.append(seq)
            self.add_to_step(out, seq, seq.num_uncomputed_tokens)
            budget -= seq.num_uncomputed_tokens
        return budget

    def tokens_to_compute_if_admitted(self, seq: Sequence) -> int:
        return seq.num_tokens

    def can_admit(self, seq: Sequence) -> bool:
        # The watermark keeps a few blocks for the running requests to grow into. With nobody running there is
        # nobody to protect, and a request as large as the whole cache must still get in.
        reserve = self.watermark_blocks if self.running else 0
        return self.block_manager.can_allocate(seq.all_token_ids, reserve)

    def admit(self, seq: Sequence) -> None:
        seq.num_computed_tokens = self.block_manager.allocate(seq.request_id, seq.all_token_ids)

    # ------------------------------------------------------------------ decode

    def schedule_running(self, out: SchedulerOutput) -> None:
        """One token for each running request, oldest first; preempt the newest when blocks run out."""
        unscheduled = dict.fromkeys(self.running)  # an ordered set: admission order, newest last
        for seq in list(self.running):
            if seq not in unscheduled:  # preempted to make room for an older one
                continue
            del unscheduled[seq]
            assert seq.num_uncomputed_tokens == 1, f"{seq} is not decoding"  # invariant of this policy
            if self.make_room(seq, seq.num_tokens, unscheduled, out):
                self.block_manager.append_slots(seq.request_id, seq.num_tokens)
                self.add_to_step(out, seq, 1)

    def make_room(self, seq: Sequence, num_tokens: int, victims: dict[Sequence, None], out: SchedulerOutput) -> bool:
        """Preempt the newest of ``victims`` until ``seq`` can hold ``num_tokens``; False if ``seq`` itself had
        to go (nobody newer was left)."""
        while not self.block_manager.can_append_slots(seq.request_id, num_tokens):
            if not victims:
                self.preempt(seq, out)
                return False
            victim, _ = victims.popitem()  # the most recently admitted
            self.preempt(victim, out)
        return True

    def preempt(self, seq: Sequence, out: SchedulerOutput) -> None:
        self.running.remove(seq)
        self.block_manager.free(seq.request_id)
        seq.reset_for_recompute()
        self.waiting.appendleft(seq)  # victims are taken newest first, so the oldest ends up at the front
        self.num_preemptions += 1
        out.preempted.append(seq)

    # ------------------------------------------------------------------ the step's list

    def add_to_step(self, out: SchedulerOutput, seq: Sequence, num_new_tokens: int) -> None:
        """Put ``num_new_tokens`` of ``seq`` into this step (m06 also registers the blocks they fill)."""
        out.scheduled.append(ScheduledSequence(seq, num_new_tokens))
