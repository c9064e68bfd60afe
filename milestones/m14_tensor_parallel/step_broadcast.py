"""How each step's inputs reach the workers: rank 0 packs the step's host lists into one int64 array and
broadcasts it over a gloo group in CPU memory; every worker unpacks the same ``HostBatch`` and runs the same
forward pass.

    header   [kind, T, B, S, W, ids_on_device]                        6 int64s: a fixed size a worker can wait for
    payload  input_ids[T] positions[T] slot_mapping[T]                 T tokens in the step's packed batch
             query_lens[B] context_lens[B] sample_rows[S]              B sequences, S of them sample
             block_tables[B x W]                                       padded as m05's ``block_table_array`` pads

Why host memory and gloo, not the GPU group: the workers need these values *on the host* (m05 builds shapes from
them, m10 fills pinned buffers from them), so a broadcast over NCCL would cost a copy to the device on rank 0 and
one back on each worker. vLLM broadcasts its scheduler output through a shared-memory ring instead
(``MessageQueue``); the gloo broadcast here is two small TCP messages over the loopback per step.

``ids_on_device``: with async scheduling, the input ids of decodes are not on the host at all: rank 0 gathers
them on its device from the previous step's samples, and the payload holds placeholders in their rows. The flag
tells the workers that the *filled* ids follow, broadcast device to device right after rank 0 filled them.

Two more kinds of message: ``CALL`` (a function every rank runs on its engine, results gathered on rank 0:
vLLM's ``collective_rpc``) and ``SHUTDOWN``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist

from milestones.m05_paged_blocks.engine import HostBatch

STEP, CALL, SHUTDOWN = 1, 2, 3
HEADER_SIZE = 6


@dataclass
class Message:
    """What a worker received: a step (``host``, ``ids_on_device``), a call (``function``, ``args``), or shutdown."""

    kind: int
    host: HostBatch | None = None
    ids_on_device: bool = False
    function: object = None
    args: tuple = ()
    unreadable: str | None = None  # a call this process could not unpickle (its function is not importable here)


def pack_step(host: HostBatch, block_tables: np.ndarray, ids_on_device: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(header, payload) of one step; ``block_tables`` is the step's ``[B, W]`` array."""
    header = torch.tensor([STEP, len(host.input_ids), len(host.query_lens), len(host.sample_rows),
                           block_tables.shape[1], int(ids_on_device)], dtype=torch.int64)
    payload = np.concatenate([np.asarray(values, dtype=np.int64) for values in (
        host.input_ids, host.positions, host.slot_mapping, host.query_lens, host.context_lens, host.sample_rows)]
        + [block_tables.astype(np.int64).reshape(-1)])
    return header, torch.from_numpy(payload)


def unpack_step(header: list[int], payload: np.ndarray) -> HostBatch:
    """The ``HostBatch`` rank 0 packed. Its ``sampling`` holds a None per sampling row: a worker samples nothing,
    but the shared code reads how many rows sample."""
    _, tokens, seqs, samples, width, _ = header
    cuts = np.cumsum([tokens, tokens, tokens, seqs, seqs, samples])
    ids, positions, slots, query_lens, context_lens, sample_rows, tables = np.split(payload, cuts)
    return HostBatch(input_ids=ids.tolist(), positions=positions.tolist(), slot_mapping=slots.tolist(),
                     query_lens=query_lens.tolist(), context_lens=context_lens.tolist(),
                     block_tables=tables.reshape(seqs, width).tolist(), sample_rows=sample_rows.tolist(),
                     sampling=[None] * samples)


def send_step(group: dist.ProcessGroup, host: HostBatch, block_tables: np.ndarray, ids_on_device: bool) -> None:
    """Rank 0: broadcast one step's inputs."""
    header, payload = pack_step(host, block_tables, ids_on_device)
    dist.broadcast(header, src=0, group=group)
    dist.broadcast(payload, src=0, group=group)


def send_call(group: dist.ProcessGroup, function, args: tuple) -> None:
    """Rank 0: ask every worker to run ``function(engine, *args)`` (pickled by reference: a module-level function)."""
    dist.broadcast(torch.tensor([CALL, 0, 0, 0, 0, 0], dtype=torch.int64), src=0, group=group)
    dist.broadcast_object_list([function, args], src=0, group=group)


def send_shutdown(group: dist.ProcessGroup) -> None:
    dist.broadcast(torch.tensor([SHUTDOWN, 0, 0, 0, 0, 0], dtype=torch.int64), src=0, group=group)


def gather_results(group: dist.ProcessGroup, result: object, world_size: int, rank: int) -> list[object] | None:
    """Every rank's result of a call, in rank order, on rank 0 (None elsewhere)."""
    results = [None] * world_size if rank == 0 else None
    dist.gather_object(result, results, dst=0, group=group)
    return results


def receive(group: dist.ProcessGroup) -> Message:
    """A worker: wait for rank 0's next message (as long as it takes: the group's timeout is long on workers)."""
    header = torch.zeros(HEADER_SIZE, dtype=torch.int64)
    dist.broadcast(header, src=0, group=group)
    values = header.tolist()
    kind = values[0]
    if kind == STEP:
        tokens, seqs, samples, width = values[1:5]
        payload = torch.empty(3 * tokens + 2 * seqs + samples + seqs * width, dtype=torch.int64)
        dist.broadcast(payload, src=0, group=group)
        return Message(STEP, unpack_step(values, payload.numpy()), ids_on_device=bool(values[5]))
    if kind == CALL:
        call = [None, None]
        try:
            dist.broadcast_object_list(call, src=0, group=group)
        except (AttributeError, ImportError) as error:  # received, but e.g. a function of a notebook's __main__
            return Message(CALL, unreadable=f"{type(error).__name__}: {error}")
        return Message(CALL, function=call[0], args=tuple(call[1]))
    return Message(SHUTDOWN)
