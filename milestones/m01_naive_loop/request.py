"""A request's life: prompt ids in, one token appended per step, a finish reason out. Pure Python, no torch.

Schedulers and block managers in later milestones work on ``Request`` objects, and they must not depend on
torch, so nothing here does. All times are ``time.perf_counter()`` seconds (monotonic, same clock everywhere).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from .sampling_params import SamplingParams


@dataclass
class RequestMetrics:
    """Timestamps from which benchmarks compute TTFT (first token - arrival) and inter-token latency."""

    arrival_time: float
    first_token_time: float | None = None
    token_times: list[float] = field(default_factory=list)  # one per generated token
    finish_time: float | None = None

    @property
    def ttft(self) -> float | None:
        return None if self.first_token_time is None else self.first_token_time - self.arrival_time

    @property
    def inter_token_latencies(self) -> list[float]:
        return [b - a for a, b in zip(self.token_times, self.token_times[1:])]


@dataclass
class RequestOutput:
    """What ``generate`` returns for each request, in the order the prompts were given."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    token_ids: list[int]
    text: str
    finish_reason: str | None  # "stop" (EOS or a stop token), "length" (max_tokens), "abort", None (running)
    metrics: RequestMetrics


class Request:
    """A prompt being decoded. ``append_token`` is the only way tokens are added; it also decides finishing."""

    def __init__(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        eos_token_ids: frozenset[int],
        prompt: str | None = None,
        arrival_time: float | None = None,
    ) -> None:
        self.request_id = request_id
        self.prompt = prompt
        self.prompt_token_ids = list(prompt_token_ids)
        self.params = params
        self.output_token_ids: list[int] = []
        self.finish_reason: str | None = None
        self.metrics = RequestMetrics(arrival_time if arrival_time is not None else time.perf_counter())
        # The tokens that end this request: EOS unless ignored, plus the request's own stop tokens.
        self.stop_token_ids = frozenset(params.stop_token_ids) | (frozenset() if params.ignore_eos else eos_token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def all_token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    @property
    def max_num_tokens(self) -> int:
        """The longest this request can ever get: the prompt plus ``max_tokens``."""
        return len(self.prompt_token_ids) + self.params.max_tokens

    @property
    def is_finished(self) -> bool:
        return self.finish_reason is not None

    def append_token(self, token_id: int, now: float | None = None) -> None:
        now = time.perf_counter() if now is None else now
        self.output_token_ids.append(token_id)
        if self.metrics.first_token_time is None:
            self.metrics.first_token_time = now
        self.metrics.token_times.append(now)
        if token_id in self.stop_token_ids:
            self.finish(now, "stop")
        elif len(self.output_token_ids) >= self.params.max_tokens:
            self.finish(now, "length")

    def finish(self, now: float, reason: str) -> None:
        self.finish_reason = reason
        self.metrics.finish_time = now

    def __repr__(self) -> str:
        return (f"Request({self.request_id!r}, prompt={self.num_prompt_tokens} tokens, "
                f"output={len(self.output_token_ids)}/{self.params.max_tokens}, finish={self.finish_reason})")
