"""The engine core: a process that owns the GPU and does nothing but schedule, run and sample, in a loop.

Why a process of its own: in m09/m10 the engine thread and the HTTP server share one Python interpreter, and
so one lock (the GIL). Every microsecond the event loop spends detokenizing, formatting a JSON chunk or
writing to a socket is a microsecond the engine thread cannot launch the next step, and the GPU waits. At
thousands of tokens per second that per-token Python is the ceiling. Here the server's work runs in the front
end's process and the engine's in this one; each has a GIL of its own.

The loop (``EngineCore.run``), one iteration per engine step::

    while True:
        take every message waiting on the input socket       AddRequest / AbortRequests / Shutdown
            (nothing to run? block until one arrives)
        outputs = engine.step_outputs()                       one scheduler decision, one forward pass
        send ONE StepOutputs message                          every request's new token, finishes, state
                                                              (no step to run: just the state)

Failures, as in m09's engine thread: an exception inside a step fails only the requests that step was
running (they come back with ``finish_reason="error"``) and the loop goes on; anything else (a bug in the
loop, a lost socket) sends ``CoreFailed`` and exits, and the front end fails every request in flight.

The core dies with its parent: a thread waits on the parent's sentinel and ends the process when the front
end is gone (even if it was killed with SIGKILL and could not say goodbye). Ctrl-C in a terminal reaches every
process of the group; the core ignores it and lets the front end shut it down in order.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import multiprocessing.connection
import os
import shutil
import signal
import threading
import traceback

import msgspec
import torch
import zmq

from milestones.m09_server.async_engine import EngineState, abort_touched_requests, describe_engine

from .messages import (AbortRequests, AddRequest, CoreFailed, CoreReady, FromCore, Shutdown, StepOutput,
                       StepOutputs, ToCore)

logger = logging.getLogger("nanoserve.core")


class EngineCore:
    """Runs ``engine`` for the front end: requests from ``inputs`` (a PULL socket), one message per step to
    ``outputs`` (a PUSH socket)."""

    def __init__(self, engine, inputs: zmq.Socket, outputs: zmq.Socket) -> None:
        self.engine, self.inputs, self.outputs = engine, inputs, outputs
        self.decoder = msgspec.msgpack.Decoder(ToCore)
        self.encoder = msgspec.msgpack.Encoder()
        self.request_ids: set[str] = set()  # requests in the engine that the front end waits for

    def run(self) -> None:
        while self.handle_inputs(block=not self.engine.has_unfinished()):
            # One message per iteration: a step's outputs, or (when the inputs left nothing to run, e.g. the
            # last request was aborted) none, so the front end's view of the engine's state stays current.
            outputs = self.step() if self.engine.has_unfinished() else []
            self.send(StepOutputs(outputs, EngineState.read(self.engine)))

    def handle_inputs(self, block: bool) -> bool:
        """Apply every waiting message (waiting for one first if ``block``); False once told to shut down."""
        while block or self.inputs.poll(0):
            block = False
            message = self.decoder.decode(self.inputs.recv())
            if isinstance(message, AddRequest):
                self.engine.add_core_request(message)
                self.request_ids.add(message.request_id)
            elif isinstance(message, AbortRequests):
                for request_id in message.request_ids:
                    if request_id in self.request_ids:
                        self.request_ids.discard(request_id)
                        self.engine.abort(request_id)
            elif isinstance(message, Shutdown):
                for request_id in list(self.request_ids):
                    self.engine.abort(request_id)
                return False
        return True

    def step(self) -> list[StepOutput]:
        """One engine step. If it raises, the requests it was running are aborted and reported as errors."""
        try:
            outputs = self.engine.step_outputs()
        except Exception as error:
            logger.error("engine step failed:\n%s", traceback.format_exc())
            failed = abort_touched_requests(self.engine, self.request_ids)
            outputs = [StepOutput(request_id, [], "error", error=f"the engine failed while running this "
                                  f"request: {error!r}") for request_id in failed]
        for output in outputs:
            if output.finish_reason is not None:
                self.request_ids.discard(output.request_id)
        return outputs

    def send(self, message: FromCore) -> None:
        self.outputs.send(self.encoder.encode(message), copy=False)


def run_engine_core(engine_class, config, input_address: str, output_address: str, num_threads: int) -> None:
    """The core process's entry point: build the engine, say ``CoreReady`` (or ``CoreFailed``), serve.

    ``num_threads``: torch's CPU threads, as the process that started the core was told to use (a demo's
    ``--threads``): a CPU engine that spreads over more cores than it has to itself waits on the slowest."""
    torch.set_num_threads(num_threads)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the front end decides when to stop
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})  # blocked since birth (born_holding_ctrl_c)
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))  # the runtime kills us: nothing to save
    exit_with_parent(socket_folder=None if input_address.startswith("ipc://@") else
                      input_address.removeprefix("ipc://").rsplit("/", 1)[0])
    context = zmq.Context()
    inputs = context.socket(zmq.PULL)
    outputs = context.socket(zmq.PUSH)
    outputs.setsockopt(zmq.SNDHWM, 0)  # never block a step on a slow front end: queue instead
    outputs.setsockopt(zmq.LINGER, 2000)  # on exit, give the last messages two seconds to leave
    inputs.connect(input_address)
    outputs.connect(output_address)
    core = None
    try:
        try:
            engine = engine_class(config)
        except Exception as error:  # a bad config, a model that will not load: one line for the user
            outputs.send(msgspec.msgpack.encode(CoreFailed(_one_line(error))))
            return
        core = EngineCore(engine, inputs, outputs)
        core.send(CoreReady(engine.limits(), [*describe_engine(engine), f"engine core: process {os.getpid()}"],
                            EngineState.read(engine)))
        core.run()
    except Exception as error:  # a bug in the loop itself: tell the front end, which fails every request
        logger.error("engine core crashed:\n%s", traceback.format_exc())
        outputs.send(msgspec.msgpack.encode(CoreFailed(f"the engine core crashed: {error!r}")))
    finally:
        inputs.close(linger=0)
        outputs.close()
        context.term()


@contextlib.contextmanager
def born_holding_ctrl_c():
    """Processes started inside are born with SIGINT blocked, as multiprocessing's own resource tracker is: a Ctrl-C
    while one is still importing (seconds) waits for it to say what SIGINT means to it, then unblock; otherwise
    it would die mid-import with a traceback of its own. Here a Ctrl-C waits only as long as ``start()`` takes."""
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def exit_with_parent(socket_folder: str | None = None) -> None:
    """End this process when its parent ends, however the parent ended (a thread waits on its sentinel); a parent
    killed outright (SIGKILL) could not remove the sockets' folder (where they are files), so the core does."""
    parent = multiprocessing.parent_process()
    if parent is None:
        return

    def wait_for_parent() -> None:
        multiprocessing.connection.wait([parent.sentinel])
        if socket_folder is not None:
            shutil.rmtree(socket_folder, ignore_errors=True)
        os._exit(1)

    threading.Thread(target=wait_for_parent, name="exit-with-parent", daemon=True).start()


def _one_line(error: Exception) -> str:
    text = str(error).strip().splitlines()
    return text[0] if text and isinstance(error, ValueError) else f"{type(error).__name__}: {' '.join(text)}"
