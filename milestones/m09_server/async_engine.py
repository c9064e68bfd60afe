"""The engine loop: one background thread owns the engine; asyncio queues carry its tokens to the requests.

The engine is synchronous: ``step()`` runs a forward pass and returns when the tokens are sampled. An HTTP
server is asynchronous: one event loop juggles hundreds of connections. Running ``step()`` on the event
loop would freeze every connection for the length of a step, so the engine lives in a thread of its own,
and the two sides talk only through queues::

      event loop (uvicorn, FastAPI handlers)              engine thread (the only code touching the engine)
      --------------------------------------              --------------------------------------------------
      add_request() --- ("add", stream, ...) --> inbox -->  engine.add_request()  (ValueError -> 400)
      abort()       --- ("abort", id)        --> inbox -->  engine.abort(id): its K/V is freed
                                                            while work: outputs = engine.step()
      stream.queue  <-- loop.call_soon_threadsafe(deliver, outputs) --+
      (one asyncio.Queue per request; each handler awaits its own)

* ``inbox`` is a thread-safe ``queue.SimpleQueue``. The engine thread drains it between steps, so new
  requests join at the next step and aborts take effect before it. With nothing to do, the thread blocks
  on the inbox instead of spinning.
* asyncio objects are not thread-safe: the engine thread never touches a ``asyncio.Queue`` itself. It
  hands one callback per step to the event loop (``call_soon_threadsafe``), which fills the queues there.
* An exception inside ``step()`` fails the requests that were running (their handlers get the error and
  answer 500, or an error event on a stream); they are aborted so their K/V is freed, and the loop goes on
  serving the rest and new requests.
* After every step the thread publishes an ``EngineState`` snapshot (running, waiting, K/V blocks...) for
  ``/metrics`` to read without touching the engine.
"""

from __future__ import annotations

import abc
import asyncio
import concurrent.futures
import logging
import queue
import threading
import traceback
from collections.abc import AsyncIterator
from dataclasses import dataclass

logger = logging.getLogger("nanoserve.server")


class EngineError(RuntimeError):
    """The engine failed while running this request (the request is over; the server keeps serving)."""


class EngineClosed(RuntimeError):
    """The engine loop is shutting down or has stopped: no new requests."""


@dataclass(frozen=True)
class EngineState:
    """What ``/metrics`` shows about the engine, as of its last step. ``None``: the engine has no such thing."""

    running: int = 0
    waiting: int = 0
    kv_blocks_total: int | None = None  # engines without paged blocks (m04) count one K/V slot as one block
    kv_blocks_free: int | None = None
    num_preemptions: int | None = None
    prefix_cache_queried_tokens: int | None = None
    prefix_cache_hit_tokens: int | None = None

    @classmethod
    def read(cls, engine) -> EngineState:
        """Read the engine defensively: each milestone adds some of these (m05 blocks, m06 prefix cache)."""
        scheduler = getattr(engine, "scheduler", None)
        total = free = None
        blocks = getattr(engine, "block_manager", None) or getattr(scheduler, "block_manager", None)
        allocator = getattr(scheduler, "allocator", None)
        if blocks is not None and hasattr(blocks, "num_blocks"):
            total, free = _value(blocks.num_blocks), _value(blocks.num_free_blocks)
        elif allocator is not None and hasattr(allocator, "capacity"):
            total, free = allocator.capacity, allocator.free_slots
        stats = getattr(engine, "stats", None)
        return cls(
            running=len(getattr(scheduler, "running", ()) or ()),
            waiting=len(getattr(scheduler, "waiting", ()) or ()),
            kv_blocks_total=total,
            kv_blocks_free=free,
            num_preemptions=getattr(stats, "num_preemptions", None),
            prefix_cache_queried_tokens=getattr(stats, "prefix_cache_queried_tokens", None),
            prefix_cache_hit_tokens=getattr(stats, "prefix_cache_hit_tokens", None),
        )


def _value(attribute):
    return attribute() if callable(attribute) else attribute


class RequestStream:
    """One request's side of the queue: ``async for output in stream`` yields its ``RequestOutput``s.

    The iteration ends after the output that carries a ``finish_reason``; an engine failure raises
    ``EngineError`` instead. Created on the event loop; only the event loop touches ``queue``.

    ``batches()`` yields lists instead: every output that is waiting when the consumer comes back for more.
    A consumer that keeps up gets one output per list; one that falls behind (a busy event loop, a slow
    client) catches up in one go instead of paying its per-output cost (an SSE chunk, a socket write) for
    each. vLLM's ``AsyncLLM`` merges a lagging request's outputs the same way. The engine never waits.
    """

    def __init__(self) -> None:
        self.request_id: str | None = None  # the engine's id, known once the engine accepted the request
        self.queue: asyncio.Queue = asyncio.Queue()
        self.finished = False

    def __aiter__(self) -> AsyncIterator:
        return self._outputs()

    async def _outputs(self):
        async for batch in self.batches():
            for output in batch:
                yield output

    async def batches(self):
        while not self.finished:
            batch = [await self.queue.get()]
            while not self.queue.empty() and not self._ends(batch[-1]):
                batch.append(self.queue.get_nowait())
            if isinstance(batch[-1], BaseException):
                error = batch.pop()
                if batch:  # the tokens that came before the failure still go out first
                    yield batch
                self.finished = True
                raise error
            if batch[-1].finish_reason is not None:
                self.finished = True
            yield batch

    @staticmethod
    def _ends(item) -> bool:
        return isinstance(item, BaseException) or item.finish_reason is not None


