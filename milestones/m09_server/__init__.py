"""m09_server: an OpenAI-compatible HTTP server with streaming, over an engine loop in a background thread.

New here: ``engine.py`` (the engine the server serves: m08's, with step outputs that skip the full decode),
``async_engine.py`` (one thread owns the engine; asyncio queues carry its tokens to the requests),
``detokenizer.py`` (token ids to text deltas: no split characters, no partial stop strings), ``serving.py`` and
``app.py`` (the FastAPI endpoints), ``metrics.py`` (Prometheus) and ``__main__.py`` (the demo, and ``serve``).
The plumbing around them is in ``milestones/common/``: the command line (``serve_cli.py``) and OpenAI's request
shapes and errors (``openai_protocol.py``, ``openai_errors.py``).

``import milestones.m09_server`` needs no web packages; the server modules import FastAPI and uvicorn.
"""

from .engine import EngineConfig, LLMEngine, RequestOutput, SamplingParams

__all__ = ["EngineConfig", "LLMEngine", "RequestOutput", "SamplingParams"]
