"""Mixed steps replayed whole: one CUDA graph per token count, attention included (vLLM's ``FULL`` mode).

``piecewise.py`` records everything between the attentions and launches each layer's attention from Python,
because m05's attention was shaped by the step: groups of chunks, gathers, masks sized on the host. m12's
attention (``attention.py``) is two kernels whose launches depend on nothing but buffer sizes once the step's
metadata lives in fixed buffers, so the whole forward pass can be recorded::

    static buffers  input_ids, positions, slot_mapping [rows]        (padding rows: slot -1, stored nowhere)
                    block_tables [seqs, max_blocks], context_lens [seqs], query_start_loc [seqs + 1]
                    tile_seqs, tile_firsts [max_tiles]             (unused tiles: -1, the program returns at once)
    one graph per bucket of rows:  piece 0 | store K/V, attend | piece 1 | ... | piece L

Every sequence of the step, decodes included (a chunk of one query), is a list of tiles for the prefill kernel,
so one launch attends for all of them; the grid is the most tiles a bucket can need (``rows / BLOCK_Q`` plus one
per sequence), and the programs past the step's tiles find -1 and return. A mixed step then costs the host a
few copies into the buffers and one replay, where the pieces cost it some 150 launches.
"""

from __future__ import annotations

import time

import torch

from .paged_prefill_kernel import paged_prefill_attention, prefill_tiles, queries_per_tile
from .piecewise import PiecewiseGraphRunner


class FullGraphRunner(PiecewiseGraphRunner):
    """``PiecewiseGraphRunner``'s pieces and buffers, with each layer's attention recorded between them."""

    def __init__(self, model, cache, max_tokens: int, max_seqs: int, max_blocks_per_seq: int,
                 device: torch.device, capture: bool = True) -> None:
        self.cache, self.max_seqs = cache, max_seqs
        attn = model.layers[0].self_attn
        self.block_q = queries_per_tile(attn.num_heads, attn.num_kv_heads)
        super().__init__(model, max_tokens, device, capture=False)
        rows = self.buckets[-1]
        self.max_tiles = -(-rows // self.block_q) + max_seqs
        self.slot_mapping = torch.full((rows,), -1, dtype=torch.long, device=device)
        self.block_tables = torch.zeros((max_seqs, max_blocks_per_seq), dtype=torch.int32, device=device)
        self.context_lens = torch.zeros(max_seqs, dtype=torch.long, device=device)
        self.query_start_loc = torch.zeros(max_seqs + 1, dtype=torch.long, device=device)
        self.tiles = torch.full((2, self.max_tiles), -1, dtype=torch.int32, device=device)  # seqs, firsts
        self.capture_seconds = self.capture() if capture else 0.0

    def attend(self, layer_idx: int, rows: int) -> None:
        """Store the layer's new K/V (padding rows nowhere) and attend for every tile into ``attention_out``."""
        from milestones.m08_triton_kernel.store_kv_kernel import store_kv

        scales = self.cache.kernel_scales(layer_idx)
        store_kv(self.k[:rows], self.v[:rows], self.cache.k[layer_idx], self.cache.v[layer_idx],
                 self.slot_mapping[:rows], **scales)
        k_blocks, v_blocks = self.cache.block_view(layer_idx)
        q = self.q[:rows]
        paged_prefill_attention(q, k_blocks, v_blocks, self.attention_out[:rows].view(q.shape), self.block_tables,
                                self.context_lens, self.query_start_loc, self.tiles[0], self.tiles[1],
                                q.shape[-1] ** -0.5, **scales)

    def forward(self, rows: int) -> None:
        for index in range(len(self.model.layers) + 1):
            if index:
                self.attend(index - 1, rows)
            self.piece(index, rows)

    def capture(self) -> float:
        """One graph per bucket, largest first (the smaller ones reuse its memory pool)."""
        torch.cuda.synchronize(self.device)
        began, pool = time.perf_counter(), None
        for rows in reversed(self.buckets):
            self.forward(rows)  # warm-up: Triton compiles, the allocator sizes its blocks
            torch.cuda.synchronize(self.device)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self.forward(rows)
            pool = graph.pool() if pool is None else pool
            self.graphs[0, rows] = graph
        torch.cuda.synchronize(self.device)
        return time.perf_counter() - began

    def load(self, input_ids: torch.Tensor, metadata, rows: int) -> None:
        """The step's inputs and metadata into the buffers (device-to-device copies, queued behind the step in
        flight, which may still be reading them); the tile list is the one part built on the host."""
        tokens, seqs = len(input_ids), metadata.num_seqs
        if seqs > self.max_seqs:
            raise ValueError(f"a step of {seqs} sequences does not fit the graphs' {self.max_seqs}")
        self.input_ids[:tokens].copy_(input_ids)
        self.positions[:tokens].copy_(metadata.positions)
        self.slot_mapping[:tokens].copy_(metadata.slot_mapping)
        self.input_ids[tokens:rows] = 0  # padding rows: a valid token at position 0, stored nowhere, never read
        self.positions[tokens:rows] = 0
        self.slot_mapping[tokens:rows] = -1
        width = metadata.block_tables.shape[1]
        self.block_tables[:seqs, :width].copy_(metadata.block_tables)
        self.context_lens[:seqs].copy_(metadata.context_lens)
        self.query_start_loc[:seqs + 1].copy_(metadata.query_start_loc)
        tile_seqs, tile_firsts = prefill_tiles(metadata.query_lens, range(seqs), self.block_q)
        padding = [-1] * (self.max_tiles - len(tile_seqs))
        tiles = torch.tensor([tile_seqs + padding, tile_firsts + padding], dtype=torch.int32)
        self.tiles.copy_(tiles.to(self.device, non_blocking=True))

    def run(self, input_ids: torch.Tensor, metadata, sample_rows: torch.Tensor, compute_logits) -> torch.Tensor:
        """One mixed step: buffers loaded, its bucket's graph replayed (or launched, nothing captured); returns
        the logits of ``sample_rows``."""
        tokens = len(input_ids)
        rows = self.bucket(tokens)
        self.load(input_ids, metadata, rows)
        graph = self.graphs.get((0, rows))
        if graph is not None:
            graph.replay()
        else:
            self.forward(rows)
        return compute_logits(self.hidden[:tokens][sample_rows])
