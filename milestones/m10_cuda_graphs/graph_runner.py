"""Decode steps replayed from CUDA graphs: the launches of a whole forward pass recorded once, replayed in one call.

An eager decode step of Qwen3-0.6B launches about 540 kernels from Python with m10's packed layers (700-760
with m01's), one after another, and each launch costs the CPU 14-40 microseconds on the H200 hosts measured
(Python, PyTorch's dispatcher or Triton's launcher, then the driver), so the step takes 10-28 ms whatever it
computes (docs/m10-cuda-graphs.md counts the kernels and divides the measured steps by them). A **CUDA graph**
records the launches of one forward pass (kernels, arguments, memory addresses) and replays all of them with a
single call. Three consequences shape this file:

* **Static buffers.** A replay reuses the recorded addresses, so the inputs must be *in* tensors that never
  move: token ids, positions, slot mapping, block tables and context lengths each live in one buffer sized for
  the largest batch, and every step copies its values into them before replaying. The outputs (the logits)
  appear in the same recorded output tensor each time.
* **One graph per batch size.** Shapes are frozen too, so graphs are captured at start for a ladder of batch
  sizes (1, 2, 4, 8, then steps of 8 and 16 up to ``max_num_seqs``); a step of ``n`` sequences replays the
  smallest graph of at least ``n`` rows. Padding rows write nowhere (slot -1: the store kernel skips it) and
  read nothing (context length 0: the decode kernel returns zeros); their logits are ignored.
* **Any context length in one graph.** The block tables buffer is as wide as ``max_model_len`` needs, and the
  decode kernel reads each sequence's length from ``context_lens`` on the device and skips everything past it,
  so one captured graph serves every mix of lengths, and blocks freed and handed to other requests are simply
  new numbers in the table.

Only decode steps are replayed: a step that carries prompt chunks has a different number of tokens every time,
so it runs eagerly (m08's path).
"""

from __future__ import annotations

import time

import numpy as np
import torch

from milestones.m05_paged_blocks.paged_attention import PagedKVCache


def batch_size_ladder(max_batch_size: int) -> list[int]:
    """1, 2, 4, 8, then steps of 8 up to 64 and of 16 beyond, ending at (or just above) ``max_batch_size``."""
    sizes, size = [], 1
    while size < max_batch_size:
        sizes.append(size)
        size = size * 2 if size < 8 else size + (8 if size < 64 else 16)
    return sizes + [size]


def padded_batch_size(ladder: list[int], num_seqs: int) -> int | None:
    """The smallest captured size that holds ``num_seqs`` rows, or None if none does (the step runs eagerly)."""
    for size in ladder:
        if size >= num_seqs:
            return size
    return None


