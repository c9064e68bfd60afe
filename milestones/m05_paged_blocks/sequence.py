"""``Sequence``: a request plus how far its K/V has been computed. Pure Python, no torch.

From m05 on, a request's K/V lives in blocks that can be taken away (preemption) and handed back, and (from
m07 on) a prompt can be computed over several steps. So every request carries one more number::

    all_token_ids:  [ p0 p1 p2 ... p(P-1) | o0 o1 ... o(k-1) ]
                      <---- num_computed_tokens ----> <- still to compute ->

* ``num_computed_tokens``: how many leading tokens already have their K/V in the cache. A decoding request is
  always exactly one behind (its newest sampled token has not been fed back yet); a waiting or preempted one is
  at 0; a request whose prompt is partly cached (m06) or partly computed (m07) is somewhere in between.
* The next step feeds tokens ``[num_computed_tokens, num_computed_tokens + n)`` for some ``n`` the scheduler
  picks, and samples a new token only if that reaches the end of ``all_token_ids``.
"""

from __future__ import annotations

from milestones.m01_naive_loop.request import Request


class Sequence(Request):
    """A ``Request`` that remembers how many of its tokens have K/V in the cache."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.num_computed_tokens = 0
        self.num_cached_tokens = 0  # prompt tokens found in the prefix cache at admission (m06 sets it)
        self.num_preemptions = 0
        self.max_computed_tokens = 0  # high-water mark: tokens below it computed again are a preemption's cost

    @property
    def num_uncomputed_tokens(self) -> int:
        """Tokens whose K/V is not in the cache yet: what a step must feed to reach a new sample."""
        return self.num_tokens - self.num_computed_tokens

    def token_ids_between(self, start: int, end: int) -> list[int]:
        """``all_token_ids[start:end]`` without building the whole list (a decode step needs one token)."""
        split = len(self.prompt_token_ids)
        if start >= split:
            return self.output_token_ids[start - split:end - split]
        if end <= split:
            return self.prompt_token_ids[start:end]
        return self.prompt_token_ids[start:] + self.output_token_ids[:end - split]

    def reset_for_recompute(self) -> None:
        """Preempted: its blocks are gone, so everything (prompt and the tokens generated so far) is recomputed."""
        self.num_computed_tokens = 0
        self.num_preemptions += 1
