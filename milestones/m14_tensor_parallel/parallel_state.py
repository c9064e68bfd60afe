"""The tensor-parallel group: which rank this process is, the two ``torch.distributed`` groups it talks through,
and how ranks join and leave. (vLLM keeps the same facts in ``vllm/distributed/parallel_state.py``.)

* The **device group** is torch's default process group: NCCL on GPUs, gloo on CPUs. It carries the two
  all-reduces of every layer (``RowParallelLinear``) and the broadcast of a step's filled input ids. Its timeout
  is ``distributed_timeout_s`` on every rank: a collective that waits longer raises (gloo honours it per send
  and receive; NCCL's watchdog per collective).
* The **CPU group** (gloo, host memory) carries each step's host inputs and the calls (``step_broadcast.py``).
  On rank 0 its timeout is the same. On a worker it is unbounded: a worker waits there *between* steps, for as
  long as the engine has nothing to run (an idle server is not a hang); it ends when rank 0 ends, through its
  parent's sentinel.

Joining: rank 0 opens a ``TCPStore`` on port 0 (the OS picks a free one) *before* it starts the workers, and
passes them the port. Every rank first loads its share of the weights on its own, then joins where the ranks
must first agree (the number of K/V blocks): so rank 0's loading overlaps the workers' start. A worker marks
itself ready in the store and calls ``init_process_group``; rank 0 waits for the marks while watching the
workers (one that dies while loading is reported at once, with its error, instead of after the timeout), then
calls ``init_process_group`` itself.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

STORE_HOST = "127.0.0.1"  # every rank runs on this machine
IDLE = timedelta(days=365)  # a worker's wait for the next step: no limit worth the name
READY_POLL_S = 0.05


def rank_devices(device: torch.device, world_size: int) -> list[torch.device]:
    """Each rank's device: all on the CPU, or ``cuda:i``, ``cuda:i+1``, ... from the engine's ``cuda:i``."""
    if device.type != "cuda":
        return [device] * world_size
    first = 0 if device.index is None else device.index
    available = torch.cuda.device_count()
    if first + world_size > available:
        raise ValueError(f"tensor_parallel_size={world_size} needs GPUs cuda:{first}..cuda:{first + world_size - 1}, "
                         f"but torch sees {available} GPU{'s' if available != 1 else ''}")
    return [torch.device("cuda", first + rank) for rank in range(world_size)]


def open_store(world_size: int, timeout_s: float) -> dist.TCPStore:
    """Rank 0's rendezvous point, on a port the OS picks."""
    return dist.TCPStore(STORE_HOST, 0, world_size, is_master=True, timeout=timedelta(seconds=timeout_s),
                         wait_for_workers=False)


def wait_for_workers(store: dist.TCPStore, world_size: int, timeout_s: float, dead_worker) -> None:
    """Rank 0: until every worker has marked itself ready in the store; ``dead_worker()`` describes a worker that
    died meanwhile (None if none did), which ends the wait with that description."""
    keys = [f"ready/{rank}" for rank in range(1, world_size)]
    deadline = time.monotonic() + timeout_s
    while not store.check(keys):
        died = dead_worker()
        if died is not None:
            raise RuntimeError(f"tensor-parallel worker {died} while starting")
        if time.monotonic() > deadline:
            raise TimeoutError(f"the tensor-parallel workers did not start within {timeout_s:.0f} s "
                               "(distributed_timeout_s)")
        time.sleep(READY_POLL_S)


@dataclass
class TensorParallelGroup:
    """This process's place in the group: its rank, its device, the store the ranks meet at; after ``join``, its
    CPU group (the device group is torch's default one)."""

    rank: int
    world_size: int
    device: torch.device
    store: dist.Store
    timeout_s: float
    cpu_group: dist.ProcessGroup | None = None

    @property
    def backend(self) -> str:
        return "nccl" if self.device.type == "cuda" else "gloo"

    @classmethod
    def for_worker(cls, rank: int, world_size: int, device: torch.device, store_port: int,
                   timeout_s: float) -> TensorParallelGroup:
        """A worker's group, connected to rank 0's store (not joined yet); its GPU becomes the current device."""
        if device.type == "cuda":
            torch.cuda.set_device(device)  # NCCL, Triton and the graphs all use the current device
        store = dist.TCPStore(STORE_HOST, store_port, world_size, is_master=False,
                              timeout=timedelta(seconds=timeout_s))
        return cls(rank, world_size, device, store, timeout_s)

    def join(self, dead_worker=None) -> None:
        """``init_process_group`` through the store, then the CPU group (idempotent). A worker marks itself ready
        first; rank 0 waits for every mark, ``dead_worker()`` telling it of a worker that died meanwhile."""
        if self.cpu_group is not None:
            return
        if self.rank > 0:
            self.store.set(f"ready/{self.rank}", "1")
        else:
            wait_for_workers(self.store, self.world_size, self.timeout_s, dead_worker or (lambda: None))
        timeout = timedelta(seconds=self.timeout_s)
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        dist.init_process_group(self.backend, store=self.store, rank=self.rank, world_size=self.world_size,
                                timeout=timeout, device_id=self.device if self.device.type == "cuda" else None)
        self.cpu_group = dist.new_group(backend="gloo", timeout=timeout if self.rank == 0 else IDLE)

    def min_over_ranks(self, value: int) -> int:
        """The smallest of every rank's ``value`` (e.g. the K/V blocks each rank's memory allows)."""
        tensor = torch.tensor([value], dtype=torch.int64)
        dist.all_reduce(tensor, op=dist.ReduceOp.MIN, group=self.cpu_group)
        return int(tensor.item())

    def broadcast_from_rank0(self, tensor: torch.Tensor) -> None:
        """Rank 0's ``tensor`` into every rank's ``tensor``, device to device (the device group)."""
        dist.broadcast(tensor, src=0)

    @staticmethod
    def abort() -> None:
        """Make every pending collective of this process fail now (NCCL: a kernel waiting for a dead peer would
        otherwise wait until the watchdog's timeout). Private in torch, hence the guard."""
        abort = getattr(dist.distributed_c10d, "_abort_process_group", None)
        if abort is not None and dist.is_initialized():
            abort()

    @staticmethod
    def destroy() -> None:
        if dist.is_initialized():
            dist.destroy_process_group()  # the default group and every group made after it
