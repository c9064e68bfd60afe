"""m14's config: the previous milestone's plus vLLM's ``tensor_parallel_size`` and a timeout for the ranks."""

from __future__ import annotations

from dataclasses import dataclass, field

from milestones.m01_naive_loop.config import range_of
from milestones.m13_quantization import EngineConfig as PreviousConfig


@dataclass
class EngineConfig(PreviousConfig):
    """* ``tensor_parallel_size`` (vLLM's name, ``-tp`` / ``--tensor-parallel-size``): how many ranks share every
      layer. 1 (the default) is the previous milestone exactly: no worker process, no collective. N > 1 starts
      N - 1 worker processes; on a GPU rank ``r`` runs on ``cuda:(i + r)`` for ``device="cuda:i"`` (NCCL), on a
      CPU every rank runs on the CPU (gloo). N must divide the model's attention heads, K/V heads and
      intermediate size (checked when the model's shape is known, before any process starts).
    * ``distributed_timeout_s``: the longest rank 0 waits for the others in any one collective (joining the
      group, an all-reduce, a step's inputs). A rank that dies is noticed at once; one that hangs, after this.
      Workers waiting between steps for the next one wait as long as it takes (an idle server is not a hang).
    """

    tensor_parallel_size: int = 1
    distributed_timeout_s: float = field(default=300.0, metadata=range_of(above=0))