class GraphDecodeAttention:
    """The attention callable recorded into the graphs: store the new K/V, then the paged decode kernel,
    reading everything from the static buffers."""

    def __init__(self, cache: PagedKVCache, slot_mapping: torch.Tensor, block_tables: torch.Tensor,
                 context_lens: torch.Tensor, max_context_len: int) -> None:
        self.cache, self.slot_mapping = cache, slot_mapping
        self.block_tables, self.context_lens, self.max_context_len = block_tables, context_lens, max_context_len

    def __call__(self, layer_idx: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        from milestones.m08_triton_kernel.store_kv_kernel import store_kv

        scales = self.cache.kernel_scales(layer_idx)  # none, or an FP8 cache's per-layer scales (m13)
        store_kv(k, v, self.cache.k[layer_idx], self.cache.v[layer_idx], self.slot_mapping, **scales)
        return self.decode_stored(layer_idx, q)

    def decode_stored(self, layer_idx: int, q: torch.Tensor) -> torch.Tensor:
        """The decode kernel once the step's K/V are in the cache (a seam: m13's RoPE can write them itself)."""
        return self.decode(layer_idx, q, **self.cache.kernel_scales(layer_idx))

    def decode(self, layer_idx: int, q: torch.Tensor, **options) -> torch.Tensor:
        """The paged decode kernel over the stored K/V; ``options`` go to it (a seam: m13 passes its combine)."""
        from milestones.m08_triton_kernel.paged_decode_kernel import paged_decode_attention

        k_blocks, v_blocks = self.cache.block_view(layer_idx)
        return paged_decode_attention(q, k_blocks, v_blocks, self.block_tables, self.context_lens,
                                      q.shape[-1] ** -0.5, max_context_len=self.max_context_len, **options)


class CUDAGraphRunner:
    """Captures one decode graph per batch size of ``ladder`` and replays them.

    With ``capture=False`` nothing is recorded and ``run`` launches the same forward pass eagerly over the same
    static buffers: the CPU tests use that to check the buffers, the padding and the block tables without a GPU,
    and the demo to time eager against replayed steps on identical inputs.
    """

    def __init__(self, model, cache: PagedKVCache, ladder: list[int], max_blocks_per_seq: int,
                 max_context_len: int, device: torch.device, capture: bool = True) -> None:
        self.model, self.cache, self.ladder, self.device = model, cache, ladder, device
        self.max_context_len = max_context_len
        rows = ladder[-1]
        # The static buffers every graph reads (each graph reads its first ``size`` rows).
        self.input_ids = torch.zeros(rows, dtype=torch.long, device=device)
        self.positions = torch.zeros(rows, dtype=torch.long, device=device)
        self.slot_mapping = torch.full((rows,), -1, dtype=torch.long, device=device)
        self.context_lens = torch.zeros(rows, dtype=torch.int32, device=device)
        self.block_tables = torch.zeros((rows, max_blocks_per_seq), dtype=torch.int32, device=device)
        # Host copies a step fills before one asynchronous copy each moves them to the device (pinned on a GPU, so
        # the copies do not wait for the host; the step's one synchronisation, reading the sampled ids, comes after).
        pin = device.type == "cuda"
        self.host_tokens = torch.zeros((3, rows), dtype=torch.long, pin_memory=pin)  # ids, positions, slots
        self.host_context_lens = torch.zeros(rows, dtype=torch.int32, pin_memory=pin)
        self.host_block_tables = torch.zeros((rows, max_blocks_per_seq), dtype=torch.int32, pin_memory=pin)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.logits: dict[int, torch.Tensor] = {}
        self.capture_seconds, self.memory_bytes = self.capture() if capture else (0.0, 0)

    def attention(self, size: int) -> GraphDecodeAttention:
        """The attention callable over the first ``size`` rows of the static buffers."""
        return GraphDecodeAttention(self.cache, self.slot_mapping[:size], self.block_tables[:size],
                                    self.context_lens[:size], self.max_context_len)

    def forward(self, size: int) -> torch.Tensor:
        """One decode forward pass over the first ``size`` rows of the static buffers, launched eagerly."""
        hidden = self.model(self.input_ids[:size], self.positions[:size], self.attention(size))
        return self.model.compute_logits(hidden)

    def capture(self) -> tuple[float, int]:
        """Record every graph, largest first (the later, smaller ones reuse its memory pool)."""
        torch.cuda.synchronize(self.device)
        torch.cuda.empty_cache()  # capturing empties the allocator's cache too: measure from an empty one
        began, reserved = time.perf_counter(), torch.cuda.memory_reserved(self.device)
        pool = None
        for size in reversed(self.ladder):
            self.forward(size)  # warm-up: compiles the Triton kernels for this shape, allocates
            torch.cuda.synchronize(self.device)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self.logits[size] = self.forward(size)
            pool = graph.pool() if pool is None else pool
            self.graphs[size] = graph
        torch.cuda.synchronize(self.device)
        return time.perf_counter() - began, torch.cuda.memory_reserved(self.device) - reserved

    def run(self, size: int) -> torch.Tensor:
        """The logits of the first ``size`` rows: the graph replayed, or (nothing captured) launched eagerly."""
        if size in self.graphs:
            self.graphs[size].replay()
            return self.logits[size]
        return self.forward(size)

    def load(self, input_ids: list[int], positions: list[int], slot_mapping: list[int], context_lens: list[int],
             block_tables: np.ndarray) -> int:
        """Copy one decode step's inputs into the static buffers; returns the padded batch size."""
        n = len(input_ids)
        size = padded_batch_size(self.ladder, n)
        tokens = self.host_tokens.numpy()
        tokens[0, :n], tokens[1, :n], tokens[2, :n] = input_ids, positions, slot_mapping
        tokens[2, n:size] = -1  # padding rows: written nowhere ...
        context = self.host_context_lens.numpy()
        context[:n], context[n:size] = context_lens, 0  # ... and reading nothing
        width = block_tables.shape[1]
        self.host_block_tables.numpy()[:n, :width] = block_tables
        self.input_ids[:size].copy_(self.host_tokens[0, :size], non_blocking=True)
        self.positions[:size].copy_(self.host_tokens[1, :size], non_blocking=True)
        self.slot_mapping[:size].copy_(self.host_tokens[2, :size], non_blocking=True)
        self.context_lens[:size].copy_(self.host_context_lens[:size], non_blocking=True)
        self.block_tables[:n, :width].copy_(self.host_block_tables[:n, :width], non_blocking=True)
        return size

    def replay(self, input_ids: list[int], positions: list[int], slot_mapping: list[int], context_lens: list[int],
               block_tables: np.ndarray) -> torch.Tensor:
        """One decode step: load its inputs, run the graph of its padded size, return ``[n, vocab]`` logits."""
        size = self.load(input_ids, positions, slot_mapping, context_lens, block_tables)
        return self.run(size)[:len(input_ids)]
