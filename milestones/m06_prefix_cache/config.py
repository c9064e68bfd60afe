"""m06's config: m05's plus the switch for the prefix cache."""

from __future__ import annotations

from dataclasses import dataclass

from milestones.m05_paged_blocks.config import EngineConfig as PagedConfig


@dataclass
class EngineConfig(PagedConfig):
    """``enable_prefix_caching``: share full blocks of equal prefixes between requests and keep freed blocks
    findable until their memory is needed (on by default, as in vLLM; ``--no-prefix-caching`` turns it off,
    which gives m05's engine exactly)."""

    enable_prefix_caching: bool = True
