"""m07's config: m06's, where ``max_num_batched_tokens`` now caps every step, prompts included."""

from __future__ import annotations

from dataclasses import dataclass

from milestones.m06_prefix_cache.config import EngineConfig as PrefixCacheConfig

UNLIMITED_TOKENS = 2**31 - 1  # ``max_num_batched_tokens=None``: no cap, every prompt in one piece


@dataclass
class EngineConfig(PrefixCacheConfig):
    """``max_num_batched_tokens``: new tokens per step, decodes and prompt chunks together (default 8,192).
    Smaller budgets bound the time of every step, so running requests never wait long for their next token;
    larger ones prefill in fewer steps. ``None`` means no cap (each prompt runs whole, as in m06).

    The budget must hold one token for every request that may run (``max_num_seqs``), as vLLM requires: the
    scheduler serves decodes first and stops when the budget is spent, so a smaller budget would leave some
    running requests without a token for whole steps.
    """

    max_num_batched_tokens: int | None = 8192

    def __post_init__(self) -> None:
        if self.max_num_batched_tokens is None:
            self.max_num_batched_tokens = UNLIMITED_TOKENS
        super().__post_init__()
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise ValueError(f"max_num_batched_tokens ({self.max_num_batched_tokens}) must be at least max_num_seqs "
                             f"({self.max_num_seqs}): every running request needs one token of each step's budget")
