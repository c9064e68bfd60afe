"""m03's config: m01's plus the batch size."""

from __future__ import annotations

from dataclasses import dataclass

from milestones.m01_naive_loop.config import EngineConfig as BaseEngineConfig


@dataclass
class EngineConfig(BaseEngineConfig):
    """``max_num_seqs``: how many requests run together (m03: the size of each static batch)."""

    max_num_seqs: int = 64
