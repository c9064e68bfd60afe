"""Counters an engine keeps while it runs, so benchmarks and demos can show *where* the work went.

Every milestone fills the fields that mean something for it and leaves the rest at zero:

* ``steps``: forward passes of the model.
* ``tokens_computed``: token positions pushed through the model, padding included.
* ``padding_tokens``: positions computed for nothing (left padding, rows of finished requests).
* ``prompt_tokens_computed``: prompt positions computed; m01 recomputes the prompt every step, m02 once.
* ``kv_reserved_peak_bytes`` / ``kv_used_peak_bytes``: the most K/V memory set aside at once, and the most
  actually holding tokens at once. Their gap is what paged K/V (m05) wins back.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass
class EngineStats:
    steps: int = 0
    tokens_computed: int = 0
    padding_tokens: int = 0
    prompt_tokens_computed: int = 0
    kv_reserved_peak_bytes: int = 0
    kv_used_peak_bytes: int = 0

    @property
    def useful_token_fraction(self) -> float | None:
        """Useful tokens / computed tokens (1.0 means no position was computed for nothing)."""
        if self.tokens_computed == 0:
            return None
        return (self.tokens_computed - self.padding_tokens) / self.tokens_computed

    def record_kv(self, reserved_bytes: int, used_bytes: int) -> None:
        self.kv_reserved_peak_bytes = max(self.kv_reserved_peak_bytes, reserved_bytes)
        self.kv_used_peak_bytes = max(self.kv_used_peak_bytes, used_bytes)

    def as_dict(self) -> dict:
        return {**asdict(self), "useful_token_fraction": self.useful_token_fraction}
