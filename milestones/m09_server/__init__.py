"""m09_server: an OpenAI-compatible HTTP server with streaming, over an engine loop in a background thread.

New here: ``engine.py`` (the engine the server serves: m08's, with step outputs that skip the full decode),
``async_engine.py`` (one thread owns the engine; asyncio queues carry its tokens to the requests),
``detokenizer.py`` (token ids to text deltas: no split characters, no partial stop strings), ``protocol.py``
(the OpenAI request and response shapes), ``serving.py`` and ``app.py`` (the FastAPI endpoints),
``metrics.py`` (Prometheus) and ``__main__.py`` (the demo, and ``serve``: its command line is plumbing, in
``milestones/common/serve_cli.py``).

``import milestones.m09_server`` needs no web packages; the server modules import FastAPI and uvicorn.
"""

from .engine import EngineConfig, LLMEngine, RequestOutput, SamplingParams

__all__ = ["EngineConfig", "LLMEngine", "RequestOutput", "SamplingParams"]
