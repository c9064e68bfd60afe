"""m05's engine: paged K/V, packed batches, preemption by recompute.

What changes against m04, piece by piece:

* **memory**: one ``PagedKVCache`` of ``num_blocks`` blocks sized from a budget (``kv_cache_tokens``,
  ``kv_cache_memory_bytes`` or ``gpu_memory_utilization``), handed out block by block by a ``BlockManager``;
* **scheduling**: m05's ``Scheduler`` (token budget, blocks as tokens arrive, preemption) returns a list of
  ``(sequence, new tokens)``;
* **the forward pass**: those new tokens run as ONE packed ``[T]`` batch, no padding; ``AttentionMetadata``
  (slot mapping, block tables, context lengths, query start offsets) is built once per step and read by every
  layer; logits are computed only for the sequences that sample this step.

The step API (``add_request`` / ``step`` / ``has_unfinished`` / ``abort``), ``generate`` on top of it, the
sampler and the outputs are m04's, unchanged.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import numpy as np
import torch

from milestones.m01_naive_loop.attention import sdpa
from milestones.m04_continuous_batching.engine import LLMEngine as ContinuousBatchingEngine

from .block_manager import BlockManager
from .config import EngineConfig
from .paged_attention import AttentionMetadata, PagedAttention, PagedKVCache
from .scheduler import Scheduler, SchedulerOutput
from .sequence import Sequence
from .stats import PagedEngineStats

logger = logging.getLogger(__name__)


def format_bytes(num_bytes: float) -> str:
    """``209190912`` -> ``"199.5 MiB"``: the largest binary unit that leaves a number >= 1."""
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if num_bytes >= size:
            return f"{num_bytes / size:,.1f} {unit}"
    return f"{num_bytes:,.0f} bytes"


@dataclass
class HostBatch:
    """One step's packed inputs on the host: built from the scheduler's output, before any device copy."""

    input_ids: list[int] = field(default_factory=list)  # [T]
    positions: list[int] = field(default_factory=list)  # [T]
    slot_mapping: list[int] = field(default_factory=list)  # [T]
    query_lens: list[int] = field(default_factory=list)  # [B]
    context_lens: list[int] = field(default_factory=list)  # [B]
    block_tables: list[list[int]] = field(default_factory=list)  # [B] ragged
    sample_rows: list[int] = field(default_factory=list)  # rows of [T] whose logits are sampled
    sampling: list[Sequence] = field(default_factory=list)  # their sequences, in the same order


@dataclass
class StepBatch:
    """One step's packed inputs on the device: token ids ``[T]``, the attention metadata, rows to sample."""

    input_ids: torch.Tensor
    metadata: AttentionMetadata
    sample_rows: torch.Tensor
    sampling: list[Sequence]


