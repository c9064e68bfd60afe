"""How one request wants its tokens chosen and when it wants to stop (the fields follow vLLM's names).

Every field is checked when a ``SamplingParams`` is built, so a bad value fails at the caller's line, before
any work, with a ``ValueError`` naming the field and the value. Python makes a few bad values look good:
``True`` is an ``int`` (so ``max_tokens=True`` would mean 1), and ``nan < 0`` is ``False`` (so a NaN
temperature would slip past a plain range check); both are refused explicitly here.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field

SEED_LIMIT = 2**64  # torch.Generator.manual_seed takes seeds in [0, 2**64)


def _integer(name: str, value: object) -> int:
    """``value`` as an ``int``; numpy integers are fine, bools and floats are not."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{name} must be an integer, got {value!r} ({type(value).__name__})")
    return int(value)


def _finite_real(name: str, value: object) -> float:
    """``value`` as a finite ``float``; bools, NaN and infinities are refused."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name} must be a number, got {value!r} ({type(value).__name__})")
    if not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    return float(value)


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
        self.max_tokens = _integer("max_tokens", self.max_tokens)
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be an integer >= 1, got {self.max_tokens!r}")
        self.temperature = _finite_real("temperature", self.temperature)
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        self.top_k = _integer("top_k", self.top_k)
        if self.top_k < -1:
            raise ValueError(f"top_k must be -1 (off), 0 (off) or a positive integer, got {self.top_k!r}")
        self.top_p = _finite_real("top_p", self.top_p)
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.seed is not None:
            self.seed = _integer("seed", self.seed)
            if not 0 <= self.seed < SEED_LIMIT:
                raise ValueError(f"seed must be in [0, 2**64) or None, got {self.seed!r}")
        if not isinstance(self.ignore_eos, bool):
            raise ValueError(f"ignore_eos must be True or False, got {self.ignore_eos!r}")
        self.stop_token_ids = self._checked_stop_token_ids(self.stop_token_ids)

    @staticmethod
    def _checked_stop_token_ids(value: object) -> list[int]:
        if not isinstance(value, (list, tuple, set, frozenset)):
            raise ValueError(f"stop_token_ids must be a list of token ids, got {value!r} ({type(value).__name__})")
        ids = [_integer(f"stop_token_ids[{i}]", t) for i, t in enumerate(value)]
        if any(t < 0 for t in ids):
            raise ValueError(f"stop_token_ids must be token ids >= 0, got {list(value)!r}")
        return ids

    @property
    def greedy(self) -> bool:
        return self.temperature < 1e-5
