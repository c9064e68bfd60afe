"""``AsyncLLM``: the front end's engine client. The server (m09's, unchanged) talks to it as it talked to m09's
engine thread; the engine itself runs in the engine core process (``core.py``).

    HTTP handlers (event loop)                  AsyncLLM (this process)              engine core (process)
    tokenize, check the request ────────────►  add_request: check limits  ── AddRequest ──►  queue it
    stream.batches() ◄── one output per step ◄ _dispatch(StepOutputs)     ◄── StepOutputs ── step()
    client gone / stop string ──────────────►  abort                      ── AbortRequests ─►  free its K/V

What lives where, as in vLLM's V1 split: the front end holds the tokenizer, the detokenizers (in the server's
``Generation``), the HTTP connections and the streams; the core holds the scheduler, the K/V cache and the
GPU. Only token ids and finishes cross.

* **Bad requests never reach the core.** ``check_request`` refuses what the engine's ``make_request`` would
  (ids outside the vocabulary, prompt + max_tokens past ``max_model_len`` or past the K/V cache), with the
  limits the core reported when it started.
* **A step's message is spread over the streams**: each request's new ids are appended to the front end's
  copy of its token list, and its stream gets an output whose ``token_ids`` is that list *as of this step*
  (``TokenIdsSoFar``, no copy). A stream that lags catches up in one SSE chunk (m09's output merging).
* **The core dying is noticed at once**: the event loop watches the process's sentinel; every request in
  flight ends with an error, ``/health`` answers 503 and new requests get 503 — nobody waits forever.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import zmq
import zmq.asyncio

from milestones.m01_naive_loop.loader import PRESETS, resolve_checkpoint
from milestones.m01_naive_loop.tokenizer import load_tokenizer
from milestones.m09_server.async_engine import EngineClient, EngineClosed, EngineError, EngineState, RequestStream

from .core_client import EngineCoreProcess
from .messages import AbortRequests, AddRequest, CoreFailed, Shutdown, StepOutputs


class TokenIdsSoFar(Sequence):
    """The first ``length`` ids of a request's growing token list: its ``token_ids`` at one step, uncopied."""

    __slots__ = ("ids", "length")

    def __init__(self, ids: list[int], length: int) -> None:
        self.ids, self.length = ids, length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index):
        if isinstance(index, slice):
            return self.ids[slice(*index.indices(self.length))]
        if not -self.length <= index < self.length:
            raise IndexError(index)
        return self.ids[index % self.length]


@dataclass
class StreamOutput:
    """What a request's stream yields each step it got a token (the fields the server reads of a RequestOutput)."""

    request_id: str
    token_ids: TokenIdsSoFar
    finish_reason: str | None
    num_cached_tokens: int


