"""Causal self-attention over the tokens of this forward pass only: no cache.

This is the attention m01 plugs into the model. Every step feeds the *whole* sequence, so the keys a query
may see are exactly the tokens in the same call at or before its position: a plain causal mask. Grouped-query
attention is handled by ``enable_gqa`` (each K/V head serves ``num_heads / num_kv_heads`` query heads).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: torch.Tensor | None = None,
         is_causal: bool = False) -> torch.Tensor:
    """``scaled_dot_product_attention`` for ``[B, T, heads, head_dim]`` tensors (the model's layout).

    ``attn_mask`` (bool, True = may attend) is ``[B or 1, 1, T, S]``. Grouped-query attention: query head ``h``
    reads K/V head ``h // groups``. Without a mask, torch's flash kernel handles the groups (``enable_gqa``).
    With a mask, torch's GQA path falls back to slow float32 "math" attention, so we fold each group's query
    heads into the query-length axis instead, ``[B, kv_heads, groups * T, head_dim]``, and run the
    memory-efficient kernel (which takes masks) without ever copying K or V.
    """
    batch, length, heads, dim = q.shape
    kv_heads = k.shape[2]
    k, v = k.transpose(1, 2), v.transpose(1, 2)
    if attn_mask is None:
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k, v, is_causal=is_causal, enable_gqa=heads != kv_heads)
        return out.transpose(1, 2)
    assert not is_causal, "pass the causal structure inside attn_mask"
    groups = heads // kv_heads
    q = q.view(batch, length, kv_heads, groups, dim).permute(0, 2, 3, 1, 4).reshape(batch, kv_heads, groups * length, dim)
    mask = attn_mask.unsqueeze(2).expand(-1, -1, groups, -1, -1).reshape(attn_mask.shape[0], 1, groups * length, -1)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    out = out.view(batch, kv_heads, groups, length, dim).permute(0, 3, 1, 2, 4)
    return out.reshape(batch, length, heads, dim)


class CausalAttention:
    """Attention for a ``[B, T]`` batch that holds every token of its sequences (prompt + generated so far)."""

    def __call__(self, layer_idx: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return sdpa(q, k, v, is_causal=True)
