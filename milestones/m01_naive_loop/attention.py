"""Causal self-attention over the tokens of this forward pass only: no cache.

This is the attention m01 plugs into the model. Every step feeds the *whole* sequence, so the keys a query
may see are exactly the tokens in the same call at or before its position: a plain causal mask. Grouped-query
attention is handled by ``enable_gqa`` (each K/V head serves ``num_heads / num_kv_heads`` query heads).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **kwargs) -> torch.Tensor:
    """``scaled_dot_product_attention`` for ``[B, T, heads, head_dim]`` tensors (the model's layout).

    Extra keyword arguments (``is_causal``, ``attn_mask``) go to torch unchanged.
    """
    out = F.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), enable_gqa=q.shape[2] != k.shape[2], **kwargs
    )
    return out.transpose(1, 2)


class CausalAttention:
    """Attention for a ``[B, T]`` batch that holds every token of its sequences (prompt + generated so far)."""

    def __call__(self, layer_idx: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return sdpa(q, k, v, is_causal=True)
