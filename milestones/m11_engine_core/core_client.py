"""The front end's handle on the engine core process: start it, talk to it over two sockets, stop it.

    front end (this process)                                   engine core (child process)
    input socket   PUSH  ── bind ipc://<tmp>/input  ◄── connect ──  PULL
    output socket  PULL  ── bind ipc://<tmp>/output ◄── connect ──  PUSH

Why pyzmq and not ``multiprocessing.Queue``: a ``Queue`` pickles every object and moves it through a pipe with
a feeder thread in the sending process — a thread that takes the sender's GIL, the very lock the split is meant
to free — and it offers no way to wait on it inside an asyncio event loop. A ZMQ socket sends whole messages
(no framing of our own), queues them in a C library's I/O thread, and exposes a file descriptor asyncio can wait
on (``zmq.asyncio``). The messages are msgpack bytes made by ``msgspec`` (``messages.py``): typed, checked on
decoding, and an order of magnitude cheaper than pickle. vLLM's V1 front end and engine core talk the same way.

The sockets are ``ipc://`` (Unix domain) sockets: nothing listens on a network port. On Linux they live in the
abstract namespace (``ipc://@name``): no file on disk that a crash could leave behind, or a clean-up of ``/tmp`` could
remove under a live server; elsewhere they are files in a private temporary folder, removed when the core stops. The core is a ``spawn``ed process (a fresh interpreter: a fork would copy this
process's threads and any CUDA state), started with the engine's class and config; it answers ``CoreReady``
with the limits the front end validates against, or ``CoreFailed`` with one line to show the user.
"""

from __future__ import annotations

import multiprocessing
import os
import secrets
import shutil
import sys
import tempfile
import time
import weakref

import msgspec
import torch
import zmq

from .core import born_holding_ctrl_c, run_engine_core
from .messages import CoreFailed, CoreLimits, CoreReady, FromCore, ToCore

STARTUP_POLL_S = 0.1


class EngineCoreProcess:
    """Starts the engine core (blocking until it is ready) and owns the process and the two sockets."""

    def __init__(self, engine_class, config, startup_timeout_s: float = 3600.0) -> None:
        self.folder, input_address, output_address = socket_addresses()
        self.context = zmq.Context()
        try:
            self.input = self.context.socket(zmq.PUSH)
            self.input.setsockopt(zmq.SNDHWM, 0)
            self.input.setsockopt(zmq.LINGER, 0)
            self.output = self.context.socket(zmq.PULL)
            self.output.setsockopt(zmq.LINGER, 0)
            self.input.bind(input_address)
            self.output.bind(output_address)
            spawn = multiprocessing.get_context("spawn")
            self.process = spawn.Process(target=run_engine_core, name="nanoserve-engine-core",
                                         args=(engine_class, config, input_address, output_address,
                                               torch.get_num_threads()))
            with born_holding_ctrl_c():  # the core unblocks it once it ignores it: Ctrl-C is the front end's
                self.process.start()
        except BaseException:
            # Closed here, not left to the garbage collector: a context collected in a cycle with its open
            # sockets (an exception's traceback makes one) waits in zmq_ctx_term for them forever.
            self.context.destroy(linger=0)
            if self.folder is not None:
                shutil.rmtree(self.folder, ignore_errors=True)
            raise
        # Whatever happens to this object (an exception below, a forgotten shutdown), the core goes with it.
        self._finalizer = weakref.finalize(self, _stop, self.process, self.context, self.folder, 0.0)
        self.encoder = msgspec.msgpack.Encoder()
        self.decoder = msgspec.msgpack.Decoder(FromCore)
        try:
            ready = self._wait_until_ready(startup_timeout_s)
        except BaseException:
            self.stop()
            raise
        self.limits: CoreLimits = ready.limits
        self.describe: list[str] = ready.describe
        self.initial_state = ready.state

    def _wait_until_ready(self, timeout_s: float) -> CoreReady:
        deadline = time.monotonic() + timeout_s
        while not self.output.poll(STARTUP_POLL_S * 1000):
            if not self.process.is_alive():
                raise RuntimeError(f"the engine core process exited while starting (exit code "
                                   f"{self.process.exitcode}); see its log above")
            if time.monotonic() > deadline:
                raise TimeoutError(f"the engine core did not start within {timeout_s:.0f} s")
        message = self.decoder.decode(self.output.recv())
        if isinstance(message, CoreFailed):
            raise ValueError(message.message)
        if not isinstance(message, CoreReady):
            raise RuntimeError(f"the engine core's first message was {type(message).__name__}, not CoreReady")
        return message

    def send(self, message: ToCore) -> None:
        """Hand ``message`` to the core (queued by ZMQ; never blocks: the socket's queue is unbounded)."""
        self.input.send(self.encoder.encode(message), flags=zmq.NOBLOCK, copy=False)

    def decode(self, frame: bytes) -> FromCore:
        return self.decoder.decode(frame)

    @property
    def is_alive(self) -> bool:
        return self.process.is_alive()

    def stop(self, timeout_s: float = 5.0) -> None:
        """Wait up to ``timeout_s`` for the core to exit by itself (after ``Shutdown``), then end it by force;
        close the sockets and remove their folder. Safe to call twice."""
        if self._finalizer.detach() is not None:
            _stop(self.process, self.context, self.folder, timeout_s)


def socket_addresses() -> tuple[str | None, str, str]:
    """(a folder to remove afterwards or None, the input address, the output address)."""
    if sys.platform.startswith("linux"):
        name = f"nanoserve-core-{os.getpid()}-{secrets.token_hex(6)}"
        return None, f"ipc://@{name}-input", f"ipc://@{name}-output"
    folder = tempfile.mkdtemp(prefix="nanoserve-core-")
    return folder, f"ipc://{folder}/input", f"ipc://{folder}/output"


def _stop(process: multiprocessing.Process, context: zmq.Context, folder: str | None, timeout_s: float) -> None:
    process.join(timeout_s)
    if process.is_alive():
        process.terminate()  # SIGTERM: the core exits at once
        process.join(5.0)
    if process.is_alive():
        process.kill()
        process.join()
    context.destroy(linger=0)
    if folder is not None:
        shutil.rmtree(folder, ignore_errors=True)
