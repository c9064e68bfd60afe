"""m12's engine: the host plans step N+1 while the GPU runs step N.

Until m11 every step was a turn each: the host schedules and packs a step, launches it, then **waits** for the
sampled ids (``.tolist()``) before it can append them, check stops and plan the next step; meanwhile the GPU
idles. With CUDA graphs a decode step is a few milliseconds of GPU work, and the host's per-request Python
(scheduling, packing, outputs) is of the same order, so the two taking turns costs up to half the time::

    m11:   host  [plan N][launch N]            [read N][plan N+1][launch N+1]            [read N+1] ...
           GPU                     [  step N  ]                               [ step N+1 ]
    m12:   host  [plan N][launch N][plan N+1][launch N+1][read N][plan N+2][launch N+2][read N+1] ...
           GPU                     [  step N  ][ step N+1 ][ step N+2 ] ...

``engine_step`` therefore does, in this order:

1. **schedule and launch step N+1** (``launch``) — before step N's ids are known. A sequence that sampled in
   step N has a *pending* token (``sequence.py``); step N+1 feeds it, and its input id is gathered on the GPU
   from step N's sampled ids (no trip through the host). The new step's sampled ids stay on the GPU too; a
   copy to pinned host memory is queued behind them (``in_flight.py``).
2. **read step N's ids** (``resolve``) — the GPU has step N+1 queued, so it keeps working while the host
   appends each token (stop checks, ``max_tokens``), registers newly known blocks in the prefix cache, and
   builds the outputs. The outputs of a step are returned one step late.

Exactness: a sequence that finishes on step N's token (EOS, a stop token) was already planned into step N+1;
that slot's token is discarded, and its blocks are freed after step N+1 was queued (the GPU runs the steps in
order, so no later step can see them reused too early). ``max_tokens`` is known ahead: a sequence whose last
token is launched is not planned again. ``async_scheduling=False`` gives m11's engine.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from milestones.m05_paged_blocks.engine import HostBatch
from milestones.m05_paged_blocks.scheduler import SchedulerOutput
from milestones.m10_cuda_graphs.engine import GraphStats
from milestones.m11_engine_core import LLMEngine as EngineCoreEngine

from .attention import TritonMixedAttention
from .config import EngineConfig
from .full_graphs import FullGraphRunner
from .fused_layers import FusedCausalLM
from .graph_runner import OverlappedGraphRunner
from .in_flight import InFlightStep, PinnedIds
from .piecewise import PiecewiseGraphRunner
from .scheduler import Scheduler
from .sequence import AsyncSequence


PIECEWISE_MAX_TOKENS = 8192


@dataclass
class OverlapStats(GraphStats):
    """m10's counters plus ``piecewise_steps``: steps with prompt chunks replayed (in pieces, or whole)."""

    piecewise_steps: int = 0


