"""The OpenAI API's shapes, as pydantic models: what a client may send, and what the server answers.

Requests are validated by pydantic before any work: a wrong type, a missing field or a value out of range
becomes a 400 with an OpenAI-style error body (m09's ``app.py``). The field names and defaults follow OpenAI's
API, plus vLLM's extensions that nanoserve's engine supports (``top_k``, ``ignore_eos``, ``stop_token_ids``).

Responses are plain dicts built by m09's ``serving.py``; their shapes are documented here next to the requests:

* completion: ``{"id": "cmpl-...", "object": "text_completion", "created", "model",
  "choices": [{"index": 0, "text", "logprobs": null, "finish_reason"}], "usage"}``
* chat completion: ``{"id": "chatcmpl-...", "object": "chat.completion", ...,
  "choices": [{"index": 0, "message": {"role": "assistant", "content"}, "finish_reason"}], "usage"}``
* streamed, each chunk is ``data: {...}\\n\\n`` with ``object`` ``text_completion`` or
  ``chat.completion.chunk`` (``delta`` instead of ``message``); then, with ``stream_options.include_usage``,
  a chunk with ``"choices": []`` and the usage; then ``data: [DONE]``.
* ``usage``: ``{"prompt_tokens", "completion_tokens", "total_tokens",
  "prompt_tokens_details": {"cached_tokens"}}`` (cached: prompt tokens served by the prefix cache, m06 on).
* with ``"return_token_ids": true`` (vLLM's extension) each choice also lists its generated ``token_ids``.
* an error: ``{"error": {"message", "type", "param", "code"}}`` (``milestones/common/openai_errors.py``).

A request's size is bounded before it costs anything per token: at most ``MAX_STOP_STRINGS`` stop strings of
``MAX_STOP_STRING_CHARS`` characters (the detokenizer searches each after every token, on the event loop that
every stream shares; OpenAI's API allows 4), ``MAX_STOP_TOKEN_IDS`` stop token ids, and lists fail at their first
bad item (``fail_fast``: a million bad token ids are one error, not a million).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, Field, field_validator, model_validator

TokenIds = Annotated[list[Annotated[int, Field(ge=0)]], Field(min_length=1, fail_fast=True)]
MAX_STOP_STRINGS, MAX_STOP_STRING_CHARS, MAX_STOP_TOKEN_IDS = 16, 128, 1024


class StreamOptions(BaseModel):
    include_usage: bool = False


class SamplingRequest(BaseModel):
    """Fields both endpoints share."""

    model: str | None = None  # None: the served model
    temperature: float = Field(1.0, ge=0.0)  # OpenAI's default; 0 is greedy
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(-1, ge=-1)  # -1 or 0: off (vLLM's extension)
    seed: int | None = Field(None, ge=0, lt=2**63)
    stop: str | list[str] | None = Field(None, validate_default=True)  # becomes a list of strings
    stop_token_ids: list[Annotated[int, Field(ge=0)]] = Field(default_factory=list, fail_fast=True)
    ignore_eos: bool = False
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = 1
    return_token_ids: bool = False  # vLLM's extension: each choice also carries the generated token ids
    user: str | None = None  # accepted and ignored, as OpenAI's API allows

    @field_validator("n")
    @classmethod
    def only_one_choice(cls, n: int) -> int:
        if n != 1:
            raise ValueError(f"only n=1 is supported (got {n}): send one request per completion")
        return n

    @field_validator("stop", "stop_token_ids", mode="before")
    @classmethod
    def not_too_many(cls, value: object, info) -> object:
        """Counted before any item is looked at: a list of 10,000 is refused, not validated."""
        most = {"stop": MAX_STOP_STRINGS, "stop_token_ids": MAX_STOP_TOKEN_IDS}[info.field_name]
        if isinstance(value, list) and len(value) > most:
            raise ValueError(f"at most {most} are allowed (got {len(value):,})")
        return value

    @field_validator("stop")
    @classmethod
    def non_empty_stop_strings(cls, stop: str | list[str] | None) -> list[str]:
        stops = [stop] if isinstance(stop, str) else list(stop or [])
        if any(not s or len(s) > MAX_STOP_STRING_CHARS for s in stops):
            raise ValueError(f"stop strings must be 1 to {MAX_STOP_STRING_CHARS} characters long")
        return stops

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage



class CompletionRequest(SamplingRequest):
    """``POST /v1/completions``: a prompt as text or as token ids (one prompt per request)."""

    prompt: Annotated[str, Field(min_length=1)] | TokenIds
    max_tokens: int = Field(16, ge=1)  # OpenAI's default for completions
    # Not supported. The fields exist so that asking for them is a clear 400 instead of being ignored.
    echo: bool = False
    logprobs: int | None = None
    best_of: int | None = None
    suffix: str | None = None

    @model_validator(mode="after")
    def supported_features_only(self) -> CompletionRequest:
        _unsupported(echo=self.echo, logprobs=self.logprobs is not None, best_of=self.best_of not in (None, 1),
                     suffix=self.suffix is not None)
        return self


class ChatMessage(BaseModel):
    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: str | Annotated[list[TextPart], Field(fail_fast=True)]

    @property
    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)


class TextPart(BaseModel):
    type: Literal["text"]
    text: str


ChatMessage.model_rebuild()


class ChatCompletionRequest(SamplingRequest):
    """``POST /v1/chat/completions``: messages rendered to a prompt by the tokenizer's chat template."""

    messages: Annotated[list[ChatMessage], Field(min_length=1, fail_fast=True)]
    max_tokens: int | None = Field(None, ge=1)  # None: whatever room the context leaves
    max_completion_tokens: int | None = Field(None, ge=1)  # OpenAI's newer name for max_tokens
    add_generation_prompt: bool = True
    chat_template_kwargs: dict | None = None  # e.g. {"enable_thinking": false} for Qwen3 (vLLM's extension)
    logprobs: bool = False  # not supported (see CompletionRequest)
    tools: list | None = None  # not supported

    @model_validator(mode="after")
    def supported_features_only(self) -> ChatCompletionRequest:
        _unsupported(logprobs=self.logprobs, tools=bool(self.tools))
        return self

    @property
    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


def _unsupported(**asked: bool) -> None:
    names = [name for name, wanted in asked.items() if wanted]
    if names:
        raise ValueError(f"{', '.join(names)} {'is' if len(names) == 1 else 'are'} not supported by this server")


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": cached_tokens}}
