"""Every error a server answers, in OpenAI's shape: ``{"error": {"message", "type", "param", "code"}}``.

Clients (the official ``openai`` client among them) read ``message`` and raise by status: 400
``BadRequestError``, 401 ``AuthenticationError``, 404 ``NotFoundError``, 500 ``InternalServerError``...
``install_error_handlers`` makes a FastAPI app answer that way whatever went wrong: an ``APIError`` raised by
a handler, a request pydantic refused (every problem named with its parameter: ``"max_tokens: ...;
temperature: ..."``), a body FastAPI could not parse (bad JSON, invalid UTF-8, nesting past Python's recursion
limit), an unknown route, an unexpected exception.
"""

from __future__ import annotations

from collections.abc import Callable


def error_body(message: str, type_: str, param: str | None = None, code: str | int | None = None) -> dict:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


class APIError(Exception):
    """An error answered with an OpenAI-style body (``install_error_handlers`` turns it into the response)."""

    def __init__(self, status: int, message: str, type_: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type_, param, code

    def response(self, headers: dict[str, str] | None = None):
        from starlette.responses import JSONResponse

        return JSONResponse(error_body(self.message, self.type, self.param, self.code), status_code=self.status,
                            headers=headers)


def install_error_handlers(app, on_rejected: Callable[[], None]) -> None:
    """Every error of ``app`` (FastAPI) leaves as an OpenAI-style body; ``on_rejected()`` counts each 4xx refusal."""
    from fastapi.exceptions import RequestValidationError
    from starlette.exceptions import HTTPException
    from starlette.responses import JSONResponse

    @app.exception_handler(APIError)
    async def api_error(request, error: APIError):
        if error.status < 500:
            on_rejected()
        return error.response()

    @app.exception_handler(RequestValidationError)
    async def invalid_request(request, error: RequestValidationError):
        on_rejected()
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

    @app.exception_handler(HTTPException)
    async def http_error(request, error: HTTPException):
        type_ = "not_found_error" if error.status_code == 404 else "invalid_request_error"
        cause = f": {error.__cause__}" if error.__cause__ is not None else ""  # invalid UTF-8, JSON nested too deep
        return JSONResponse(error_body(f"{error.detail}{cause}", type_, None, error.status_code),
                            status_code=error.status_code)

    @app.exception_handler(Exception)
    async def unexpected(request, error: Exception):
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
