"""Rank 0's handle on the worker processes: start them, notice when one dies, stop them.

* **Started** with multiprocessing's ``spawn`` (a fresh interpreter: a fork would copy rank 0's threads and any
  CUDA state), as daemons, each given the engine class (pickled by reference), its config (its device, the
  resolved checkpoint directory), its rank, the store's port, and the write end of a pipe for its last words.
* **Watched**: a thread waits on the workers' sentinels (a sentinel is ready when its process has ended, however
  it ended). A death is remembered with the worker's exit code and its one-line error, if it sent one. On NCCL
  the thread also aborts the process's collectives: a kernel waiting for a dead peer would otherwise sit until
  the watchdog's timeout. (On gloo a dead peer closes its sockets, and a pending collective fails at once.)
* **Stopped** by ``stop``: each worker gets ``timeout_s`` to exit on its own (after rank 0's ``SHUTDOWN``),
  then SIGTERM, then SIGKILL. The same happens when this object is garbage-collected or the interpreter exits
  (``weakref.finalize``), and a worker ends by itself when rank 0's process is gone: nothing is left behind.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.connection
import signal
import threading
import weakref
from collections.abc import Callable

import torch

from .parallel_state import TensorParallelGroup
from .worker import run_worker

STOP_GRACE_S = 5.0
# A worker that dies before its first line of ours ran (it said nothing): most often a script that builds the
# engine at the top level, which every spawned process imports again.
NO_LAST_WORDS = (" before saying why (see its output above; a script that builds a tensor-parallel engine must do "
                 "it under `if __name__ == \"__main__\":`, since every worker imports the script again)")


class WorkerProcesses:
    """Ranks 1..N-1 of a tensor-parallel engine, as processes."""

    def __init__(self, engine_class, configs: list, store_port: int, on_death: Callable[[], None] | None) -> None:
        spawn = multiprocessing.get_context("spawn")
        self.processes, self.pipes, self.last_words = [], [], {}
        self.stopping = threading.Event()
        for rank, config in enumerate(configs, start=1):
            reader, writer = spawn.Pipe(duplex=False)
            process = spawn.Process(target=run_worker, name=f"nanoserve-tp-rank{rank}", daemon=True,
                                    args=(engine_class, config, rank, store_port, writer, torch.get_num_threads()))
            process.start()
            writer.close()  # the worker holds the only write end: the pipe closes when it exits
            self.processes.append(process)
            self.pipes.append(reader)
        # Neither the finalizer nor the watcher may hold this object (or the engine): an engine nobody holds must
        # be collectable, and its collection is what stops its workers and leaves the group.
        self._finalizer = weakref.finalize(self, _stop, list(self.processes), 0.0, True)
        sentinels = [process.sentinel for process in self.processes]
        threading.Thread(target=_watch, args=(sentinels, self.stopping, on_death), name="tp-worker-watcher",
                         daemon=True).start()

    @property
    def pids(self) -> list[int]:
        return [process.pid for process in self.processes]

    def dead_worker(self, wait_s: float = 0.0) -> str | None:
        """The first worker that has died, described in one line (None if all live). ``wait_s``: how long to give
        a worker that is dying (its sockets already closed) to be gone."""
        if wait_s:
            multiprocessing.connection.wait([p.sentinel for p in self.processes], timeout=wait_s)
        for rank, (process, pipe) in enumerate(zip(self.processes, self.pipes), start=1):
            if process.is_alive():
                continue
            if rank not in self.last_words and pipe.poll():
                try:
                    self.last_words[rank] = pipe.recv()
                except EOFError:
                    pass
            if rank in self.last_words:
                said = f": {self.last_words[rank]}"
            else:  # killed by a signal: that is the story; exited on its own without a word: our hint
                said = NO_LAST_WORDS if process.exitcode and process.exitcode > 0 else ""
            return f"rank {rank} (pid {process.pid}) {describe_exit(process.exitcode)}{said}"
        return None

    def stop(self, timeout_s: float = STOP_GRACE_S) -> None:
        """Wait up to ``timeout_s`` for the workers to exit, then end them (idempotent)."""
        self.stopping.set()
        self._finalizer.detach()
        _stop(self.processes, timeout_s, False)
        for pipe in self.pipes:
            pipe.close()


def describe_exit(exitcode: int | None) -> str:
    if exitcode is not None and exitcode < 0:
        try:
            return f"was killed by {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"was killed by signal {-exitcode}"
    return f"exited with code {exitcode}"


def _watch(sentinels: list[int], stopping: threading.Event, on_death: Callable[[], None] | None) -> None:
    """Until every worker has ended: call ``on_death`` for each that ends while nobody is stopping them."""
    waiting = list(sentinels)
    while waiting:
        for sentinel in multiprocessing.connection.wait(waiting):
            waiting.remove(sentinel)
            if not stopping.is_set() and on_death is not None:
                on_death()


def _stop(processes: list, timeout_s: float, leave_group: bool) -> None:
    """Give the workers ``timeout_s`` to exit, then SIGTERM, then SIGKILL; ``leave_group``: also destroy this
    process's group (the finalizer's case: the engine that owned it is gone)."""
    for process in processes:
        process.join(timeout_s)
    for how in ("terminate", "kill"):
        for process in processes:
            if process.is_alive():
                getattr(process, how)()
        for process in processes:
            process.join(STOP_GRACE_S)
    if leave_group:
        TensorParallelGroup.destroy()
