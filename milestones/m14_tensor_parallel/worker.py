"""A worker process: ranks 1..N-1. It builds the same engine class as rank 0, on its own device with its own
share of the weights and of every K/V block, then runs forward passes for as long as rank 0 sends steps::

    build the engine (same class, same config, its device; it joins the group once loaded) -> loop:
        receive a message from rank 0        (waits as long as the engine is idle)
        STEP      -> engine.forward(the step's HostBatch)      the same code path as rank 0: eager, or a replay
        CALL      -> run the function on this engine, send the result to rank 0
        SHUTDOWN  -> leave the group, exit

Building the *same* engine is what keeps the ranks in lockstep without a protocol of their own: the same config
gives the same K/V pool, the same graph ladder captured in the same order, the same choice between eager and
replay for every step, so the collectives inside the model always meet their partners. The worker's scheduler,
block manager and sampler are built but never used: rank 0 alone decides and samples.

The worker ignores Ctrl-C (rank 0 decides when to stop), exits on SIGTERM, and ends when rank 0's process ends,
however it ended (a thread waits on the parent's sentinel, as m11's engine core does). A failure is sent to rank
0 as one line through a pipe before the worker exits, so rank 0's error can say what happened.
"""

from __future__ import annotations

import os
import signal
import sys
import traceback
from dataclasses import dataclass

import torch

from milestones.m11_engine_core.core import exit_with_parent

from .parallel_state import TensorParallelGroup
from .step_broadcast import CALL, SHUTDOWN, gather_results, receive


@dataclass
class CallFailed:
    """A call that raised on a worker: what rank 0 reports."""

    message: str


def one_line(error: BaseException) -> str:
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return f"{type(error).__name__}: {lines[0]}" if lines else type(error).__name__


def run_worker(engine_class, config, rank: int, store_port: int, error_pipe, num_threads: int) -> None:
    """The worker process's entry point (spawned by rank 0's ``WorkerProcesses``)."""
    torch.set_num_threads(num_threads)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    exit_with_parent()
    try:
        group = TensorParallelGroup.for_worker(rank, config.tensor_parallel_size, config.resolve_device(), store_port,
                                               config.distributed_timeout_s)
        engine = engine_class(config, parallel=group)
        serve_steps(engine, group)
    except BaseException as error:  # tell rank 0 why, in one line, and go
        traceback.print_exc()
        try:
            error_pipe.send(one_line(error))
        finally:
            os._exit(1)
    TensorParallelGroup.destroy()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # nothing left to save: skip the interpreter's slow teardown of torch


@torch.inference_mode()
def serve_steps(engine, group: TensorParallelGroup) -> None:
    """Run rank 0's messages until it says shutdown."""
    while True:
        message = receive(group.cpu_group)
        if message.kind == SHUTDOWN:
            return
        if message.kind == CALL:
            try:
                if message.unreadable is not None:
                    raise RuntimeError(f"the call could not be unpickled here ({message.unreadable}): pass a function "
                                       "defined in a module, not in a notebook")
                result = message.function(engine, *message.args)
            except Exception as error:
                result = CallFailed(one_line(error))
            gather_results(group.cpu_group, result, group.world_size, group.rank)
        else:
            engine.run_worker_step(message.host, message.ids_on_device)
