"""m10_cuda_graphs: decode steps replayed from CUDA graphs captured per batch size; fewer kernels per step.

New here: ``graph_runner.py`` (static input buffers, one graph per batch size of a ladder, padding, replay),
``packed_layers.py`` (q/k/v and gate/up packed into one weight each at load, q/k norm and RoPE applied once)
and ``config.py`` / ``engine.py`` (``enforce_eager``; decode-only steps replayed, the rest eager). The server
of m09 serves this engine unchanged: ``python -m milestones.m10_cuda_graphs serve``.
"""

from milestones.m09_server import RequestOutput, SamplingParams

from .config import EngineConfig
from .engine import LLMEngine

__all__ = ["EngineConfig", "LLMEngine", "RequestOutput", "SamplingParams"]
