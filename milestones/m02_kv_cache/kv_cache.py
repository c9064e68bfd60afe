"""A contiguous K/V cache, and the attention that reads and writes it.

Attention at position ``p`` needs the keys and values of every position ``<= p``. Those never change once
computed, so we store them: one tensor per layer for K and one for V, shaped ``[batch, max_len, kv_heads,
head_dim]`` and filled left to right::

    slot:    0   1   2  ...  P-1 | P   P+1  ...        | free ...
             <----- prompt -----> <- generated tokens ->
             written by prefill     one slot per decode step

Each step writes the new tokens' K/V at slots ``[start, start + T)`` and attends over ``[0, start + T)``.
A decode step (``T = 1``) now costs one token's worth of projections instead of the whole sequence's.
The price is memory: ``2 * layers * kv_heads * head_dim * bytes`` per token (112 KiB for Qwen3-0.6B in bf16),
reserved up front for the longest the request can get.
"""

from __future__ import annotations

import torch

from milestones.m01_naive_loop.attention import sdpa


class KVCache:
    """``k[layer]`` and ``v[layer]``: ``[batch, max_len, num_kv_heads, head_dim]`` each, allocated at once."""

    def __init__(self, num_layers: int, batch: int, max_len: int, num_kv_heads: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device) -> None:
        shape = (num_layers, batch, max_len, num_kv_heads, head_dim)
        self.k = torch.empty(shape, dtype=dtype, device=device)
        self.v = torch.empty(shape, dtype=dtype, device=device)

    @classmethod
    def for_model(cls, model_config, batch: int, max_len: int, dtype: torch.dtype, device: torch.device):
        head_dim = getattr(model_config, "head_dim", None) or model_config.hidden_size // model_config.num_attention_heads
        return cls(model_config.num_hidden_layers, batch, max_len, model_config.num_key_value_heads, head_dim,
                   dtype, device)

    @property
    def max_len(self) -> int:
        return self.k.shape[2]

    @property
    def bytes_per_slot(self) -> int:
        """Bytes of K and V, all layers, for one token of one row."""
        layers, _, _, heads, dim = self.k.shape
        return 2 * layers * heads * dim * self.k.element_size()

    @property
    def reserved_bytes(self) -> int:
        return 2 * self.k.numel() * self.k.element_size()


class CachedAttention:
    """Attention for ``T`` new tokens per row at slots ``[start, start + T)``, reading every earlier slot."""

    def __init__(self, cache: KVCache, start: int, num_new: int) -> None:
        self.cache, self.start, self.end = cache, start, start + num_new

    def __call__(self, layer_idx: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        cache_k, cache_v = self.cache.k[layer_idx], self.cache.v[layer_idx]
        cache_k[:, self.start:self.end] = k
        cache_v[:, self.start:self.end] = v
        if self.start == 0:  # prefill: the new tokens are the whole sequence, a plain causal mask
            return sdpa(q, k, v, is_causal=True)
        keys, values = cache_k[:, :self.end], cache_v[:, :self.end]
        if self.end - self.start == 1:  # decode: one query sees every cached key, no mask needed
            return sdpa(q, keys, values)
        return sdpa(q, keys, values, attn_mask=self.causal_mask(q.device))

    def causal_mask(self, device: torch.device) -> torch.Tensor:
        """``[1, 1, T, end]`` bool (``sdpa``'s mask layout): new token ``i`` (at slot ``start + i``) sees slots
        ``<= start + i``."""
        query_slots = torch.arange(self.start, self.end, device=device)[:, None]
        return (torch.arange(self.end, device=device)[None, :] <= query_slots)[None, None]
