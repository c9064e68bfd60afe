"""Counters an engine keeps while it runs, so benchmarks and demos can show *where* the work went.

Every milestone fills the fields that mean something for it and leaves the rest at zero:

* ``steps``: forward passes of the model.
* ``tokens_computed``: token positions pushed through the model, padding included.
* ``padding_tokens``: positions computed for nothing (left padding, rows of finished requests).
* ``prompt_tokens_computed``: prompt positions computed; m01 recomputes the prompt every step, m02 once.
* ``kv_reserved_peak_bytes`` / ``kv_used_peak_bytes``: the most K/V memory set aside at once, and the most
  actually holding tokens at once. Their gap is what paged K/V (m05) wins back. ``kv_reserved_mean_bytes`` /
  ``kv_used_mean_bytes`` average the same two over every recorded step, which is fairer than two peaks that
  may come from different moments.
* ``running_per_step``: how many requests were in the batch at each step (engines with a scheduler, m04 on), and
  ``waiting_per_step`` how many were still queued after it. Steps with a queue are the ones where memory (or
  ``max_num_seqs``) decided the batch: ``mean_running_while_waiting`` averages the batch over those.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass
class EngineStats:
    steps: int = 0
    tokens_computed: int = 0
    padding_tokens: int = 0
    prompt_tokens_computed: int = 0
    kv_reserved_peak_bytes: int = 0
    kv_used_peak_bytes: int = 0
    kv_reserved_byte_steps: int = 0  # sums over recorded steps, for the means
    kv_used_byte_steps: int = 0
    kv_records: int = 0
    running_per_step: list[int] = field(default_factory=list)
    waiting_per_step: list[int] = field(default_factory=list)

    @property
    def useful_token_fraction(self) -> float | None:
        """Useful tokens / computed tokens (1.0 means no position was computed for nothing)."""
        if self.tokens_computed == 0:
            return None
        return (self.tokens_computed - self.padding_tokens) / self.tokens_computed

    @property
    def kv_reserved_mean_bytes(self) -> float | None:
        return self.kv_reserved_byte_steps / self.kv_records if self.kv_records else None

    @property
    def kv_used_mean_bytes(self) -> float | None:
        return self.kv_used_byte_steps / self.kv_records if self.kv_records else None

    @property
    def mean_running(self) -> float | None:
        """Requests in the batch, averaged over steps (None if the engine does not record it)."""
        return sum(self.running_per_step) / len(self.running_per_step) if self.running_per_step else None

    @property
    def mean_running_while_waiting(self) -> float | None:
        """Requests in the batch, averaged over the steps after which some request was still queued."""
        busy = [r for r, w in zip(self.running_per_step, self.waiting_per_step) if w]
        return sum(busy) / len(busy) if busy else None

    def record_kv(self, reserved_bytes: int, used_bytes: int) -> None:
        self.kv_reserved_peak_bytes = max(self.kv_reserved_peak_bytes, reserved_bytes)
        self.kv_used_peak_bytes = max(self.kv_used_peak_bytes, used_bytes)
        self.kv_reserved_byte_steps += reserved_bytes
        self.kv_used_byte_steps += used_bytes
        self.kv_records += 1

    def as_dict(self) -> dict:
        return {**asdict(self), "useful_token_fraction": self.useful_token_fraction,
                "kv_reserved_mean_bytes": self.kv_reserved_mean_bytes, "kv_used_mean_bytes": self.kv_used_mean_bytes,
                "mean_running": self.mean_running,
                "mean_running_while_waiting": self.mean_running_while_waiting}
