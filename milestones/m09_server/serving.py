"""What happens to one completion request, from parsed JSON to the last byte of the answer.

    handler (event loop)                                            engine thread
    ---------------------------------------------------------------------------------
    check model; tokenize in a tokenizer thread (chat: the chat template first)
    check the context length, build SamplingParams
    stream = await async_engine.add_request(ids, params)   ----->   engine.add_request
    for each RequestOutput from stream                      <-----   engine.step() ...
        text = detokenizer.update(output.token_ids)
        stop string found? -> abort the engine request, finish "stop"
        stream=true: send an SSE chunk  /  stream=false: keep the text
    finally: client gone or error before the end? -> abort (frees its K/V); record metrics

A streamed answer is one SSE chunk per engine step that gave the request a token, so a client can time
every token; a chunk's text may be empty while the detokenizer holds back an incomplete character or a
possible stop string. The first chunk's latency is the time to first token, queueing included. When the
event loop falls behind the engine (several steps' outputs waiting for one request), they go out as one
chunk carrying several tokens, as vLLM does: under load the server catches up instead of slowing the engine.

Tokenizing is the step whose cost a client chooses (tens of seconds for a 30 MB prompt), so it runs in a pool of
tokenizer threads, as in vLLM (the Rust tokenizer runs without Python's GIL): a long prompt delays only itself.
A prompt whose length in characters already rules it out is refused before it is tokenized.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from starlette.requests import Request as HTTPRequest
from starlette.responses import JSONResponse, Response, StreamingResponse

from milestones.common.openai_errors import APIError, error_body
from milestones.common.openai_protocol import ChatCompletionRequest, CompletionRequest, SamplingRequest, usage

from .async_engine import AsyncLLMEngine, EngineClosed, EngineError, RequestStream
from .detokenizer import IncrementalDetokenizer
from .engine import SamplingParams
from .metrics import ServerMetrics


def engine_sampling_params(body: SamplingRequest, max_tokens: int) -> SamplingParams:
    """The engine's ``SamplingParams`` (string stops are not among them: the detokenizer applies those)."""
    return SamplingParams(max_tokens=max_tokens, temperature=body.temperature, top_k=body.top_k, top_p=body.top_p,
                          seed=body.seed, ignore_eos=body.ignore_eos, stop_token_ids=list(body.stop_token_ids))


def engine_failure(error: Exception) -> APIError:
    if isinstance(error, EngineClosed):
        return APIError(503, str(error), "service_unavailable_error", code="shutting_down")
    return APIError(500, str(error), "server_error", code="engine_error")


@dataclass
class Delta:
    text: str
    token_ids: list[int]  # the tokens new since the previous delta
    finish_reason: str | None


