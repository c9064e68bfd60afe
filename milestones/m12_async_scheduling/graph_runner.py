"""m10's graph runner, safe to load while the previous step may still be copying its inputs.

m10 writes each step's inputs into pinned host buffers and queues asynchronous copies from them. In m10 the
previous step was always finished by then. Overlapped, the host may write step N+1's inputs while step N's
copies are still queued behind step N-1 on the GPU: the copy would read step N+1's values. So each load first
waits until the previous load's copies have run (an event recorded right after them; by then usually long done).
"""

from __future__ import annotations

import torch

from milestones.m10_cuda_graphs.graph_runner import CUDAGraphRunner


class OverlappedGraphRunner(CUDAGraphRunner):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.inputs_copied = torch.cuda.Event() if self.device.type == "cuda" else None

    def load(self, *args, **kwargs) -> int:
        if self.inputs_copied is not None:
            self.inputs_copied.synchronize()  # the staging buffers are free again
        size = super().load(*args, **kwargs)
        if self.inputs_copied is not None:
            self.inputs_copied.record()
        return size
