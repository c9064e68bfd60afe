"""A launched step whose sampled token ids are still on the GPU, and the staging buffers that must outlive it.

    launch(step N)    ... kernels queued; sampled ids [n] on the GPU; a copy of them to pinned host memory
                      queued behind them; an event recorded after that copy
    token_ids()       waits for that event (step N and its copy are done; step N+1 is already queued behind
                      it, so the GPU does not go idle while the host reads) and returns the ids as a list

On a CPU everything runs as it is called: the ids are simply there.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .sequence import AsyncSequence


@dataclass
class InFlightStep:
    """Step N after its launch: which sequences sample in it, and where their token ids are."""

    seqs: list[AsyncSequence]  # in the rows of ``sampled``
    sampled: torch.Tensor  # [len(seqs)] int64 on the device: step N+1 gathers its input ids from here
    host_ids: torch.Tensor  # the same ids, copied (or being copied) to the host
    copied: torch.cuda.Event | None = None  # recorded after that copy (None on a CPU)
    rows: dict[str, int] = field(default_factory=dict)  # request id -> row of ``sampled``

    def __post_init__(self) -> None:
        self.rows = {seq.request_id: row for row, seq in enumerate(self.seqs)}

    def token_ids(self) -> list[int]:
        if self.copied is not None:
            self.copied.synchronize()
        return self.host_ids.tolist()


class PinnedIds:
    """Two pinned host buffers used in turn: step N's ids are read while step N+1's are being copied."""

    def __init__(self, size: int, device: torch.device) -> None:
        pin = device.type == "cuda"
        self.buffers = [torch.empty(size, dtype=torch.long, pin_memory=pin) for _ in range(2)]
        self.turn = 0

    def copy(self, sampled: torch.Tensor) -> tuple[torch.Tensor, torch.cuda.Event | None]:
        """Queue a copy of ``sampled`` to the host; returns the host tensor and an event recorded after it."""
        if sampled.device.type != "cuda":
            return sampled, None
        self.turn ^= 1
        host = self.buffers[self.turn][:len(sampled)]
        host.copy_(sampled, non_blocking=True)
        copied = torch.cuda.Event()
        copied.record()
        return host, copied
