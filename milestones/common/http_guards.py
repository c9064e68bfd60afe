"""The server's doors: what an HTTP server exposed to a room refuses before any of its own code runs.

One event loop serves every connection, so anything a single request makes it do, every other request waits
for. Two guards, each answering in OpenAI's error format (``{"error": {"message", "type", "param", "code"}}``):

* ``APIKeyCheck`` (ASGI middleware): with ``--api-key`` set, a ``/v1/...`` request without
  ``Authorization: Bearer <key>`` is answered 401 before its body is read. ``/health`` and ``/metrics`` stay
  open, as in vLLM. Keys are compared in constant time (``secrets.compare_digest`` over SHA-256 digests), so
  response timing says nothing about how much of a guess was right.
* ``RequestBodyLimit`` (ASGI middleware): the body is read here, in full, before the app parses anything.
  More than ``max_bytes`` -> 413, at once when ``Content-Length`` announces it, otherwise as soon as the bytes
  counted pass the limit (a chunked upload has no ``Content-Length``); the rest of the upload is read and
  dropped by uvicorn, so the client still gets its answer. A body still incomplete ``timeout_s`` after the
  headers -> 408, and the connection is closed: a client that sends headers and then nothing holds nothing.
  The limit also bounds the event loop's own work on a body: FastAPI's ``json.loads`` and pydantic run there.

A third door is uvicorn's: ``server_thread.IdleConnectionTimeout`` closes a connection that never sends a
request (uvicorn's keep-alive timer, armed when the connection opens).

(Starlette 1.x ships a ``RequestBodyLimitMiddleware``; this one also times out a body that never arrives,
answers in OpenAI's format, and runs on every FastAPI this project supports.)
"""

from __future__ import annotations

import asyncio
import hashlib
import secrets
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .openai_errors import APIError

if TYPE_CHECKING:  # nothing from starlette at import time: the CLI imports this module before any server exists
    from starlette.types import ASGIApp, Message, Receive, Scope, Send

# MiB. A full 40,960-token Qwen3 prompt is at most ~0.5 MiB of JSON (ids, or escaped CJK text); the longest text
# prompt this lets through takes a tokenizer thread seconds, and the event loop about 0.1 s (m09's page).
DEFAULT_MAX_REQUEST_BODY_MB = 2.0
DEFAULT_REQUEST_BODY_TIMEOUT_S = 30.0  # from the headers to the body's last byte
DEFAULT_TIMEOUT_KEEP_ALIVE_S = 5.0  # uvicorn's default; here it also closes connections that never send a request


def header(scope: Scope, name: bytes) -> str | None:
    """A request header's value (``name`` in lower case, as ASGI gives header names), or None."""
    for key, value in scope.get("headers", ()):
        if key == name:
            return value.decode("latin-1")
    return None


class APIKeyCheck:
    """Answers 401 to a request under ``/v1`` whose ``Authorization`` header is not ``Bearer <one of the keys>``."""

    def __init__(self, app: ASGIApp, api_keys: Iterable[str], on_refused: Callable[[], None] | None = None,
                 protected_prefix: str = "/v1") -> None:
        self.app, self.on_refused, self.protected_prefix = app, on_refused, protected_prefix
        self.digests = [hashlib.sha256(key.encode()).digest() for key in api_keys]
        if not self.digests:
            raise ValueError("APIKeyCheck needs at least one key")

    def authorized(self, header: str | None) -> bool:
        scheme, _, token = (header or "").partition(" ")
        digest = hashlib.sha256(token.strip().encode("utf-8", "surrogateescape")).digest()
        matched = False
        for key in self.digests:  # every key compared, equal digest lengths: the time taken never depends on the guess
            matched |= secrets.compare_digest(digest, key)
        return matched and scheme.lower() == "bearer"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "") if scope["type"] == "http" else ""
        protected = path == self.protected_prefix or path.startswith(self.protected_prefix + "/")
        if not protected or self.authorized(header(scope, b"authorization")):
            return await self.app(scope, receive, send)
        if self.on_refused is not None:
            self.on_refused()
        refusal = APIError(401, "a valid API key is required: send the header 'Authorization: Bearer <key>' (the "
                           "server's --api-key)", code="invalid_api_key")
        await refusal.response({"WWW-Authenticate": "Bearer"})(scope, receive, send)


