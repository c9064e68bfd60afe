"""Attention over a packed batch whose K/V lives in blocks: the metadata, built once per step, and a plain
torch implementation that reads the cache through the block tables.

**Packed batches.** m03/m04 padded every row of a step to the longest one. Here the new tokens of all the
step's sequences are laid end to end in one ``[T]`` dimension, with no padding at all::

    sequences:        A (prompt of 5, all new)   B (decoding: 1 new)   C (decoding: 1 new)
    input_ids [T=7]:  a0 a1 a2 a3 a4               b57                    c12
    positions [T]:    0  1  2  3  4                57                     12
    query_start_loc:  [0, 5, 6, 7]                 (sequence i owns rows query_start_loc[i]..[i+1])
    context_lens:     [5, 58, 13]                  (keys each sequence attends to, new ones included)
    slot_mapping [T]: where each new token's K and V are written in the pool (from the block tables)

Every layer of a step sees the same batch, so ``AttentionMetadata`` is built once per step, on the host from
the block tables, and copied to the device in one go; every layer's ``PagedAttention`` call reads it.

**Reading K/V through the block tables, in plain torch.** For each sequence, key ``s`` sits in slot
``block_table[s // block_size] * block_size + s % block_size``. This path *gathers* every sequence's keys and
values into a dense ``[B, S_max, kv_heads, head_dim]`` copy (``index_select``), scatters the packed queries
into ``[B, Q_max, heads, head_dim]``, and runs masked ``scaled_dot_product_attention``: a query at position
``p`` sees keys ``s <= p`` of its own sequence. Simple and exact, but every layer of every step copies all the
K/V it reads: m08's Triton kernel reads the blocks in place instead.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from milestones.m01_naive_loop.attention import sdpa
from milestones.m04_continuous_batching.kv_pool import KVPool


class PagedKVCache(KVPool):
    """m04's pool of slots, seen as ``num_blocks`` blocks of ``block_size`` slots (plus m04's trash slot).

    ``k[layer]`` is ``[num_blocks * block_size + 1, kv_heads, head_dim]``; ``block_view`` gives the
    ``[num_blocks, block_size, kv_heads, head_dim]`` view a paged kernel indexes.
    """

    def __init__(self, num_layers: int, num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device) -> None:
        super().__init__(num_layers, num_blocks * block_size, num_kv_heads, head_dim, dtype, device)
        self.num_blocks, self.block_size = num_blocks, block_size

    @classmethod
    def for_model(cls, model_config, num_blocks: int, block_size: int, dtype: torch.dtype,
                  device: torch.device) -> PagedKVCache:
        head_dim = getattr(model_config, "head_dim", None) or model_config.hidden_size // model_config.num_attention_heads
        return cls(model_config.num_hidden_layers, num_blocks, block_size, model_config.num_key_value_heads,
                   head_dim, dtype, device)

    def block_view(self, layer_idx: int) -> tuple[torch.Tensor, torch.Tensor]:
        shape = (self.num_blocks, self.block_size, *self.k.shape[-2:])
        return self.k[layer_idx, :self.capacity].view(shape), self.v[layer_idx, :self.capacity].view(shape)

    def gather(self, layer_idx: int, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V of one layer at ``slots`` (``[n]``), copied out: ``[n, kv_heads, head_dim]`` each."""
        return self.k[layer_idx].index_select(0, slots), self.v[layer_idx].index_select(0, slots)

    def kernel_scales(self, layer_idx: int) -> dict:
        """Extra arguments a kernel that stores into or reads this cache needs (m08's: none, the cache holds the
        model's own floats; m13's FP8 cache passes each layer's scales)."""
        return {}


