"""The FastAPI application: routes, error bodies, and the engine loop's start and stop.

``build_app(engine)`` serves *any* engine with the step API, so a later milestone serves its faster engine
by passing it here; nothing in the server names a milestone. The routes talk to an ``EngineClient``: given an
engine, the app drives it from a thread of its own process (``AsyncLLMEngine``); given a client, it uses that
(m11's ``AsyncLLM`` reaches an engine in another process).

Routes: ``POST /v1/completions``, ``POST /v1/chat/completions``, ``GET /v1/models``, ``GET /health``,
``GET /metrics``. Every error is an OpenAI-style body ``{"error": {"message", "type", "param", "code"}}``:
400 for a request the server cannot take (bad JSON, a wrong type, a value out of range, a prompt too long),
404 for an unknown model or route, 500 when the engine failed, 503 while shutting down.
"""

from __future__ import annotations

import time
from contextlib import asynccontextmanager

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from .async_engine import AsyncLLMEngine, EngineClient
from .metrics import ServerMetrics
from .protocol import ChatCompletionRequest, CompletionRequest, error_body
from .serving import APIError, OpenAIServing


def build_app(engine, served_model_name: str | list[str] | None = None, shutdown_grace_s: float = 0.0) -> FastAPI:
    """An app serving ``engine`` (a step-API engine, or an ``EngineClient``); it starts with the app and stops
    with it.

    ``served_model_name``: the name(s) clients pass as ``model`` (default: what the engine was loaded from).
    ``shutdown_grace_s``: on shutdown, how long requests still in flight may take to finish before they are
    aborted (uvicorn's own ``timeout_graceful_shutdown`` runs first; see ``server_thread.py``).
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

    install_error_handlers(app, metrics)
    return app


def install_error_handlers(app: FastAPI, metrics: ServerMetrics) -> None:
    """Every error leaves as an OpenAI-style body; 4xx answers count as ``rejected`` requests."""

    @app.exception_handler(APIError)
    async def api_error(request: Request, error: APIError) -> Response:
        if error.status < 500:
            metrics.record_rejected()
        return error.response()

    @app.exception_handler(RequestValidationError)
    async def invalid_request(request: Request, error: RequestValidationError) -> Response:
        metrics.record_rejected()
        problems = error.errors()
        if problems[0]["type"] == "json_invalid":
            return APIError(400, f"the request body is not valid JSON: {problems[0].get('ctx', {}).get('error', '')}",
                            code="invalid_json").response()
        messages = []  # every problem, each naming its parameter: "prompt: ...; prompt: ..."
        for problem in problems:
            param, text = _param(problem["loc"]), problem["msg"].removeprefix("Value error, ")
            messages.append(text if param is None else f"{param}: {text}")
        return APIError(400, "; ".join(dict.fromkeys(messages)), param=_param(problems[0]["loc"]),
                        code=problems[0]["type"]).response()

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, error: StarletteHTTPException) -> Response:
        type_ = "not_found_error" if error.status_code == 404 else "invalid_request_error"
        return JSONResponse(error_body(str(error.detail), type_, None, error.status_code),
                            status_code=error.status_code)

    @app.exception_handler(Exception)
    async def unexpected(request: Request, error: Exception) -> Response:
        return JSONResponse(error_body(f"internal error: {error!r}", "server_error", None, "internal_error"),
                            status_code=500)


_TYPE_TAGS = {"str", "int", "float", "bool", "list", "dict", "none"}  # pydantic's names for the arms of a union


def _param(location: tuple) -> str | None:
    """``("body", "messages", 0, "role")`` -> ``"messages.0.role"``; stops at a union arm's tag (``"str"``)."""
    parts = []
    for part in location[1:] if location[:1] == ("body",) else location:
        if isinstance(part, str) and (not part.isidentifier() or part in _TYPE_TAGS):
            break
        parts.append(str(part))
    return ".".join(parts) or None
