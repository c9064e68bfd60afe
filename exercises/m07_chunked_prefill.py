"""Build it, m07: the chunked-prefill scheduler, one token budget per step shared by decodes and prompt chunks.

m06's scheduler makes each step either an admission step (whole prompts) or a decode step. Write ``schedule``
so that every step fills one budget of ``self.max_num_batched_tokens`` new tokens, in this order:

1. one token for every running request that is decoding (``seq.num_uncomputed_tokens == 1``), oldest first;
2. the next chunk of every running request still in its prompt: ``min(seq.num_uncomputed_tokens, budget)``;
3. unless this step preempted someone, new requests from the head of ``self.waiting`` (first come, first
   served: stop at the first one that does not fit), while seats (``self.max_num_seqs``) and budget remain;
   each gets a first chunk of what is left of the budget.

Everything else is inherited from m06's (and m05's) ``Scheduler`` and already works:

* ``self.running`` (admission order, newest last), ``self.waiting`` (a deque);
* ``self.make_room(seq, num_tokens, victims, out)``: preempts the newest of ``victims`` (an ordered dict of
  running requests not yet scheduled this step; it pops them) until ``seq``'s table can grow to ``num_tokens``
  tokens; returns False if ``seq`` itself had to be preempted;
* ``self.block_manager.append_slots(seq.request_id, num_tokens)``: grows ``seq``'s table;
* ``self.can_admit(seq)`` / ``self.admit(seq)``: may it get its blocks now (watermark included) / give them
  (this also sets ``seq.num_computed_tokens`` past a cached prefix);
* ``self.add_to_step(out, seq, n)``: puts ``n`` new tokens of ``seq`` into this step (and registers the blocks
  they fill in the prefix cache); ``out.admitted`` and ``out.preempted`` list who joined and who left.

Check your version (docs/m07-chunked-prefill.md, "Build it", has the task and a folded reference answer):

    .venv/bin/python -m pytest tests/exercises -k m07 --solution exercises/m07_chunked_prefill.py
"""

from __future__ import annotations

from milestones.m05_paged_blocks.scheduler import SchedulerOutput
from milestones.m06_prefix_cache.scheduler import Scheduler as PrefixCachingScheduler

EXERCISE = "m07"  # which exercise this file answers: the tests look for it


class Scheduler(PrefixCachingScheduler):
    def schedule(self) -> SchedulerOutput:
        """One step: decodes first, then the running prompts' next chunks, then admissions, all within one
        budget of ``self.max_num_batched_tokens`` new tokens."""
        raise NotImplementedError("exercise m07: write Scheduler.schedule")