@dataclass
class AttentionMetadata:
    """Everything attention needs to know about one step's packed batch (device tensors unless noted)."""

    slot_mapping: torch.Tensor  # [T] int64: pool slot of each new token's K/V
    positions: torch.Tensor  # [T] int64: position of each new token in its own sequence
    query_start_loc: torch.Tensor  # [B + 1] int64: sequence i's new tokens are rows [qsl[i], qsl[i + 1])
    context_lens: torch.Tensor  # [B] int64: keys each sequence attends to (cached + new)
    block_tables: torch.Tensor  # [B, max_blocks] int32; entries past a sequence's last block are padding (0)
    query_lens: list[int]  # host copies, for shapes decided on the host
    query_starts_host: list[int]
    context_lens_host: list[int]
    block_size: int

    @property
    def num_seqs(self) -> int:
        return len(self.query_lens)

    @property
    def max_query_len(self) -> int:
        return max(self.query_lens)

    @property
    def max_context_len(self) -> int:
        return max(self.context_lens_host)

    @property
    def is_decode_only(self) -> bool:
        return self.max_query_len == 1

    @classmethod
    def build(cls, query_lens: list[int], context_lens: list[int], positions: list[int], slot_mapping: list[int],
              block_tables: np.ndarray, block_size: int, device: torch.device) -> AttentionMetadata:
        """From host lists (and the ``[B, max_blocks]`` int32 block-table array) to device tensors: one
        host->device copy per tensor, once per step."""
        tables = torch.from_numpy(block_tables)
        starts = [0]
        for n in query_lens:
            starts.append(starts[-1] + n)

        def to_device(values, dtype=torch.int64) -> torch.Tensor:
            return torch.tensor(values, dtype=dtype).to(device, non_blocking=True)

        return cls(slot_mapping=to_device(slot_mapping), positions=to_device(positions),
                   query_start_loc=to_device(starts), context_lens=to_device(context_lens),
                   block_tables=tables.to(device, non_blocking=True), query_lens=list(query_lens),
                   query_starts_host=starts,
                   context_lens_host=list(context_lens), block_size=block_size)


