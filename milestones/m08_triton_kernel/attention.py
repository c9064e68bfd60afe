"""m05's paged attention with the decode group handed to the Triton kernel.

A step's sequences are attended in groups (m05's ``PagedAttention``): the decodes, one query each, and the
prompt chunks, grouped by length. Only the decode group changes here:

    m05-m07 (torch):  gather every decode's keys and values into a dense copy, then SDPA     (copy + read)
    m08 (triton):     one kernel reads each sequence's blocks in place through its table     (read only)

In a mixed step (m07: decodes and prompt chunks together) the kernel computes the decode rows and the torch
path the chunk rows, and both are written into their rows of the step's packed output. The new K/V of every
token is stored first (one Triton launch for K and V), so both paths read it.
"""

from __future__ import annotations

import torch

from milestones.m05_paged_blocks.paged_attention import AttentionMetadata, PagedAttention, PagedKVCache


class TritonDecodeGroup:
    """The decode sequences of one step, attended by ``paged_decode_attention``."""

    def __init__(self, metadata: AttentionMetadata, sequences: list[int], rows: torch.Tensor | None) -> None:
        if len(sequences) == metadata.num_seqs:  # a decode-only step: the metadata is already this group's
            self.block_tables, context_lens = metadata.block_tables, metadata.context_lens
        else:
            index = torch.tensor(sequences, dtype=torch.long).to(metadata.slot_mapping.device, non_blocking=True)
            self.block_tables = metadata.block_tables.index_select(0, index)
            context_lens = metadata.context_lens.index_select(0, index)
        # int32, as in m10's captured graphs: a pointer's dtype is part of a compiled kernel's signature, so int64
        # lengths here would compile kernels of their own at the first eager steps of each kind, while serving.
        self.context_lens = context_lens.to(torch.int32)
        self.rows = rows  # packed rows of these sequences' queries (None: every row)
        self.max_context_len = max(metadata.context_lens_host[i] for i in sequences)

    def attend(self, layer_idx: int, q: torch.Tensor, cache: PagedKVCache) -> torch.Tensor:
        from .paged_decode_kernel import paged_decode_attention

        k_blocks, v_blocks = cache.block_view(layer_idx)
        queries = q if self.rows is None else q.index_select(0, self.rows)
        return paged_decode_attention(queries, k_blocks, v_blocks, self.block_tables, self.context_lens,
                                      q.shape[-1] ** -0.5, max_context_len=self.max_context_len,
                                      **cache.kernel_scales(layer_idx))


class TritonPagedAttention(PagedAttention):
    """m05's per-step attention, with the store and the decode group in Triton."""

    def make_group(self, sequences: list[int], is_decode: bool, rows: torch.Tensor | None = None):
        if is_decode:
            return TritonDecodeGroup(self.metadata, sequences, rows)
        return super().make_group(sequences, is_decode)

    def store(self, layer_idx: int, k: torch.Tensor, v: torch.Tensor) -> None:
        from .store_kv_kernel import store_kv

        store_kv(k, v, self.cache.k[layer_idx], self.cache.v[layer_idx], self.metadata.slot_mapping,
                 **self.cache.kernel_scales(layer_idx))
