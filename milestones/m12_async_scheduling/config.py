"""m12's config: m11's plus vLLM's switch for overlapped scheduling."""

from __future__ import annotations

from dataclasses import dataclass, field

from milestones.m01_naive_loop.config import one_of
from milestones.m11_engine_core import EngineConfig as EngineCoreConfig

CUDAGRAPH_MODES = ("full", "full_and_piecewise", "full_decode_only")


@dataclass
class EngineConfig(EngineCoreConfig):
    """* ``async_scheduling`` (vLLM's name, ``--async-scheduling`` / ``--no-async-scheduling``): plan and launch
      step N+1 while the GPU runs step N, learning step N's tokens one step late. Off: m11's engine, step by step.
    * ``cudagraph_mode`` (vLLM's ``compilation_config.cudagraph_mode``): ``full`` (default) also replays the steps
      with prompt chunks, each whole, attention included (``full_graphs.py``; with the torch attention backend,
      whose attention cannot be recorded, in pieces as ``full_and_piecewise`` does); ``full_and_piecewise``
      replays them in pieces between the attentions, launched from Python (``piecewise.py``);
      ``full_decode_only`` replays decode-only steps, as m10 does."""

    async_scheduling: bool = True
    cudagraph_mode: str = field(default="full", metadata=one_of(*CUDAGRAPH_MODES))
