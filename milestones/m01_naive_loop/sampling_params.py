"""How one request wants its tokens chosen and when it wants to stop (the fields follow vLLM's names)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class SamplingParams:
    """Per-request decoding settings.

    * ``temperature``: 0 (or below 1e-5) means greedy; otherwise logits are divided by it before softmax.
    * ``top_k``: keep only the k most likely tokens (``-1`` or ``0``: keep all).
    * ``top_p``: keep the smallest set of most likely tokens whose probability adds up to at least ``top_p``.
    * ``seed``: a seed of the request's own, so its samples do not depend on what else is in the batch.
    * ``max_tokens``: how many tokens to generate at most.
    * ``ignore_eos``: keep going past the end-of-sequence token (benchmarks use this for fixed lengths).
    * ``stop_token_ids``: extra token ids that end the request (the stop token is kept in the output).
    """

    max_tokens: int = 16
    temperature: float = 0.0
    top_k: int = -1
    top_p: float = 1.0
    seed: int | None = None
    ignore_eos: bool = False
    stop_token_ids: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise ValueError(f"max_tokens must be an integer >= 1, got {self.max_tokens!r}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not isinstance(self.top_k, int) or self.top_k < -1:
            raise ValueError(f"top_k must be -1 (off), 0 (off) or a positive integer, got {self.top_k!r}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.seed is not None and not isinstance(self.seed, int):
            raise ValueError(f"seed must be an integer or None, got {self.seed!r}")
        self.stop_token_ids = list(self.stop_token_ids)

    @property
    def greedy(self) -> bool:
        return self.temperature < 1e-5
