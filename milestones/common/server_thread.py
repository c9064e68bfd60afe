"""Run a server inside this process: uvicorn in a background thread, on a free loopback port.

The demo, the tests and the online benchmark all need a real server (real sockets, real HTTP) that they
can start, drive and stop from Python::

    with ServerThread(build_app(engine)) as server:
        httpx.get(server.url + "/health")

Stopping is graceful: uvicorn stops accepting connections, waits up to ``graceful_shutdown_s`` for the
requests in flight to finish, cancels the rest (whose handlers abort them in the engine, freeing their
K/V), then runs the app's shutdown, which stops the engine thread.

Both this thread and ``serve`` run uvicorn with ``IdleConnectionTimeout``: a connection that sends nothing for
``timeout_keep_alive`` seconds is closed, whether it has served requests before or never sent a byte.
"""

from __future__ import annotations

import socket
import threading
import time

import uvicorn
from uvicorn.protocols.http.auto import AutoHTTPProtocol

from .http_guards import DEFAULT_TIMEOUT_KEEP_ALIVE_S


class IdleConnectionTimeout(AutoHTTPProtocol):
    """uvicorn's HTTP protocol, with its keep-alive timer armed when a connection opens, not only between requests.

    uvicorn closes a kept-alive connection idle for ``timeout_keep_alive`` seconds but waits forever on one that
    never sends its first byte: 200 sockets opened and left idle would hold 200 file descriptors for good. The
    first byte received cancels the timer (uvicorn's own ``data_received`` does), as on a kept-alive connection.
    A client that trickles a request's head byte by byte is not covered (uvicorn caps a head at 16 KiB): a
    server on the open internet belongs behind a reverse proxy.
    """

    def connection_made(self, transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self.timeout_keep_alive_task = self.loop.call_later(self.timeout_keep_alive, self.timeout_keep_alive_handler)


class ServerThread:
    def __init__(self, app, host: str = "127.0.0.1", port: int = 0, graceful_shutdown_s: float = 5.0,
                 log_level: str = "warning", timeout_keep_alive: float = DEFAULT_TIMEOUT_KEEP_ALIVE_S) -> None:
        self.app = app
        # IPPROTO_TCP, not the default 0: asyncio sets TCP_NODELAY only on connections whose socket says TCP.
        # Without it, Nagle's algorithm holds a response's second write (an SSE chunk after the headers) until the
        # client's delayed ACK, ~40 ms on Linux: every /health and every first token ~40 ms late.
        self.socket = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM,
                                    socket.IPPROTO_TCP)
        self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.socket.bind((host, port))  # port 0: the OS picks a free one, and we know it before serving
        self.host, self.port = host, self.socket.getsockname()[1]
        config = uvicorn.Config(app, log_level=log_level, timeout_graceful_shutdown=graceful_shutdown_s,
                                lifespan="on", http=IdleConnectionTimeout, timeout_keep_alive=timeout_keep_alive)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.socket]},
                                       name="uvicorn", daemon=True)

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def start(self, timeout_s: float = 60.0) -> ServerThread:
        self.thread.start()
        deadline = time.monotonic() + timeout_s
        while not self.server.started:
            if not self.thread.is_alive():
                raise RuntimeError("the server thread exited during startup (see the log above)")
            if time.monotonic() > deadline:
                raise TimeoutError(f"the server did not start within {timeout_s:.0f} s")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join()
        self.socket.close()

    def __enter__(self) -> ServerThread:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
