"""Attention over a left-padded batch with one contiguous K/V cache: m02's cache, plus the padding mask."""

from __future__ import annotations

import torch

from milestones.m01_naive_loop.attention import sdpa
from milestones.m02_kv_cache.kv_cache import CachedAttention, KVCache

from .padded_batch import padded_causal_mask


class PaddedCachedAttention(CachedAttention):
    """Like m02's ``CachedAttention`` (write slots ``[start, end)``, read ``[0, end)``), but rows are padded.

    The mask is built once per step here, not once per layer: every layer of a step sees the same batch.
    """

    def __init__(self, cache: KVCache, start: int, num_new: int, pad_lens: torch.Tensor) -> None:
        super().__init__(cache, start, num_new)
        self.mask = padded_causal_mask(pad_lens, start, self.end, self.end)

    def __call__(self, layer_idx: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        cache_k, cache_v = self.cache.k[layer_idx], self.cache.v[layer_idx]
        cache_k[:, self.start:self.end] = k
        cache_v[:, self.start:self.end] = v
        if self.start == 0:  # prefill: attend over the new tokens themselves
            return sdpa(q, k, v, attn_mask=self.mask)
        return sdpa(q, cache_k[:, :self.end], cache_v[:, :self.end], attn_mask=self.mask)