class Generation:
    """One request in flight: its outputs become text deltas; on any ending it aborts if needed and records metrics."""

    def __init__(self, async_engine: AsyncLLMEngine, stream: RequestStream, detokenizer: IncrementalDetokenizer,
                 metrics: ServerMetrics, prompt_tokens: int, arrival: float) -> None:
        self.async_engine, self.stream, self.detokenizer, self.metrics = async_engine, stream, detokenizer, metrics
        self.prompt_tokens, self.arrival = prompt_tokens, arrival
        self.completion_tokens = 0
        self.cached_tokens = 0
        self.token_times: list[float] = []
        self.status: str | None = None  # how it ended: stop, length, abort, error

    async def deltas(self) -> AsyncIterator[Delta]:
        """One delta per batch of outputs (see ``RequestStream.batches``): one per token while we keep up."""
        try:
            async for batch in self.stream.batches():
                now = time.perf_counter()
                pieces, new_ids, finish = [], [], None
                for output in batch:  # each output on its own, so a stop string ends at its exact token
                    self.token_times.append(now)
                    finish = output.finish_reason
                    pieces.append(self.detokenizer.update(output.token_ids, finished=finish is not None))
                    if self.detokenizer.stopped and finish is None:  # a stop string: the engine does not know it
                        self.async_engine.abort(self.stream)
                        finish = "stop"
                    new_ids += output.token_ids[self.completion_tokens:]
                    self.completion_tokens = len(output.token_ids)
                    self.cached_tokens = getattr(output, "num_cached_tokens", 0) or 0  # m06 on
                    if finish is not None:
                        break
                if finish is not None:
                    self.status = finish if finish in ("stop", "length") else "abort"
                yield Delta("".join(pieces), new_ids, finish)
                if finish is not None:
                    return
        except EngineClosed:
            self.status = "abort"  # the server shut down first
            raise
        except EngineError:
            self.status = "error"
            raise

    def usage(self) -> dict:
        return usage(self.prompt_tokens, self.completion_tokens, self.cached_tokens)

    def close(self) -> None:
        """Called exactly when the HTTP exchange is over, however it ended. Idempotent."""
        if self.status is None:  # the client left (or the handler was cancelled) before the end
            self.status = "abort"
            self.async_engine.abort(self.stream)
        if self.metrics is not None:
            self.metrics.record(self.status, self.prompt_tokens, self.completion_tokens, self.token_times,
                                self.arrival, time.perf_counter())
            self.metrics = None


class ClosingStreamingResponse(StreamingResponse):
    """A streaming response that always runs ``on_close``, even when the client left before the first byte.

    (A generator's ``finally`` does not run if the generator never started, and a request that is never
    aborted keeps its K/V until it has generated all its tokens for nobody.)
    """

    def __init__(self, content: AsyncIterator[str], on_close: Callable[[], None]) -> None:
        super().__init__(content, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        self.on_close = on_close

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.on_close()


async def cancel_on_disconnect(request: HTTPRequest, work: Awaitable) -> object | None:
    """Await ``work`` unless the client disconnects first; then cancel it (its ``finally`` aborts the request).

    Returns ``work``'s result, or None when the client left.
    """
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_wait_for_disconnect(request))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        if not task.done():
            task.cancel()
        watcher.cancel()
    return None if task.cancelled() else task.result()


async def _wait_for_disconnect(request: HTTPRequest) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


def client_gone() -> Response:
    return Response(status_code=499)  # nginx's "client closed request": nobody is there to read it


def with_token_ids(choice: dict, token_ids: list[int], body: SamplingRequest) -> dict:
    """vLLM's ``return_token_ids`` extension: the choice also lists the generated token ids."""
    if body.return_token_ids:
        choice["token_ids"] = token_ids
    return choice


def sse(payload: dict) -> str:
    return f"data: {json.dumps(payload, separators=(',', ':'), ensure_ascii=False)}\n\n"


def chars_per_token_bound(tokenizer) -> int | None:
    """Most prompt characters one token stands for: 4x the longest vocabulary entry (None: no vocabulary to read).

    A byte-level entry holds one character per byte, so the longest (Qwen3's: 128 spaces) bounds the normalized
    characters one token covers, and NFC composes at most 4 characters into one: generous, never too small.
    """
    get_vocab = getattr(tokenizer, "get_vocab", None)
    return 4 * max(map(len, get_vocab())) if callable(get_vocab) else None


