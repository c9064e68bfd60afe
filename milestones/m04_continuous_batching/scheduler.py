"""The continuous-batching scheduler: the batch is rebuilt every step. Pure Python: no torch here.

Static batching (m03) fixed the batch once. Here a FCFS ``waiting`` queue feeds a ``running`` list, and every
step the scheduler decides again who runs:

1. **Admit** (prefill step): while fewer than ``max_num_seqs`` run and the K/V allocator can reserve the
   head of the queue's maximum length, move it to ``running``. First come, first served: if the head does
   not fit, nobody behind it jumps the queue. If anyone was admitted, this step prefills just them.
2. Otherwise **decode**: one token for every running request.

After the step, finished requests leave and give their K/V back, so the next step can admit new ones.
Prefill steps pause the decoders for a step (m07's chunked prefill smooths that out).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from milestones.m01_naive_loop.request import Request

from .kv_allocator import ContiguousAllocator


@dataclass
class SchedulerOutput:
    prefills: list[Request] = field(default_factory=list)  # admitted this step: run their prompts
    decodes: list[Request] = field(default_factory=list)  # already running: one token each

    @property
    def is_empty(self) -> bool:
        return not self.prefills and not self.decodes


def kv_slots_needed(request: Request) -> int:
    """Slots a request may ever write: every token but the last one sampled, which is never fed back."""
    return request.max_num_tokens - 1


class Scheduler:
    def __init__(self, max_num_seqs: int, allocator: ContiguousAllocator) -> None:
        self.max_num_seqs = max_num_seqs
        self.allocator = allocator
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []

    def add(self, request: Request) -> None:
        self.waiting.append(request)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> SchedulerOutput:
        admitted: list[Request] = []
        while self.waiting and len(self.running) + len(admitted) < self.max_num_seqs:
            head = self.waiting[0]
            if self.allocator.allocate(head.request_id, kv_slots_needed(head)) is None:
                break  # the head does not fit; FCFS means nobody overtakes it
            admitted.append(self.waiting.popleft())
        if admitted:
            self.running.extend(admitted)
            return SchedulerOutput(prefills=admitted)
        return SchedulerOutput(decodes=list(self.running))

    def remove_finished(self) -> list[Request]:
        """Drop finished requests from ``running`` and free their K/V; returns them."""
        finished = [r for r in self.running if r.is_finished]
        for request in finished:
            self.allocator.free(request.request_id)
        self.running = [r for r in self.running if not r.is_finished]
        return finished

    def abort(self, request_id: str) -> Request | None:
        """Remove a request wherever it is, freeing its K/V if it had any. Returns it, or None if unknown."""
        for request in self.waiting:
            if request.request_id == request_id:
                self.waiting.remove(request)
                return request
        for request in self.running:
            if request.request_id == request_id:
                self.running.remove(request)
                self.allocator.free(request_id)
                return request
        return None
