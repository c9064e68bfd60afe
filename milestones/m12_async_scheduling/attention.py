"""m08's attention with the prompt chunks in one Triton launch too: two kernels per layer for any mixed step.

m08 sent a step's decodes to its paged decode kernel and left the prompt chunks to m05's torch path: grouped by
length, gathered into dense copies, masked, attended, scattered back. Here the chunks go to
``paged_prefill_kernel`` instead, all of them in one launch that reads the pool in place::

    m08:  store K/V | decode kernel | per length group: gather K, gather V, mask, SDPA, scatter  (x groups)
    m12:  store K/V | decode kernel | prefill kernel (every chunk, written into its own rows)

What a step's chunks need (the tile list of the prefill kernel, the decodes' rows) is built once per step on the
host, and every layer's call reuses it.
"""

from __future__ import annotations

import torch

from milestones.m05_paged_blocks.paged_attention import AttentionMetadata, PagedKVCache
from milestones.m08_triton_kernel.attention import TritonDecodeGroup, TritonPagedAttention

from .paged_prefill_kernel import paged_prefill_attention, prefill_tiles, queries_per_tile


class TritonPrefillGroup:
    """Every prompt chunk of one step (sequences with more than one new token), attended in one launch."""

    def __init__(self, metadata: AttentionMetadata, sequences: list[int]) -> None:
        self.metadata, self.sequences = metadata, sequences
        self.tiles: tuple[int, torch.Tensor, torch.Tensor] | None = None  # (queries per tile, seqs, firsts)

    def tile_list(self, num_heads: int, num_kv_heads: int) -> tuple[torch.Tensor, torch.Tensor]:
        block_q = queries_per_tile(num_heads, num_kv_heads)
        if self.tiles is None or self.tiles[0] != block_q:  # built at the first layer, reused by the others
            seqs, firsts = prefill_tiles(self.metadata.query_lens, self.sequences, block_q)
            pairs = torch.tensor([seqs, firsts], dtype=torch.int32).to(self.metadata.slot_mapping.device,
                                                                       non_blocking=True)
            self.tiles = (block_q, pairs[0], pairs[1])
        return self.tiles[1], self.tiles[2]

    def attend_into(self, out: torch.Tensor, layer_idx: int, q: torch.Tensor, cache: PagedKVCache) -> None:
        k_blocks, v_blocks = cache.block_view(layer_idx)
        tile_seqs, tile_firsts = self.tile_list(q.shape[1], k_blocks.shape[2])
        m = self.metadata
        paged_prefill_attention(q, k_blocks, v_blocks, out, m.block_tables, m.context_lens, m.query_start_loc,
                                tile_seqs, tile_firsts, q.shape[-1] ** -0.5, **cache.kernel_scales(layer_idx))


class TritonMixedAttention(TritonPagedAttention):
    """A step's attention in Triton whatever it holds: decodes in m08's kernel, prompt chunks in the prefill one."""

    def __init__(self, cache: PagedKVCache, metadata: AttentionMetadata) -> None:
        self.cache, self.metadata = cache, metadata
        decodes = [i for i, n in enumerate(metadata.query_lens) if n == 1]
        chunks = [i for i, n in enumerate(metadata.query_lens) if n > 1]
        self.decode_rows = self.packed_rows(decodes) if decodes and chunks else None
        self.decodes = TritonDecodeGroup(metadata, decodes, self.decode_rows) if decodes else None
        self.chunks = TritonPrefillGroup(metadata, chunks) if chunks else None

    def __call__(self, layer_idx: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        self.store(layer_idx, k, v)  # every new token of the step, before either kernel reads
        if self.chunks is None:
            return self.decodes.attend(layer_idx, q, self.cache)
        out = torch.empty_like(q)
        self.chunks.attend_into(out, layer_idx, q, self.cache)
        if self.decodes is not None:
            out.index_copy_(0, self.decode_rows, self.decodes.attend(layer_idx, q, self.cache))
        return out