class PagedAttention:
    """The per-step attention callable of m05: write the new K/V into the pool, then gather and attend.

    The step's sequences are attended in groups of similar query length, each padded only to its own longest:
    decodes (one query each) together, prompts by length. One 1,000-token prompt in the same padded batch as
    thirty 30-token ones would otherwise cost thirty-one 1,000-query attentions. m08 replaces the decode group
    with a kernel that reads the blocks in place.
    """

    def __init__(self, cache: PagedKVCache, metadata: AttentionMetadata) -> None:
        self.cache, self.metadata = cache, metadata
        decodes = [i for i, n in enumerate(metadata.query_lens) if n == 1]
        groups = [(decodes, True)] if decodes else []
        groups += [(group, False) for group in group_by_length(
            [i for i, n in enumerate(metadata.query_lens) if n > 1], metadata.query_lens)]
        self.groups = []  # (packed rows, attention of the group): built once, used by every layer
        for group, is_decode in groups:
            rows = self.packed_rows(group)
            self.groups.append((rows, self.make_group(group, is_decode, rows)))

    def make_group(self, sequences: list[int], is_decode: bool, rows: torch.Tensor | None = None):
        """The attention of one group of sequences: ``attend(layer_idx, q, cache)`` -> outputs of their rows."""
        return GatherIndices(self.metadata, sequences)

    def store(self, layer_idx: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Write every new token's K and V at its slot (``slot_mapping``)."""
        self.cache.write(layer_idx, self.metadata.slot_mapping, k, v)

    def packed_rows(self, sequences: list[int]) -> torch.Tensor | None:
        """Rows of the packed batch that belong to ``sequences``, in their order (None: every row, in order)."""
        if sequences == list(range(self.metadata.num_seqs)):
            return None
        starts, lens = self.metadata.query_starts_host, self.metadata.query_lens
        rows = [row for i in sequences for row in range(starts[i], starts[i] + lens[i])]
        return torch.tensor(rows, dtype=torch.long).to(self.metadata.slot_mapping.device, non_blocking=True)

    def __call__(self, layer_idx: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        self.store(layer_idx, k, v)  # every new token of the step, before any group reads
        if len(self.groups) == 1 and self.groups[0][0] is None:
            return self.groups[0][1].attend(layer_idx, q, self.cache)
        out = torch.empty_like(q)
        for rows, group in self.groups:
            out[rows] = group.attend(layer_idx, q, self.cache)
        return out


def group_by_length(sequences: list[int], query_lens: list[int], max_waste: float = 0.5) -> list[list[int]]:
    """Split ``sequences`` into groups of similar query length: sorted by length, a group grows while padding
    every member to its longest wastes at most ``max_waste`` of the group's padded queries."""
    groups: list[list[int]] = []
    for i in sorted(sequences, key=lambda i: query_lens[i]):
        group = groups[-1] if groups else None
        if group is not None:
            total = sum(query_lens[j] for j in group) + query_lens[i]
            if query_lens[i] * (len(group) + 1) * (1 - max_waste) <= total:
                group.append(i)
                continue
        groups.append([i])
    return groups


class GatherIndices:
    """The index tensors of the gather path: which pool slots each sequence reads, where each query goes.

    * ``kv_slots [B, S]``: pool slot of key ``s`` of sequence ``b`` (keys past its context point at its first
      slot, which holds a real, finite value: masked out, but a zero weight times NaN would still be NaN);
    * ``mask [B, 1, Q, S]``: may padded query ``i`` of sequence ``b`` see key ``s``? Yes iff ``s`` is one of the
      sequence's keys and ``s <= position of that query``;
    * ``query_rows [B, Q]``: which packed row feeds padded query ``(b, i)`` (rows past a sequence's own queries
      repeat its last one: finite, and their outputs are never read); ``packed_index [T]``: the way back.
    """

    def __init__(self, metadata: AttentionMetadata, sequences: list[int] | None = None) -> None:
        """``sequences``: indices of the step's sequences to cover (default all; m08 passes the prefills)."""
        m = metadata
        device = m.slot_mapping.device
        chosen = list(range(m.num_seqs)) if sequences is None else sequences
        index = torch.tensor(chosen, device=device)
        tables, contexts = m.block_tables[index].long(), m.context_lens[index]
        keys = torch.arange(max(m.context_lens_host[i] for i in chosen), device=device)
        slots = tables[:, keys // m.block_size] * m.block_size + keys % m.block_size  # [B, S]
        is_key = keys[None, :] < contexts[:, None]
        self.kv_slots = torch.where(is_key, slots, slots[:, :1])

        query_lens = [m.query_lens[i] for i in chosen]
        width = max(query_lens)
        offsets = torch.arange(width, device=device)
        lens = torch.tensor(query_lens, device=device)
        self.query_rows = m.query_start_loc[index][:, None] + torch.minimum(offsets[None, :], lens[:, None] - 1)
        query_positions = m.positions[self.query_rows]  # [B, Q]
        self.mask = (is_key[:, None, :] & (keys[None, None, :] <= query_positions[:, :, None])).unsqueeze(1)
        is_query = offsets[None, :] < lens[:, None]
        self.packed_index = (torch.arange(len(chosen), device=device)[:, None] * width + offsets)[is_query]

    def attend(self, layer_idx: int, q: torch.Tensor, cache: PagedKVCache) -> torch.Tensor:
        """``q [T, heads, dim]``: the step's packed queries -> the outputs of the chosen sequences' queries,
        packed in the same order (all ``T`` rows when every sequence is chosen)."""
        batch, keys = self.kv_slots.shape
        k, v = cache.gather(layer_idx, self.kv_slots.reshape(-1))  # the copy m08 avoids
        k, v = k.view(batch, keys, *k.shape[-2:]), v.view(batch, keys, *v.shape[-2:])
        out = sdpa(q[self.query_rows], k, v, attn_mask=self.mask)  # [B, Q, heads, dim]
        return out.reshape(-1, *out.shape[-2:])[self.packed_index]