class EngineClient(abc.ABC):
    """What the HTTP layer talks to: requests in, a ``RequestStream`` of outputs back, aborts, state.

    The server never touches an engine object, only this interface. ``AsyncLLMEngine`` below implements it
    with the engine in a thread of the server's own process; m11's ``AsyncLLM`` implements it with the engine
    in a process of its own.
    """

    tokenizer: object  # encodes prompts and renders chat templates in the server's process
    max_model_len: int
    milestone: str
    model: str  # what the engine was loaded from (``EngineConfig.model``)
    state: EngineState  # the engine's state as of its last step, for /metrics

    @property
    @abc.abstractmethod
    def is_running(self) -> bool:
        """True while new requests are accepted (/health answers 200)."""

    @property
    @abc.abstractmethod
    def num_in_flight(self) -> int:
        """Requests accepted and not finished yet."""

    @abc.abstractmethod
    def start(self) -> None:
        """Begin serving; called on the event loop that will consume the outputs."""

    @abc.abstractmethod
    async def shutdown(self, grace_s: float = 0.0) -> None:
        """Stop accepting, let requests in flight finish for up to ``grace_s``, abort the rest, stop the engine."""

    @abc.abstractmethod
    async def add_request(self, prompt: str | list[int], params) -> RequestStream:
        """Queue a request; its stream once accepted. ``ValueError``: bad input; ``EngineClosed``: not serving."""

    @abc.abstractmethod
    def abort(self, stream: RequestStream) -> None:
        """Stop a request now (client gone, stop string found), freeing its K/V. Safe to call twice."""

    def describe(self) -> list[str]:
        """Lines worth printing when the server starts (the K/V cache, CUDA graphs)."""
        return []


def describe_engine(engine) -> list[str]:
    """The engine in a few lines: milestone, model, device and dtype; its K/V blocks (m05 on), graphs (m10)."""
    lines = [f"engine {engine.milestone}: {str(engine.config.model)!r} on {engine.device}, "
             f"{str(engine.dtype).removeprefix('torch.')}"]
    return lines + [getattr(engine, name)() for name in ("describe_kv_cache", "describe_cuda_graphs")
                    if hasattr(engine, name)]


def abort_touched_requests(engine, request_ids) -> list[str]:
    """After a step raised: abort the requests that step was running, among ``request_ids``; returns them.

    The step's requests are the scheduler's running list (if the engine has none to show, all of
    ``request_ids``). Their state is unknown after a failure, so each is aborted, which frees its K/V.
    """
    running = getattr(getattr(engine, "scheduler", None), "running", None)
    touched = list(request_ids) if running is None else [r.request_id for r in running if r.request_id in request_ids]
    for request_id in touched:
        try:
            engine.abort(request_id)
        except Exception:  # the engine is in a bad state; the request is dropped either way
            logger.error("abort of %s after a failed step raised:\n%s", request_id, traceback.format_exc())
    return touched


