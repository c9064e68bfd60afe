"""m10's config: m09's plus the CUDA-graph switches (vLLM's names)."""

from __future__ import annotations

from dataclasses import dataclass

from milestones.m09_server import EngineConfig as ServerConfig


@dataclass
class EngineConfig(ServerConfig):
    """* ``enforce_eager``: never capture or replay CUDA graphs (every step launches its kernels from Python).
    * ``max_cuda_graph_batch_size``: the largest decode batch replayed from a graph (default ``max_num_seqs``);
      larger decode steps, and every step with prompt chunks, run eagerly.
    Graphs need a CUDA GPU and the Triton attention backend; elsewhere the engine runs eagerly, exactly as m09."""

    enforce_eager: bool = False
    max_cuda_graph_batch_size: int | None = None
