"""m12_async_scheduling: the host plans step N+1 while the GPU runs step N; sampled ids never leave the GPU
on their way to the next step, and the host learns each step's tokens one step late, exactly.

New here: ``sequence.py`` (a sequence with pending tokens), ``scheduler.py`` (m07's, planning with pending
tokens), ``in_flight.py`` (a launched step and its sampled ids), ``graph_runner.py`` (m10's runner, safe to load
while the previous step copies), ``engine.py`` (the overlapped step) and ``config.py`` (``async_scheduling``,
``cudagraph_mode``). With the host hidden, a step costs what the GPU does: ``fused_kernels.py`` and
``fused_layers.py`` (three Triton kernels in the graphs instead of many small ones), ``paged_prefill_kernel.py``
and ``attention.py`` (every prompt chunk of a step in one launch), ``piecewise.py`` (steps with prompt chunks
replayed in pieces between the attentions) and ``full_graphs.py`` (such steps replayed whole) make that smaller.
"""

from milestones.m11_engine_core import RequestOutput, SamplingParams

from .config import EngineConfig
from .engine import LLMEngine

__all__ = ["EngineConfig", "LLMEngine", "RequestOutput", "SamplingParams"]