class AsyncLLMEngine(EngineClient):
    """Drives a step-API engine (``add_request`` / ``step`` / ``abort``) from a thread, for asyncio callers."""

    def __init__(self, engine) -> None:
        self.engine = engine
        self.tokenizer, self.max_model_len = engine.tokenizer, engine.max_model_len
        self.milestone, self.model = engine.milestone, str(engine.config.model)
        self.state = EngineState.read(engine)
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._streams: dict[str, RequestStream] = {}  # engine thread only: requests it is serving
        self._active: set[RequestStream] = set()  # event loop only: requests not yet finished
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._accepting = False
        self.dead: BaseException | None = None  # set if the loop itself crashed (a bug, not a step failure)

    # ------------------------------------------------------------------ event-loop side

    def start(self) -> None:
        """Start the engine thread; call from the event loop that will consume the outputs."""
        if self._thread is not None:
            raise RuntimeError("the engine loop is already started")
        self._loop = asyncio.get_running_loop()
        self._accepting = True
        self._thread = threading.Thread(target=self._run, name="engine-loop", daemon=True)
        self._thread.start()

    @property
    def is_running(self) -> bool:
        return self._accepting and self._thread is not None and self._thread.is_alive() and self.dead is None

    @property
    def num_in_flight(self) -> int:
        return len(self._active)

    def describe(self) -> list[str]:
        return describe_engine(self.engine)

    async def add_request(self, prompt: str | list[int], params) -> RequestStream:
        """Queue a request for the engine; returns its stream once the engine accepted it.

        Raises ``ValueError`` (bad prompt or parameters, from the engine's own validation) or ``EngineClosed``.
        """
        if not self.is_running:
            raise EngineClosed("the server is shutting down" if self.dead is None else "the engine loop stopped")
        stream = RequestStream()
        accepted: concurrent.futures.Future = concurrent.futures.Future()
        self._active.add(stream)
        self._inbox.put(("add", stream, prompt, params, accepted))
        try:
            stream.request_id = await asyncio.wrap_future(accepted)
        except BaseException as error:
            self._active.discard(stream)
            stream.finished = True
            if isinstance(error, asyncio.CancelledError):  # the client left while the engine was accepting it
                accepted.add_done_callback(self._abort_if_accepted)
            raise
        return stream

    def _abort_if_accepted(self, accepted: concurrent.futures.Future) -> None:
        if not accepted.cancelled() and accepted.exception() is None:
            self._inbox.put(("abort", accepted.result()))

    def abort(self, stream: RequestStream) -> None:
        """Stop a request now (client gone, stop string found); its K/V is freed. Safe to call twice."""
        self._active.discard(stream)
        if not stream.finished and stream.request_id is not None:
            stream.finished = True
            self._inbox.put(("abort", stream.request_id))

    async def shutdown(self, grace_s: float = 0.0) -> None:
        """Stop accepting; let in-flight requests finish for up to ``grace_s``; abort the rest; stop the thread."""
        self._accepting = False
        deadline = asyncio.get_running_loop().time() + grace_s
        while self._active and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.02)
        if self._thread is not None:
            self._inbox.put(("stop",))
            await asyncio.to_thread(self._thread.join)

    def _deliver(self, items: list[tuple[RequestStream, object]]) -> None:
        """Runs on the event loop: put each output (or exception) into its request's queue."""
        for stream, item in items:
            if isinstance(item, BaseException) or item.finish_reason is not None:
                self._active.discard(stream)
            stream.queue.put_nowait(item)

    # ------------------------------------------------------------------ engine-thread side

    def _run(self) -> None:
        try:
            while True:
                # Block for a command only when the engine has nothing to do; otherwise just drain.
                if not self._handle_commands(block=not self.engine.has_unfinished()):
                    break
                if self.engine.has_unfinished():
                    self._step()
        except BaseException as error:  # a bug in the loop itself: fail everyone, stop accepting
            logger.error("engine loop crashed:\n%s", traceback.format_exc())
            self.dead = error
            self._fail(list(self._streams), EngineError(f"the engine loop crashed: {error!r}"))
            while True:  # refuse requests that raced with the crash until shutdown, so no handler waits forever
                command = self._inbox.get()
                if command[0] == "stop":
                    break
                if command[0] == "add" and command[4].set_running_or_notify_cancel():
                    command[4].set_exception(EngineClosed("the engine loop stopped"))

    def _handle_commands(self, block: bool) -> bool:
        """Apply queued commands; returns False on "stop"."""
        while True:
            try:
                command = self._inbox.get() if block else self._inbox.get_nowait()
            except queue.Empty:
                return True
            block = False
            if command[0] == "add":
                _, stream, prompt, params, accepted = command
                if not accepted.set_running_or_notify_cancel():
                    continue  # cancelled before the engine saw it: the client is gone
                try:
                    request_id = self.engine.add_request(prompt, params)
                except Exception as error:  # ValueError: bad input, answered with a 400
                    accepted.set_exception(error)
                    continue
                self._streams[request_id] = stream
                accepted.set_result(request_id)
            elif command[0] == "abort":
                if self._streams.pop(command[1], None) is not None:
                    self.engine.abort(command[1])
            elif command[0] == "stop":
                for request_id in list(self._streams):  # shutdown(): whatever is left is aborted
                    self.engine.abort(request_id)
                self._fail(list(self._streams), EngineClosed("the server shut down before this request finished"))
                self._publish_state()
                return False
            self._publish_state()

    def _step(self) -> None:
        try:
            outputs = self.engine.step()
        except Exception as error:
            logger.error("engine step failed:\n%s", traceback.format_exc())
            self._fail_running(error)
            return
        items = []
        for output in outputs:
            stream = self._streams.get(output.request_id)
            if stream is None:
                continue  # not ours (added to the engine directly) or aborted meanwhile
            items.append((stream, output))
            if output.finish_reason is not None:
                del self._streams[output.request_id]
        if items:
            self._loop.call_soon_threadsafe(self._deliver, items)
        self._publish_state()

    def _fail_running(self, error: Exception) -> None:
        """A step raised: the requests it was running are lost. Abort them (freeing K/V) and tell their clients."""
        touched = abort_touched_requests(self.engine, self._streams)
        self._fail(touched, EngineError(f"the engine failed while running this request: {error!r}"))
        self._publish_state()

    def _fail(self, request_ids: list[str], error: Exception) -> None:
        items = [(self._streams.pop(request_id), error) for request_id in request_ids if request_id in self._streams]
        if items and self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._deliver, items)

    def _publish_state(self) -> None:
        self.state = EngineState.read(self.engine)  # one reference swap: readers on the event loop see old or new