class RequestBodyLimit:
    """Reads a request's body in full before the app sees it: 413 past ``max_bytes``, 408 past ``timeout_s``."""

    def __init__(self, app: ASGIApp, max_bytes: int, timeout_s: float,
                 on_refused: Callable[[], None] | None = None) -> None:
        if max_bytes < 1 or not timeout_s > 0:
            raise ValueError(f"RequestBodyLimit needs max_bytes >= 1 and timeout_s > 0, got {max_bytes}, {timeout_s}")
        self.app, self.max_bytes, self.timeout_s, self.on_refused = app, max_bytes, timeout_s, on_refused

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        length, chunked = header(scope, b"content-length"), header(scope, b"transfer-encoding")
        if scope["type"] != "http" or (length is None and chunked is None):
            return await self.app(scope, receive, send)  # no body (GET /health, /metrics): nothing to guard
        if length is not None and length.isdigit() and int(length) > self.max_bytes:
            return await self.refuse(scope, receive, send, 413, f"the request body is {int(length):,} bytes; this "
                                     f"server accepts at most {self.max_bytes:,} (--max-request-body-mb)")
        try:
            body = await self.read_body(receive)
        except asyncio.TimeoutError:
            return await self.refuse(scope, receive, send, 408, f"the request body did not arrive within "
                                     f"{self.timeout_s:g} s of its headers", {"Connection": "close"})
        except _TooLarge:
            return await self.refuse(scope, receive, send, 413, f"the request body is over the {self.max_bytes:,} "
                                     "bytes this server accepts (--max-request-body-mb)")
        if body is None:
            return  # the client left before it finished sending: nobody to answer

        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if replayed:
                return await receive()  # after the body: a disconnect, which the app may wait for
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, replay, send)

    async def read_body(self, receive: Receive) -> bytes | None:
        """The whole body (None if the client disconnected first); raises ``_TooLarge`` or ``asyncio.TimeoutError``."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout_s
        chunks, size = [], 0
        while True:
            message = await asyncio.wait_for(receive(), max(deadline - loop.time(), 0.0))
            if message["type"] == "http.disconnect":
                return None
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                raise _TooLarge
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)

    async def refuse(self, scope: Scope, receive: Receive, send: Send, status: int, message: str,
                     headers: dict[str, str] | None = None) -> None:
        if self.on_refused is not None:
            self.on_refused()
        code = "request_too_large" if status == 413 else "request_timeout"
        await APIError(status, message, code=code).response(headers)(scope, receive, send)


class _TooLarge(Exception):
    pass


@dataclass(frozen=True)
class ServerGuards:
    """The doors' settings (``serve``'s ``--api-key``, ``--max-request-body-mb``, ``--request-body-timeout-s``)."""

    api_keys: tuple[str, ...] = ()  # empty: no key asked
    max_request_body_bytes: int = int(DEFAULT_MAX_REQUEST_BODY_MB * 2**20)
    request_body_timeout_s: float = DEFAULT_REQUEST_BODY_TIMEOUT_S

    def install(self, app, on_refused: Callable[[], None] | None = None) -> None:
        """Wrap a Starlette/FastAPI ``app``: the key is checked first (the last middleware added runs first), so
        a request without it is refused before its body is read."""
        app.add_middleware(RequestBodyLimit, max_bytes=self.max_request_body_bytes,
                           timeout_s=self.request_body_timeout_s, on_refused=on_refused)
        if self.api_keys:
            app.add_middleware(APIKeyCheck, api_keys=self.api_keys, on_refused=on_refused)