class LLMEngine(ContinuousBatchingEngine):
    milestone = "m05_paged_blocks"
    request_class = Sequence
    config: EngineConfig
    kv_pool: PagedKVCache
    scheduler: Scheduler
    stats: PagedEngineStats

    def __init__(self, config: EngineConfig | None = None) -> None:
        super().__init__(config if config is not None else EngineConfig())
        logger.info(self.describe_kv_cache())

    # ------------------------------------------------------------------ memory and scheduler (m04's seams)

    def make_kv_pool(self) -> PagedKVCache:
        return PagedKVCache.for_model(self.model_config, self.resolve_num_blocks(), self.config.block_size,
                                      self.dtype, self.device)

    def make_scheduler(self) -> Scheduler:
        self.block_manager = self.make_block_manager()
        watermark = int(self.kv_pool.num_blocks * self.config.kv_watermark)
        return Scheduler(self.config.max_num_seqs, self.config.max_num_batched_tokens, self.block_manager, watermark)

    def make_block_manager(self) -> BlockManager:
        return BlockManager(self.kv_pool.num_blocks, self.config.block_size)

    def new_stats(self) -> PagedEngineStats:
        return PagedEngineStats()

    def resolve_num_blocks(self) -> int:
        """How many blocks the K/V budget buys (at least one, or a clear error)."""
        config, block_size = self.config, self.config.block_size
        block_bytes = self.kv_bytes_per_token * block_size
        if config.kv_cache_tokens is not None:
            budget, source = config.kv_cache_tokens * self.kv_bytes_per_token, f"kv_cache_tokens={config.kv_cache_tokens}"
        elif config.kv_cache_memory_bytes is not None:
            budget, source = config.kv_cache_memory_bytes, f"kv_cache_memory_bytes={config.kv_cache_memory_bytes}"
        elif config.gpu_memory_utilization is not None:
            budget = self.memory_left_for_kv(config.gpu_memory_utilization)
            source = f"gpu_memory_utilization={config.gpu_memory_utilization}"
        else:
            budget, source = self.default_kv_capacity() * self.kv_bytes_per_token, "the default budget"
        num_blocks = budget // block_bytes
        if num_blocks < 1:
            raise ValueError(f"{source} leaves {format_bytes(max(budget, 0))} for K/V, less than one block of "
                             f"{block_size} tokens ({format_bytes(block_bytes)})")
        return int(num_blocks)

    def memory_left_for_kv(self, fraction: float) -> int:
        """vLLM's rule: the engine may use ``fraction`` of the GPU; K/V gets what the weights and the peak of a
        profiled forward pass at ``max_num_batched_tokens`` leave of it."""
        if self.device.type != "cuda":
            raise ValueError("gpu_memory_utilization needs a CUDA device; on a CPU size the cache with "
                             "kv_cache_memory_bytes or kv_cache_tokens")
        torch.cuda.synchronize(self.device)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(self.device)
        baseline = torch.cuda.memory_allocated(self.device)
        tokens = min(self.config.max_num_batched_tokens, self.max_model_len)
        with torch.inference_mode():
            ids = torch.zeros(tokens, dtype=torch.long, device=self.device)
            hidden = self.model(ids, torch.arange(tokens, device=self.device),
                                lambda _, q, k, v: sdpa(q[None], k[None], v[None], is_causal=True)[0])
            self.model.compute_logits(hidden[:min(tokens, self.config.max_num_seqs)])
        torch.cuda.synchronize(self.device)
        activations = torch.cuda.max_memory_allocated(self.device) - baseline
        total = torch.cuda.get_device_properties(self.device).total_memory
        return int(total * fraction) - torch.cuda.memory_allocated(self.device) - activations

    def describe_kv_cache(self) -> str:
        pool = self.kv_pool
        size = pool.num_blocks * pool.block_size * self.kv_bytes_per_token
        return (f"K/V cache: {pool.num_blocks:,} blocks x {pool.block_size} tokens = "
                f"{pool.num_blocks * pool.block_size:,} token slots ({format_bytes(size)}, "
                f"{str(pool.k.dtype).removeprefix('torch.')})")

    # ------------------------------------------------------------------ one step

    def engine_step(self) -> list[Sequence]:
        if not self.scheduler.has_unfinished():
            return []
        out = self.scheduler.schedule()
        if out.is_empty:
            raise RuntimeError("scheduler produced an empty step while requests are waiting")  # invariant
        self.stats.num_preemptions += len(out.preempted)
        sampled = self.execute(out)
        self.record_step(out)
        for request in self.scheduler.remove_finished():
            self.sampler.release(request)
        return sampled

    def execute(self, out: SchedulerOutput) -> list[Sequence]:
        """Run the step's packed batch through the model and sample where a sequence reached its end."""
        host = self.host_batch(out)
        logits = self.forward(host)
        self.advance(out)
        if host.sampling:
            self.sample_logits_and_append(logits, host.sampling)
        return host.sampling

    def forward(self, host: HostBatch) -> torch.Tensor | None:
        """The model over the step's packed batch: logits of the rows that sample (None if no row does)."""
        batch = self.device_batch(host)
        hidden = self.model(batch.input_ids, batch.metadata.positions, self.make_attention(batch.metadata))
        return self.model.compute_logits(hidden[batch.sample_rows]) if host.sampling else None

    def advance(self, out: SchedulerOutput) -> None:
        """The step's tokens are computed: count them, and move each sequence's ``num_computed_tokens`` on."""
        self.count_tokens(out)
        for item in out.scheduled:
            item.seq.num_computed_tokens += item.num_new_tokens

    def make_attention(self, metadata: AttentionMetadata):
        return PagedAttention(self.kv_pool, metadata)

    def host_batch(self, out: SchedulerOutput) -> HostBatch:
        """The step's packed inputs as host lists: token ids, positions, slots from the block tables."""
        block_size, host = self.config.block_size, HostBatch()
        for item in out.scheduled:
            seq, start = item.seq, item.seq.num_computed_tokens
            end = start + item.num_new_tokens
            table = self.block_manager.block_tables[seq.request_id]
            host.input_ids += seq.token_ids_between(start, end)
            host.positions += range(start, end)
            host.slot_mapping += [table[p // block_size] * block_size + p % block_size for p in range(start, end)]
            host.query_lens.append(item.num_new_tokens)
            host.context_lens.append(end)
            host.block_tables.append(table)
            if end == seq.num_tokens:  # the step reaches the newest token: sample the next one
                host.sample_rows.append(len(host.input_ids) - 1)
                host.sampling.append(seq)
        return host

    def prepare_batch(self, out: SchedulerOutput) -> StepBatch:
        """The step's packed inputs on the device, built once per step."""
        return self.device_batch(self.host_batch(out))

    def device_batch(self, host: HostBatch) -> StepBatch:
        """Host lists -> device tensors: one copy each."""
        metadata = AttentionMetadata.build(host.query_lens, host.context_lens, host.positions, host.slot_mapping,
                                           self.block_table_array(host.block_tables), self.config.block_size,
                                           self.device)
        ids = torch.tensor(host.input_ids, dtype=torch.long).to(self.device, non_blocking=True)
        rows = torch.tensor(host.sample_rows, dtype=torch.long).to(self.device, non_blocking=True)
        return StepBatch(ids, metadata, rows, host.sampling)

    @staticmethod
    def block_table_array(tables: list[list[int]]) -> np.ndarray:
        """Ragged block tables -> one ``[B, max_blocks]`` int32 array, padded with block 0 (never read)."""
        array = np.zeros((len(tables), max(len(t) for t in tables)), dtype=np.int32)
        for row, table in enumerate(tables):
            array[row, :len(table)] = table
        return array

    def count_tokens(self, out: SchedulerOutput) -> None:
        self.stats.steps += 1
        for item in out.scheduled:
            seq, start = item.seq, item.seq.num_computed_tokens
            end = start + item.num_new_tokens
            self.stats.tokens_computed += item.num_new_tokens
            self.stats.prompt_tokens_computed += max(0, min(end, seq.num_prompt_tokens) - start)
            self.stats.recomputed_tokens += max(0, min(end, seq.max_computed_tokens) - start)
            seq.max_computed_tokens = max(seq.max_computed_tokens, end)

    def record_step(self, out: SchedulerOutput) -> None:
        """Blocks held, K/V reserved (whole blocks) against used (tokens cached), requests in the batch."""
        manager = self.block_manager
        self.stats.record_kv(manager.num_used_blocks * manager.block_size * self.kv_bytes_per_token,
                             self.kv_slots_holding_tokens() * self.kv_bytes_per_token)
        self.stats.record_blocks(manager.num_used_blocks, manager.num_blocks, manager.block_size)
        self.stats.running_per_step.append(len(self.scheduler.running))
        self.stats.waiting_per_step.append(len(self.scheduler.waiting))

    def kv_slots_holding_tokens(self) -> int:
        """Slots whose K/V is computed: each running request's computed tokens (m06 counts a shared block once)."""
        return sum(seq.num_computed_tokens for seq in self.scheduler.running)

    # ------------------------------------------------------------------ retired: m04's padded prefill and decode

    def region_starts(self, requests: list[Sequence]) -> torch.Tensor:
        raise NotImplementedError("m05 runs one packed batch per step through block tables: see execute()")

    def prefill(self, requests: list[Sequence]) -> None:
        raise NotImplementedError("m05 runs one packed batch per step through block tables: see execute()")

    def decode(self, requests: list[Sequence]) -> None:
        raise NotImplementedError("m05 runs one packed batch per step through block tables: see execute()")

    def record_kv_usage(self) -> None:
        raise NotImplementedError("m05 runs one packed batch per step through block tables: see record_step()")