class OpenAIServing:
    """The two generation endpoints over one ``AsyncLLMEngine``."""

    def __init__(self, async_engine: AsyncLLMEngine, tokenizer, model_names: list[str], max_model_len: int,
                 metrics: ServerMetrics) -> None:
        self.async_engine, self.tokenizer, self.metrics = async_engine, tokenizer, metrics
        self.model_names, self.max_model_len = model_names, max_model_len
        self.chars_per_token = chars_per_token_bound(tokenizer)
        self.tokenizer_threads = ThreadPoolExecutor(max_workers=4, thread_name_prefix="nanoserve-tokenizer")

    def close(self) -> None:
        self.tokenizer_threads.shutdown(wait=False, cancel_futures=True)

    # ------------------------------------------------------------------ endpoints

    async def completions(self, body: CompletionRequest, request: HTTPRequest) -> Response:
        arrival = time.perf_counter()
        self.check_model(body.model)
        ids = await self.off_loop(self.tokenize, body.prompt) if isinstance(body.prompt, str) else list(body.prompt)
        self.check_context(ids, body.max_tokens, "prompt")
        generation = await self.start(body, ids, body.max_tokens, arrival)
        response_id, created, model = f"cmpl-{uuid.uuid4().hex}", int(time.time()), self.model_name(body)

        def chunk(choices: list[dict], **extra) -> dict:
            return {"id": response_id, "object": "text_completion", "created": created, "model": model,
                    "choices": choices, **extra}

        if body.stream:
            def stream_chunk(delta: Delta) -> dict:
                choice = {"index": 0, "text": delta.text, "logprobs": None, "finish_reason": delta.finish_reason}
                return chunk([with_token_ids(choice, delta.token_ids, body)])
            return self.stream_response(generation, stream_chunk, chunk, body.include_usage)
        collected = await self.collect(generation, request)
        if collected is None:
            return client_gone()
        text, token_ids, finish = collected
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
        return JSONResponse(chunk([with_token_ids(choice, token_ids, body)], usage=generation.usage()))

    async def chat(self, body: ChatCompletionRequest, request: HTTPRequest) -> Response:
        arrival = time.perf_counter()
        self.check_model(body.model)
        ids = await self.off_loop(self.render_chat, body)
        max_tokens = body.requested_max_tokens
        if max_tokens is None:
            max_tokens = max(1, self.max_model_len - len(ids))  # the room the context leaves
        self.check_context(ids, max_tokens, "messages")
        generation = await self.start(body, ids, max_tokens, arrival)
        response_id, created, model = f"chatcmpl-{uuid.uuid4().hex}", int(time.time()), self.model_name(body)

        def chunk(choices: list[dict], **extra) -> dict:
            return {"id": response_id, "object": "chat.completion.chunk", "created": created, "model": model,
                    "choices": choices, **extra}

        if body.stream:
            first = True

            def stream_chunk(delta: Delta) -> dict:
                nonlocal first
                message = {"role": "assistant", "content": delta.text} if first else {"content": delta.text}
                first = False
                choice = {"index": 0, "delta": message, "logprobs": None, "finish_reason": delta.finish_reason}
                return chunk([with_token_ids(choice, delta.token_ids, body)])
            return self.stream_response(generation, stream_chunk, chunk, body.include_usage)
        collected = await self.collect(generation, request)
        if collected is None:
            return client_gone()
        text, token_ids, finish = collected
        choice = {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                  "finish_reason": finish}
        return JSONResponse({"id": response_id, "object": "chat.completion", "created": created, "model": model,
                             "choices": [with_token_ids(choice, token_ids, body)], "usage": generation.usage()})

    # ------------------------------------------------------------------ before the engine

    def check_model(self, model: str | None) -> None:
        if model is not None and model not in self.model_names:
            raise APIError(404, f"the model {model!r} does not exist; this server serves {self.model_names[0]!r}",
                           "not_found_error", "model", "model_not_found")

    def model_name(self, body: SamplingRequest) -> str:
        return body.model if body.model is not None else self.model_names[0]

    async def off_loop(self, function: Callable, *args):
        """``function(*args)`` in a tokenizer thread: the event loop serves every other request meanwhile."""
        return await asyncio.get_running_loop().run_in_executor(self.tokenizer_threads, function, *args)

    def tokenize(self, prompt: str, param: str = "prompt") -> list[int]:
        """Runs in a tokenizer thread. Refuses a prompt too long in characters alone to fit, before tokenizing it."""
        if self.chars_per_token is not None and len(prompt) >= self.max_model_len * self.chars_per_token:
            raise APIError(400, f"the prompt is {len(prompt):,} characters, so at least "
                           f"{len(prompt) // self.chars_per_token:,} tokens (none stands for more than "
                           f"{self.chars_per_token}), but this model's context is {self.max_model_len} tokens",
                           param=param, code="context_length_exceeded")
        return self.tokenizer.encode(prompt, add_special_tokens=False)

    def render_chat(self, body: ChatCompletionRequest) -> list[int]:
        """Runs in a tokenizer thread. The length check is on the rendered text: a template may drop content."""
        if not getattr(self.tokenizer, "chat_template", None):
            raise APIError(400, "this model's tokenizer has no chat template: use /v1/completions", param="messages")
        messages = [{"role": m.role, "content": m.text} for m in body.messages]
        try:
            text = self.tokenizer.apply_chat_template(messages, tokenize=False,
                                                      add_generation_prompt=body.add_generation_prompt,
                                                      **(body.chat_template_kwargs or {}))
        except Exception as error:  # a template error is about the messages sent
            raise APIError(400, f"could not apply the chat template: {error}", param="messages") from error
        return self.tokenize(text, "messages")

    def check_context(self, ids: list[int], max_tokens: int, prompt_param: str) -> None:
        if not ids:
            raise APIError(400, "the prompt has no tokens", param=prompt_param)
        if len(ids) >= self.max_model_len:
            raise APIError(400, f"the prompt is {len(ids)} tokens, but this model's context is {self.max_model_len} "
                           "tokens (prompt + generated)", param=prompt_param, code="context_length_exceeded")
        if len(ids) + max_tokens > self.max_model_len:
            raise APIError(400, f"prompt ({len(ids)} tokens) + max_tokens ({max_tokens}) = {len(ids) + max_tokens} "
                           f"exceeds this model's context of {self.max_model_len} tokens", param="max_tokens",
                           code="context_length_exceeded")

    async def start(self, body: SamplingRequest, ids: list[int], max_tokens: int, arrival: float) -> Generation:
        try:
            params = engine_sampling_params(body, max_tokens)
            detokenizer = IncrementalDetokenizer(self.tokenizer, body.stop)
            stream = await self.async_engine.add_request(ids, params)
        except ValueError as error:  # the engine's own validation: the request is at fault
            raise APIError(400, str(error)) from error
        except (EngineClosed, EngineError) as error:
            raise engine_failure(error) from error
        return Generation(self.async_engine, stream, detokenizer, self.metrics, len(ids), arrival)

    # ------------------------------------------------------------------ after the engine

    async def collect(self, generation: Generation, request: HTTPRequest) -> tuple[str, list[int], str | None] | None:
        """Non-streaming: the whole text, token ids and finish reason; None if the client disconnected first."""
        async def run() -> tuple[str, list[int], str | None]:
            pieces, token_ids, finish = [], [], None
            try:
                async for delta in generation.deltas():
                    pieces.append(delta.text)
                    token_ids += delta.token_ids
                    finish = delta.finish_reason
            finally:
                generation.close()
            return "".join(pieces), token_ids, finish

        try:
            return await cancel_on_disconnect(request, run())
        except (EngineError, EngineClosed) as error:
            raise engine_failure(error) from error

    def stream_response(self, generation: Generation, stream_chunk: Callable[[Delta], dict],
                        chunk: Callable[..., dict], include_usage: bool) -> Response:
        async def events() -> AsyncIterator[str]:
            try:
                async for delta in generation.deltas():
                    yield sse(stream_chunk(delta))
                if include_usage:
                    yield sse(chunk([], usage=generation.usage()))
            except (EngineError, EngineClosed) as error:
                failure = engine_failure(error)
                yield sse(error_body(failure.message, failure.type, None, failure.code))
            finally:
                generation.close()
            yield "data: [DONE]\n\n"

        return ClosingStreamingResponse(events(), on_close=generation.close)
