"""m12's config: m11's plus vLLM's switch for overlapped scheduling."""

from __future__ import annotations

from dataclasses import dataclass

from milestones.m11_engine_core import EngineConfig as EngineCoreConfig


@dataclass
class EngineConfig(EngineCoreConfig):
    """``async_scheduling`` (vLLM's name, ``--async-scheduling`` / ``--no-async-scheduling``): plan and launch
    step N+1 while the GPU runs step N, learning step N's tokens one step late. Off: m11's engine, step by step."""

    async_scheduling: bool = True
