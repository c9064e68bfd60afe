"""Run a server inside this process: uvicorn in a background thread, on a free loopback port.

The demo, the tests and the online benchmark all need a real server (real sockets, real HTTP) that they
can start, drive and stop from Python::

    with ServerThread(build_app(engine)) as server:
        httpx.get(server.url + "/health")

Stopping is graceful: uvicorn stops accepting connections, waits up to ``graceful_shutdown_s`` for the
requests in flight to finish, cancels the rest (whose handlers abort them in the engine, freeing their
K/V), then runs the app's shutdown, which stops the engine thread.
"""

from __future__ import annotations

import socket
import threading
import time

import uvicorn


class ServerThread:
    def __init__(self, app, host: str = "127.0.0.1", port: int = 0, graceful_shutdown_s: float = 5.0,
                 log_level: str = "warning") -> None:
        self.app = app
        self.socket = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
        self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.socket.bind((host, port))  # port 0: the OS picks a free one, and we know it before serving
        self.host, self.port = host, self.socket.getsockname()[1]
        config = uvicorn.Config(app, log_level=log_level, timeout_graceful_shutdown=graceful_shutdown_s,
                                lifespan="on")
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