class LLMEngine(EngineCoreEngine):
    milestone = "m12_async_scheduling"
    request_class = AsyncSequence
    scheduler_class = Scheduler
    graph_runner_class = OverlappedGraphRunner
    config: EngineConfig

    def __init__(self, config: EngineConfig | None = None) -> None:
        self.in_flight: InFlightStep | None = None
        self.piecewise: PiecewiseGraphRunner | None = None
        super().__init__(config if config is not None else EngineConfig())
        self.pinned_ids = PinnedIds(self.config.max_num_seqs, self.device)
        if self.graph_runner is not None and self.config.cudagraph_mode != "full_decode_only":
            self.piecewise = self.build_piecewise_runner(capture=True)
        self.stats = self.new_stats()

    def build_piecewise_runner(self, capture: bool = True) -> PiecewiseGraphRunner:
        """The runner of the steps with prompt chunks, for every step of up to ``max_num_batched_tokens`` tokens
        (at most 8,192: larger steps are rare and long enough to pay their own launches): whole graphs
        (``cudagraph_mode="full"`` with Triton attention) or pieces."""
        max_tokens = min(self.config.max_num_batched_tokens or PIECEWISE_MAX_TOKENS, PIECEWISE_MAX_TOKENS)
        model = self.graph_runner.model.model
        if self.config.cudagraph_mode == "full" and self.attention_backend == "triton":
            max_blocks_per_seq = -(-self.max_model_len // self.config.block_size)
            return FullGraphRunner(model, self.kv_pool, max_tokens, self.config.max_num_seqs, max_blocks_per_seq,
                                   self.device, capture=capture)
        return PiecewiseGraphRunner(model, max_tokens, self.device, capture=capture)

    def describe_cuda_graphs(self) -> str:
        pieces = self.piecewise
        whole = isinstance(pieces, FullGraphRunner)
        extra = "" if pieces is None else (f"; mixed steps in {len(pieces.graphs)} {'whole' if whole else 'piece'} "
                                           f"graphs ({len(pieces.buckets)} token counts up to "
                                           f"{pieces.buckets[-1]:,}), captured in {pieces.capture_seconds:.2f} s")
        return super().describe_cuda_graphs() + extra

    def replays_mixed_steps(self) -> bool:
        """Whether steps with prompt chunks go to ``self.piecewise`` (m13: not before an FP8 cache has scales)."""
        return self.piecewise is not None

    def forward(self, host: HostBatch) -> torch.Tensor | None:
        if (not self.replays_mixed_steps() or self.is_graph_step(host)
                or self.piecewise.bucket(len(host.input_ids)) is None):
            return super().forward(host)
        self.stats.piecewise_steps += 1
        batch = self.device_batch(host)  # the ids (pending ones filled on the device) and the metadata
        if isinstance(self.piecewise, FullGraphRunner):
            logits = self.piecewise.run(batch.input_ids, batch.metadata, batch.sample_rows, self.model.compute_logits)
            return logits if host.sampling else None
        logits = self.piecewise.run(batch.input_ids, batch.metadata.positions, self.make_attention(batch.metadata),
                                    batch.sample_rows, self.model.compute_logits)
        return logits if host.sampling else None

    def make_attention(self, metadata):
        """Triton: a mixed step's prompt chunks in one prefill launch per layer, beside m08's decode kernel."""
        if self.attention_backend == "triton":
            return TritonMixedAttention(self.kv_pool, metadata)
        return super().make_attention(metadata)

    def model_for_graphs(self):
        """The decode graphs record the fused layers (fewer, larger kernels: the GPU's share of a step). Eager
        steps keep m10's layers: outside a graph every Triton launch costs the host more than a torch op."""
        return FusedCausalLM(self.model)

    def new_stats(self) -> OverlapStats:
        stats = super().new_stats()
        return OverlapStats(**{f: getattr(stats, f) for f in stats.__dataclass_fields__})

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished() or self.in_flight is not None

    # ------------------------------------------------------------------ one step, overlapped

    def engine_step(self) -> list[AsyncSequence]:
        if not self.config.async_scheduling:
            return super().engine_step()
        launched = None
        if self.scheduler.has_unfinished():
            out = self.scheduler.schedule()
            if not out.is_empty:
                self.stats.num_preemptions += len(out.preempted)
                launched = self.launch(out)
                self.record_step(out)
            elif self.in_flight is None:  # nothing runnable and nothing to wait for: a bug
                raise RuntimeError("scheduler produced an empty step while requests are waiting")
        previous, self.in_flight = self.in_flight, launched
        sampled = self.resolve(previous) if previous is not None else []
        for request in self.scheduler.remove_finished():
            self.sampler.release(request)
        if not self.scheduler.has_unfinished():
            self.in_flight = None  # everyone in it has finished (a stop token): its tokens would be discarded
        return sampled

    def launch(self, out: SchedulerOutput) -> InFlightStep | None:
        """Queue step N+1 on the GPU: inputs (pending ids gathered from step N's samples), forward, sampling."""
        host = self.host_batch(out)
        self.pending_rows = self.rows_fed_from_the_device(out, host)
        logits = self.forward(host)
        self.advance(out)
        if not host.sampling:
            return None
        sampled = self.sampler.sample_ids(logits, host.sampling)
        for seq in host.sampling:
            seq.num_pending += 1
        return InFlightStep(host.sampling, sampled, *self.pinned_ids.copy(sampled))

    def resolve(self, step: InFlightStep) -> list[AsyncSequence]:
        """Read step N's token ids (step N+1 is queued behind it) and append them; returns who got a token."""
        token_ids, now = step.token_ids(), time.perf_counter()
        got = []
        for seq, token_id in zip(step.seqs, token_ids):
            if seq.is_finished:  # aborted, or ended by its previous token: this slot ran after the end
                continue
            seq.resolve(token_id, now)
            got.append(seq)
            if not seq.is_finished and seq.num_computed_tokens:  # (0: preempted meanwhile, it holds no blocks)
                self.scheduler.cache_blocks_up_to(seq, seq.num_computed_tokens)  # its ids are known now
        return got

    # ------------------------------------------------------------------ input ids that never left the GPU

    def rows_fed_from_the_device(self, out: SchedulerOutput, host: HostBatch) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(rows of the packed batch, rows of step N's samples) for every token fed while still pending."""
        rows, sources, row = [], [], 0
        for item in out.scheduled:
            row += item.num_new_tokens
            if item.seq.num_pending:  # its last fed token is the one step N sampled (a pending token is last)
                rows.append(row - 1)
                sources.append(self.in_flight.rows[item.seq.request_id])
        if not rows:
            return None
        pairs = torch.tensor([rows, sources], dtype=torch.long).to(self.device, non_blocking=True)
        return pairs[0], pairs[1]

    def fill_pending_ids(self, input_ids: torch.Tensor) -> None:
        """Overwrite the placeholder ids with step N's samples, on the device."""
        if self.pending_rows is not None:
            rows, sources = self.pending_rows
            input_ids.index_copy_(0, rows, self.in_flight.sampled.index_select(0, sources))

    def device_batch(self, host: HostBatch):
        batch = super().device_batch(host)
        if self.config.async_scheduling:
            self.fill_pending_ids(batch.input_ids)
        return batch

    def replay_graph(self, host: HostBatch) -> torch.Tensor:
        runner = self.graph_runner
        size = runner.load(host.input_ids, host.positions, host.slot_mapping, host.context_lens,
                           self.block_table_array(host.block_tables))
        if self.config.async_scheduling:
            self.fill_pending_ids(runner.input_ids)
        return runner.run(size)[:len(host.input_ids)]
