"""A sequence that may have a token the GPU has sampled but the host has not read yet. Pure Python, no torch.

With overlapped scheduling the host plans step N+1 before it knows step N's tokens. A sequence that samples in
step N therefore carries a **pending** token from the moment step N is launched until its id is read back::

    all_token_ids (known)     [ p0 ... p(P-1) | o0 ... o(k-1) ]
    num_tokens                  known + num_pending        <- what the scheduler counts: positions, blocks, budget
    token_ids_between(a, b)     known ids, then PLACEHOLDER for each pending position (the engine overwrites
                                those rows with step N's sampled ids on the GPU)

Exactly one pending token per launched step that samples it; at most two at a time (step N's, and step N+1's
while step N is being read). ``resolve`` turns the oldest into a real token through m01's ``append_token``, so a
stop token or ``max_tokens`` finishes the sequence exactly as before; a finish discards any later pending token
(it was computed after the end and is never shown).
"""

from __future__ import annotations

from milestones.m05_paged_blocks.sequence import Sequence

PLACEHOLDER = 0  # a valid token id: never read as one, but safe for an embedding lookup if it were


class AsyncSequence(Sequence):
    """``Sequence`` with ``num_pending``: tokens sampled by launched steps whose ids the host has not read yet."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.num_pending = 0

    @property
    def num_known_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def num_tokens(self) -> int:
        return self.num_known_tokens + self.num_pending

    @property
    def has_room_for_another_token(self) -> bool:
        """False once the tokens it has, pending ones included, reach ``max_tokens``: its last step is launched."""
        return len(self.output_token_ids) + self.num_pending < self.params.max_tokens

    def token_ids_between(self, start: int, end: int) -> list[int]:
        known = self.num_known_tokens
        return super().token_ids_between(start, min(end, known)) + [PLACEHOLDER] * (end - max(start, known))

    def resolve(self, token_id: int, now: float) -> None:
        """The oldest pending token is ``token_id``: append it (this may finish the sequence)."""
        self.num_pending -= 1
        self.append_token(token_id, now)

    def finish(self, now: float, reason: str) -> None:
        self.num_pending = 0  # tokens sampled after the end are never shown
        super().finish(now, reason)
