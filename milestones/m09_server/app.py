"""The FastAPI application: routes, the doors and error bodies, and the engine loop's start and stop.

``build_app(engine)`` serves *any* engine with the step API, so a later milestone serves its faster engine
by passing it here; nothing in the server names a milestone. The routes talk to an ``EngineClient``: given an
engine, the app drives it from a thread of its own process (``AsyncLLMEngine``); given a client, it uses that
(m11's ``AsyncLLM`` reaches an engine in another process).

Routes: ``POST /v1/completions``, ``POST /v1/chat/completions``, ``GET /v1/models``, ``GET /health``,
``GET /metrics``. Every error is an OpenAI-style body ``{"error": {"message", "type", "param", "code"}}``:
400 for a request the server cannot take (bad JSON, a wrong type, a value out of range, a prompt too long),
401 without the API key (``/v1/*``, when the server has one), 404 for an unknown model or route, 408 for a body
that never arrives, 413 for one too large, 500 when the engine failed, 503 while shutting down. The 401, 408 and
413 come before the body is read (``common/http_guards.py``), the rest from ``common/openai_errors.py``.
"""

from __future__ import annotations

import time
from contextlib import asynccontextmanager

from fastapi import FastAPI
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from milestones.common.http_guards import ServerGuards
from milestones.common.openai_errors import APIError, install_error_handlers
from milestones.common.openai_protocol import ChatCompletionRequest, CompletionRequest

from .async_engine import AsyncLLMEngine, EngineClient
from .metrics import ServerMetrics
from .serving import OpenAIServing


def build_app(engine, served_model_name: str | list[str] | None = None, shutdown_grace_s: float = 0.0,
              guards: ServerGuards = ServerGuards()) -> FastAPI:
    """An app serving ``engine`` (a step-API engine, or an ``EngineClient``); it starts with the app and stops
    with it.

    ``served_model_name``: the name(s) clients pass as ``model`` (default: what the engine was loaded from).
    ``shutdown_grace_s``: on shutdown, how long requests still in flight may take to finish before they are
    aborted (uvicorn's own ``timeout_graceful_shutdown`` runs first; see ``server_thread.py``).
    ``guards``: the API keys asked for (none by default) and the request body's size and time limits.
    """
    names = [served_model_name] if isinstance(served_model_name, str) else list(served_model_name or [])
    async_engine = engine if isinstance(engine, EngineClient) else AsyncLLMEngine(engine)
    names = names or [async_engine.model]
    metrics = ServerMetrics(lambda: async_engine.state)
    serving = OpenAIServing(async_engine, async_engine.tokenizer, names, async_engine.max_model_len, metrics)
    created = int(time.time())

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        async_engine.start()
        yield
        await async_engine.shutdown(shutdown_grace_s)
        serving.close()

    app = FastAPI(title="nanoserve", description=f"OpenAI-compatible server over {async_engine.milestone}",
                  lifespan=lifespan)
    app.state.async_engine, app.state.metrics = async_engine, metrics

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request) -> Response:
        return await serving.completions(body, request)

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
        return await serving.chat(body, request)

    @app.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": [{"id": name, "object": "model", "created": created, "owned_by": "nanoserve",
                                            "root": async_engine.model, "max_model_len": async_engine.max_model_len}
                                           for name in names]}

    @app.get("/health")
    async def health() -> Response:
        if async_engine.is_running:
            return JSONResponse({"status": "ok", "milestone": async_engine.milestone})
        return APIError(503, "the engine is not running", "service_unavailable_error").response()

    @app.get("/metrics")
    async def prometheus_metrics() -> Response:
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    install_error_handlers(app, on_rejected=metrics.record_rejected)
    guards.install(app, on_refused=metrics.record_rejected)
    return app