class AsyncLLM(EngineClient):
    """An ``EngineClient`` whose engine runs in a process of its own (started here, stopped by ``shutdown``)."""

    def __init__(self, config, engine_class, startup_timeout_s: float = 3600.0) -> None:
        self.core = EngineCoreProcess(engine_class, config, startup_timeout_s)
        limits = self.core.limits
        self.limits, self.milestone, self.max_model_len = limits, limits.milestone, limits.max_model_len
        self.model = str(config.model)
        self.tokenizer = load_tokenizer(None if config.model in PRESETS else resolve_checkpoint(config.model))
        self.state: EngineState = self.core.initial_state
        self._streams: dict[str, RequestStream] = {}  # requests in flight
        self._token_ids: dict[str, list[int]] = {}  # their output so far
        self._request_ids = (str(i) for i in itertools.count())
        self._reader: asyncio.Task | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._accepting = False
        self.dead: str | None = None  # why the core is gone, once it is

    # ------------------------------------------------------------------ EngineClient

    def describe(self) -> list[str]:
        return list(self.core.describe)

    @property
    def is_running(self) -> bool:
        return self._accepting and self.dead is None

    @property
    def num_in_flight(self) -> int:
        return len(self._streams)

    def start(self) -> None:
        if self._reader is not None:
            raise RuntimeError("AsyncLLM is already started")
        self._loop = asyncio.get_running_loop()
        outputs = zmq.asyncio.Socket.from_socket(self.core.output)
        self._reader = self._loop.create_task(self._read_outputs(outputs), name="engine-core-outputs")
        self._loop.add_reader(self.core.process.sentinel, self._core_exited)
        self._accepting = True

    async def add_request(self, prompt: str | list[int], params) -> RequestStream:
        if not self.is_running:
            raise EngineClosed(self.dead or "the server is shutting down")
        token_ids = self.tokenizer.encode(prompt, add_special_tokens=False) if isinstance(prompt, str) else prompt
        self.check_request(token_ids, params)
        request_id = next(self._request_ids)
        stream = RequestStream()
        stream.request_id = request_id
        self._streams[request_id], self._token_ids[request_id] = stream, []
        self.core.send(AddRequest(request_id, list(token_ids), params))
        return stream

    def abort(self, stream: RequestStream) -> None:
        if self._forget(stream.request_id) is not None and self.dead is None:
            self.core.send(AbortRequests([stream.request_id]))
        stream.finished = True

    async def shutdown(self, grace_s: float = 0.0) -> None:
        """Stop accepting; let requests in flight finish for up to ``grace_s``; end the rest; stop the core."""
        self._accepting = False
        deadline = asyncio.get_running_loop().time() + grace_s
        while self._streams and self.dead is None and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.02)
        self._fail_all(EngineClosed("the server shut down before this request finished"))
        stopping = self.dead is None
        self.dead = self.dead or "the engine core was shut down"
        if self._loop is not None:
            self._loop.remove_reader(self.core.process.sentinel)
        if stopping:
            self.core.send(Shutdown())
        await asyncio.to_thread(self.core.stop)
        if self._reader is not None:
            self._reader.cancel()

    # ------------------------------------------------------------------ the front end's checks

    def check_request(self, token_ids: Sequence[int], params) -> None:
        """Refuse (``ValueError``, answered 400) what the core's ``make_request`` would refuse."""
        limits = self.limits
        if not token_ids:
            raise ValueError("the prompt has no tokens")
        bad = [t for t in token_ids if not 0 <= t < limits.vocab_size]
        if bad:
            raise ValueError(f"token ids {bad[:5]} are outside [0, {limits.vocab_size})")
        total = len(token_ids) + params.max_tokens
        if total > limits.max_model_len:
            raise ValueError(f"prompt ({len(token_ids)} tokens) + max_tokens ({params.max_tokens}) = {total} "
                             f"exceeds max_model_len ({limits.max_model_len})")
        if total - 1 > limits.kv_capacity_tokens:
            raise ValueError(f"needs {total - 1} K/V slots (prompt + max_tokens - 1) but the cache holds "
                             f"{limits.kv_capacity_tokens}")

    # ------------------------------------------------------------------ outputs from the core

    async def _read_outputs(self, outputs: zmq.asyncio.Socket) -> None:
        while True:
            message = self.core.decode(await outputs.recv(copy=False))
            if isinstance(message, StepOutputs):
                self._dispatch(message)
            elif isinstance(message, CoreFailed):
                self._core_gone(message.message)
                return

    def _dispatch(self, message: StepOutputs) -> None:
        """Spread one step's message over the streams of its requests."""
        self.state = message.state
        for output in message.outputs:
            stream = self._streams.get(output.request_id)
            if stream is None:
                continue  # aborted while the step ran
            if output.error is not None:
                self._forget(output.request_id)
                stream.queue.put_nowait(EngineError(output.error))
                continue
            ids = self._token_ids[output.request_id]
            ids.extend(output.new_token_ids)
            if output.finish_reason is not None:
                self._forget(output.request_id)
            stream.queue.put_nowait(StreamOutput(output.request_id, TokenIdsSoFar(ids, len(ids)),
                                                 output.finish_reason, output.num_cached_tokens))

    def _forget(self, request_id: str | None) -> RequestStream | None:
        self._token_ids.pop(request_id, None)
        return self._streams.pop(request_id, None)

    # ------------------------------------------------------------------ the core going away

    def _core_exited(self) -> None:
        """The core process ended (the event loop saw its sentinel) while it should be serving."""
        self.core.process.join(1.0)  # reap it: its exit code is known only then
        self._core_gone(f"the engine core process died (exit code {self.core.process.exitcode})")

    def _core_gone(self, reason: str) -> None:
        if self.dead is not None:
            return
        self.dead = reason
        self._loop.remove_reader(self.core.process.sentinel)
        self._fail_all(EngineError(reason))

    def _fail_all(self, error: Exception) -> None:
        for request_id in list(self._streams):
            self._forget(request_id).queue.put_nowait(error)
