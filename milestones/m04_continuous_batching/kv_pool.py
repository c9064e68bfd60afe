"""One K/V pool shared by all requests, addressed by slot, and the attention that reads it.

Every request owns a contiguous range of slots (see ``kv_allocator.py``). Per step, the engine builds the
attention *metadata* once and every layer reads it:

* ``slot_mapping`` ``[B, T]``: the pool slot where each new token's K and V are written (padding goes to a
  spare "trash" slot at the end of the pool that nobody reads);
* for decode steps, ``kv_indices`` ``[B, S]``: the pool slots of every key each row may read, with
  ``key_mask`` ``[B, 1, 1, S]`` saying which of them are real (rows are as long as the longest one; the
  extra indices of shorter rows point at slots the row has written, never at uninitialised memory).

Decode attention *gathers* each row's keys into a dense ``[B, S, heads, dim]`` tensor and runs
``scaled_dot_product_attention`` on it: simple, but it copies the K/V it reads. m08's Triton kernel reads
the pool in place instead.
"""

from __future__ import annotations

import torch

from milestones.m01_naive_loop.attention import sdpa


class KVPool:
    """``k[layer]``, ``v[layer]``: ``[capacity + 1, num_kv_heads, head_dim]``; slot ``capacity`` is the trash slot."""

    def __init__(self, num_layers: int, capacity: int, num_kv_heads: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device) -> None:
        shape = (num_layers, capacity + 1, num_kv_heads, head_dim)
        self.k = torch.empty(shape, dtype=dtype, device=device)
        self.v = torch.empty(shape, dtype=dtype, device=device)
        self.capacity = capacity
        self.trash_slot = capacity

    @staticmethod
    def bytes_per_token(model_config, dtype: torch.dtype) -> int:
        head_dim = getattr(model_config, "head_dim", None) or model_config.hidden_size // model_config.num_attention_heads
        element = torch.empty((), dtype=dtype).element_size()
        return 2 * model_config.num_hidden_layers * model_config.num_key_value_heads * head_dim * element

    @classmethod
    def for_model(cls, model_config, capacity: int, dtype: torch.dtype, device: torch.device) -> KVPool:
        head_dim = getattr(model_config, "head_dim", None) or model_config.hidden_size // model_config.num_attention_heads
        return cls(model_config.num_hidden_layers, capacity, model_config.num_key_value_heads, head_dim,
                   dtype, device)

    def write(self, layer_idx: int, slot_mapping: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        slots = slot_mapping.reshape(-1)
        self.k[layer_idx].index_copy_(0, slots, k.reshape(slots.shape[0], *k.shape[-2:]))
        self.v[layer_idx].index_copy_(0, slots, v.reshape(slots.shape[0], *v.shape[-2:]))


class PrefillAttention:
    """Prefill of newly admitted requests: store their K/V in the pool, attend within the padded batch."""

    def __init__(self, pool: KVPool, slot_mapping: torch.Tensor, mask: torch.Tensor) -> None:
        self.pool, self.slot_mapping, self.mask = pool, slot_mapping, mask

    def __call__(self, layer_idx: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        self.pool.write(layer_idx, self.slot_mapping, k, v)
        return sdpa(q, k, v, attn_mask=self.mask)


class DecodeAttention:
    """One new token per running request: store its K/V, gather each row's keys from the pool, attend."""

    def __init__(self, pool: KVPool, slot_mapping: torch.Tensor, kv_indices: torch.Tensor,
                 key_mask: torch.Tensor) -> None:
        self.pool, self.slot_mapping, self.key_mask = pool, slot_mapping, key_mask
        self.rows, self.keys_per_row = kv_indices.shape
        self.flat_indices = kv_indices.reshape(-1)

    def __call__(self, layer_idx: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        self.pool.write(layer_idx, self.slot_mapping, k, v)
        shape = (self.rows, self.keys_per_row, *k.shape[-2:])  # [B, S, kv_heads, head_dim]: a gathered copy
        keys = self.pool.k[layer_idx].index_select(0, self.flat_indices).view(shape)
        values = self.pool.v[layer_idx].index_select(0, self.flat_indices).view(shape)
        return sdpa(q, keys, values, attn_mask=self.key_mask)
