"""m10's engine: m09's, with decode steps replayed from CUDA graphs and fewer kernels in every step.

At start, after loading, the engine packs q/k/v and gate/up into one weight each (``packed_layers.py``) and,
on a CUDA GPU with the Triton backend, captures one decode graph per batch size of the ladder
(``graph_runner.py``), printing the capture time and the memory the graphs hold. Then every step:

* **decode-only** (every scheduled sequence feeds one token and samples): the step's inputs are copied into
  the static buffers and the smallest graph that fits is replayed; the only host synchronisation is reading
  back the sampled token ids;
* **anything else** (prompt chunks, a batch larger than the ladder, ``enforce_eager``, no GPU): m09's eager
  step, unchanged.

Because m09's server takes its engine from the milestone it is started for, ``python -m milestones.m10_cuda_graphs
serve`` serves this engine with no server code of its own.
"""

from __future__ import annotations

import logging

from dataclasses import dataclass

import torch

from milestones.m05_paged_blocks.engine import HostBatch
from milestones.m06_prefix_cache.engine import PrefixCacheStats
from milestones.m09_server import LLMEngine as ServerEngine

from .config import EngineConfig
from .graph_runner import CUDAGraphRunner, batch_size_ladder
from .packed_layers import pack_projections

logger = logging.getLogger(__name__)


@dataclass
class GraphStats(PrefixCacheStats):
    """* ``graph_steps`` / ``eager_steps``: steps replayed from a CUDA graph / launched from Python.
    * ``cuda_graph_capture_s`` / ``cuda_graph_memory_bytes`` / ``cuda_graph_batch_sizes``: what capturing cost."""

    graph_steps: int = 0
    eager_steps: int = 0
    cuda_graph_capture_s: float = 0.0
    cuda_graph_memory_bytes: int = 0
    cuda_graph_batch_sizes: tuple[int, ...] = ()


class LLMEngine(ServerEngine):
    milestone = "m10_cuda_graphs"
    graph_runner_class = CUDAGraphRunner
    config: EngineConfig
    stats: GraphStats

    def __init__(self, config: EngineConfig | None = None) -> None:
        self.graph_runner: CUDAGraphRunner | None = None
        super().__init__(config if config is not None else EngineConfig())
        self.prepare_model()
        if self.can_use_cuda_graphs():
            self.graph_runner = self.build_graph_runner(capture=True)
            logger.info(self.describe_cuda_graphs())
        self.stats = self.new_stats()

    def prepare_model(self) -> None:
        """Change the loaded model's layers before any graph records them: here, pack the projections."""
        pack_projections(self.model)

    def can_use_cuda_graphs(self) -> bool:
        return (not self.config.enforce_eager and self.device.type == "cuda"
                and self.attention_backend == "triton")

    def build_graph_runner(self, capture: bool = True) -> CUDAGraphRunner:
        """The runner this config asks for: graphs for the ladder of batch sizes up to ``max_cuda_graph_batch_size``
        (default ``max_num_seqs``), block tables wide enough for a sequence of ``max_model_len`` tokens.

        ``capture=False`` builds the same static buffers without recording anything: the CPU tests step through
        them (with the kernels in Triton's interpreter), so this setup is checked without a GPU."""
        max_batch = self.config.max_cuda_graph_batch_size or self.config.max_num_seqs
        max_blocks_per_seq = -(-self.max_model_len // self.config.block_size)  # ceil: a last, partial block
        return self.graph_runner_class(self.model_for_graphs(), self.kv_pool, batch_size_ladder(max_batch),
                                       max_blocks_per_seq, self.max_model_len, self.device, capture=capture)

    def model_for_graphs(self):
        """The model the decode graphs record (here the engine's own; m12 records a fused one)."""
        return self.model

    def describe_cuda_graphs(self) -> str:
        runner = self.graph_runner
        if runner is None:
            return "CUDA graphs: off (" + ("enforce_eager" if self.config.enforce_eager else
                                            f"need a CUDA GPU and the Triton backend; have {self.device}, "
                                            f"{self.attention_backend}") + "): every step runs eagerly"
        return (f"CUDA graphs: {len(runner.ladder)} decode graphs for batch sizes {runner.ladder[0]}.."
                f"{runner.ladder[-1]}, captured in {runner.capture_seconds:.2f} s, holding "
                f"{runner.memory_bytes / 2**20:,.0f} MiB")

    def new_stats(self) -> GraphStats:
        stats = GraphStats()
        runner = getattr(self, "graph_runner", None)
        if runner is not None:
            stats.cuda_graph_capture_s, stats.cuda_graph_memory_bytes = runner.capture_seconds, runner.memory_bytes
            stats.cuda_graph_batch_sizes = tuple(runner.ladder)
        return stats

    def is_graph_step(self, host: HostBatch) -> bool:
        """Decode-only (one token per sequence, and every sequence samples) and within the ladder."""
        return (self.graph_runner is not None and len(host.query_lens) <= self.graph_runner.ladder[-1]
                and len(host.sampling) == len(host.input_ids) == len(host.query_lens))

    def forward(self, host: HostBatch) -> torch.Tensor | None:
        if not self.is_graph_step(host):
            self.stats.eager_steps += 1
            return super().forward(host)
        self.stats.graph_steps += 1
        return self.replay_graph(host)  # every sequence samples: the logits are the whole step's, in order

    def replay_graph(self, host: HostBatch) -> torch.Tensor:
        return self.graph_runner.replay(host.input_ids, host.positions, host.slot_mapping, host.context_lens,
                                        self.block_table_array(host.block_tables))
