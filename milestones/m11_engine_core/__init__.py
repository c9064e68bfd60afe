"""m11_engine_core: the engine in a process of its own, so the server's Python never makes the GPU wait.

New here: ``core.py`` (the engine core: a loop that takes requests and aborts, runs a step and sends one
message per step, in a child process that owns the GPU), ``messages.py`` (what crosses the socket, as
msgspec structs), ``core_client.py`` (starting the core and its two ZMQ sockets, stopping it), ``async_llm.py``
(``AsyncLLM``: the front end's engine client, which m09's server talks to) and ``engine.py`` (m10's engine with
per-step outputs and the front end's request ids). ``generate`` still runs in-process.
``python -m milestones.m11_engine_core serve`` serves it with m09's server and flags.
"""

from milestones.m10_cuda_graphs import EngineConfig, RequestOutput, SamplingParams

from .engine import LLMEngine

__all__ = ["EngineConfig", "LLMEngine", "RequestOutput", "SamplingParams"]
