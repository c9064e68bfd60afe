"""m07's scheduler: a token budget per step, shared by decodes and chunks of prompts. Pure Python, no torch.

Until m06 a step was either a prefill step or a decode step. A long prompt arriving therefore stalled every
running request for the whole of its prefill: a 32k-token prompt is one enormous step during which nobody
else gets a token. Chunked prefill caps every step at ``max_num_batched_tokens`` new tokens and fills it in
this order::

    budget = max_num_batched_tokens
    1. every running request that needs ONE token (decodes, oldest first)     budget -= 1 each
    2. the next chunk of every running request still in its prompt            budget -= chunk
    3. new requests from the waiting queue (FCFS), their first chunk          budget -= chunk

    e.g. budget 512, 16 decoders and a 20,000-token prompt arriving:
        step k:    16 decode tokens + prompt[0:496]
        step k+1:  16 decode tokens + prompt[496:992]       ... the decoders never wait more than one step

A chunk is just "the next ``n`` tokens" of a sequence: the engine's packed batch and the block tables never
cared whether ``n`` was a whole prompt, a slice of one, or one token, and a chunk may end anywhere inside a
block. A prompt longer than the budget is never refused for that: it is admitted with its blocks (m05's
``allocate`` gives it the whole prompt's blocks at once) and computed over as many steps as it takes; it
samples its first token at the step whose chunk reaches its end. Prefix hits (m06) shorten what is left to
compute; a block becomes findable only once the step that fills it is scheduled. Preemption (m05) takes the
most recently admitted request, whatever its phase; no new request is admitted in a step that preempted.
"""

from __future__ import annotations

from milestones.m05_paged_blocks.scheduler import SchedulerOutput
from milestones.m06_prefix_cache.scheduler import Scheduler as PrefixCachingScheduler


class Scheduler(PrefixCachingScheduler):
    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = self.schedule_running_chunks(out, self.max_num_batched_tokens)
        if not out.preempted:
            self.schedule_waiting(out, budget)
        return out

    def schedule_running_chunks(self, out: SchedulerOutput, budget: int) -> int:
        """Steps 1 and 2: decodes first, then prompt chunks; preempt from the newest when blocks run out."""
        candidates = self.schedulable_running()
        unscheduled = dict.fromkeys(candidates)  # an ordered set: admission order, victims from its end
        decodes_first = sorted(candidates, key=lambda seq: seq.num_uncomputed_tokens > 1)  # stable sort
        for seq in decodes_first:
            if budget == 0:
                break
            if seq not in unscheduled:  # preempted to make room for an older one
                continue
            del unscheduled[seq]
            end = seq.num_computed_tokens + min(seq.num_uncomputed_tokens, budget)
            if self.make_room(seq, end, unscheduled, out):
                self.block_manager.append_slots(seq.request_id, end)
                self.add_to_step(out, seq, end - seq.num_computed_tokens)
                budget -= end - seq.num_computed_tokens
        return budget

    def schedulable_running(self) -> list:
        """The running sequences that may take tokens this step (all of them; m12 holds back some)."""
        return self.running

    def schedule_waiting(self, out: SchedulerOutput, budget: int) -> int:
        """Step 3: admit from the head of the queue while seats, blocks and budget remain; each gets a chunk."""
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            if not self.can_admit(seq):
                break  # FCFS: nobody overtakes the head
            self.waiting.popleft()
            self.admit(seq)
            self.running.append(seq)
            out.admitted.append(seq)
            chunk = min(seq.num_uncomputed_tokens, budget)
            self.add_to_step(out, seq, chunk)
            budget -= chunk
        return budget
