"""Qwen3, written out: the dense decoder-only transformer that every milestone runs.

A forward pass turns token ids into next-token logits:

    ids -> embed -> [ RMSNorm -> attention -> +residual -> RMSNorm -> SwiGLU MLP -> +residual ] x L
        -> RMSNorm -> lm_head -> logits

What makes it Qwen3 rather than a generic transformer:

* **RMSNorm** (no mean subtraction, no bias), computed in float32 whatever the weights' dtype.
* **Grouped-query attention (GQA)**: 16 query heads share 8 key/value heads in Qwen3-0.6B, which halves
  the K/V cache that later milestones store.
* **q/k norm**: an RMSNorm over each head's 128 dims of q and k, before RoPE.
* **RoPE** in the "rotate half" layout: dims ``i`` and ``i + d/2`` form a rotating pair.
* **SwiGLU MLP**: ``down(silu(gate(x)) * up(x))``.
* **Tied embeddings** (small models): the LM head reuses the embedding matrix.

The one seam the later milestones need is *attention*. The model computes q, k and v, and then hands them
to an ``attention`` callable passed into ``forward``. That callable is built once per step by the engine and
knows everything about this step's batch: which tokens may see which, and (from m02 on) where the K/V cache
lives. Swapping it is how a milestone changes attention without touching this file.

Shapes are agnostic to batching: ``input_ids`` and ``positions`` share any leading shape (``[B, T]`` for a
padded batch, ``[T]`` for a packed one) and every projection works on the last dimension only.
"""

from __future__ import annotations

from typing import Protocol

import torch
import torch.nn.functional as F
from torch import nn
from transformers import Qwen3Config


class AttentionFn(Protocol):
    """The per-step attention callable: given one layer's q, k, v, return the attention output.

    ``q`` is ``[..., T, num_heads, head_dim]``; ``k`` and ``v`` are ``[..., T, num_kv_heads, head_dim]`` for
    the *new* tokens of this step (RoPE already applied). The result has ``q``'s shape.
    """

    def __call__(self, layer_idx: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor: ...


def rope_theta(config: Qwen3Config) -> float:
    """RoPE base; transformers 5 keeps it in ``rope_parameters``, older versions in ``rope_theta``."""
    params = getattr(config, "rope_parameters", None) or {}
    rope_type = params.get("rope_type", "default")
    if rope_type != "default":
        raise ValueError(f"RoPE scaling type {rope_type!r} is not supported; only the default RoPE is")
    return float(params.get("rope_theta", getattr(config, "rope_theta", 10000.0)))


class RMSNorm(nn.Module):
    """``x / sqrt(mean(x^2) + eps) * weight``."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # One fused kernel (it accumulates in float32 internally). transformers rounds to the weight dtype
        # once more before the multiply; in float32 the two agree, in bfloat16 they differ in the last bit.
        return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)


class RotaryEmbedding(nn.Module):
    """Precomputed cos/sin tables indexed by position.

    Pair ``(x_i, x_{i+d/2})`` at position ``p`` is rotated by angle ``p * theta^(-2i/d)``::

        out_i       = x_i * cos - x_{i+d/2} * sin
        out_{i+d/2} = x_{i+d/2} * cos + x_i * sin

    The tables are built in float32 (the product ``p * inv_freq`` is exact there) and cast to the model's dtype
    with the weights. ``lookup`` runs once per forward pass; every layer reuses its result.
    """

    def __init__(self, head_dim: int, max_positions: int, theta: float) -> None:
        super().__init__()
        inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float) / head_dim))
        angles = torch.arange(max_positions, dtype=torch.float)[:, None] * inv_freq[None, :]
        self.register_buffer("cos", torch.cat([angles.cos(), angles.cos()], dim=-1), persistent=False)
        # The sign of the "rotate half" trick lives in the table: [-sin, +sin] pairs with [x_{i+d/2}, x_i].
        self.register_buffer("signed_sin", torch.cat([-angles.sin(), angles.sin()], dim=-1), persistent=False)

    def lookup(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``positions [..., T]`` -> cos and signed sin ``[..., T, 1, head_dim]`` (broadcast over heads)."""
        return self.cos[positions].unsqueeze(-2), self.signed_sin[positions].unsqueeze(-2)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x [..., T, heads, head_dim]`` by the angles of its positions."""
    half = x.shape[-1] // 2
    swapped = torch.cat([x[..., half:], x[..., :half]], dim=-1)
    return x * cos + swapped * signed_sin


class Qwen3Attention(nn.Module):
    """Projections, q/k norm and RoPE; the attention itself is delegated to the step's ``attention``."""

    def __init__(self, config: Qwen3Config, layer_idx: int) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        bias = getattr(config, "attention_bias", False)
        hidden = config.hidden_size
        self.q_proj = nn.Linear(hidden, self.num_heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(hidden, self.num_kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(hidden, self.num_kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, hidden, bias=bias)
        self.q_norm = RMSNorm(self.head_dim, config.rms_norm_eps)
        self.k_norm = RMSNorm(self.head_dim, config.rms_norm_eps)

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], attention: AttentionFn) -> torch.Tensor:
        lead = x.shape[:-1]
        q = self.q_norm(self.q_proj(x).view(*lead, self.num_heads, self.head_dim))
        k = self.k_norm(self.k_proj(x).view(*lead, self.num_kv_heads, self.head_dim))
        v = self.v_proj(x).view(*lead, self.num_kv_heads, self.head_dim)
        q, k = apply_rope(q, *rope), apply_rope(k, *rope)
        out = attention(self.layer_idx, q, k, v)
        return self.o_proj(out.reshape(*lead, self.num_heads * self.head_dim))


class Qwen3MLP(nn.Module):
    """SwiGLU: ``down(silu(gate(x)) * up(x))``."""

    def __init__(self, config: Qwen3Config) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Qwen3DecoderLayer(nn.Module):
    """Pre-norm block: ``x += attn(norm(x)); x += mlp(norm(x))``."""

    def __init__(self, config: Qwen3Config, layer_idx: int) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = Qwen3Attention(config, layer_idx)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = Qwen3MLP(config)

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], attention: AttentionFn) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), rope, attention)
        return x + self.mlp(self.post_attention_layernorm(x))


class Qwen3Model(nn.Module):
    """Embedding, the decoder layers and the final norm (parameter names match Hugging Face checkpoints)."""

    def __init__(self, config: Qwen3Config) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(Qwen3DecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        self.rotary_emb = RotaryEmbedding(head_dim, config.max_position_embeddings, rope_theta(config))

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, attention: AttentionFn) -> torch.Tensor:
        x = self.embed_tokens(input_ids)
        rope = self.rotary_emb.lookup(positions)
        for layer in self.layers:
            x = layer(x, rope, attention)
        return self.norm(x)


class Qwen3ForCausalLM(nn.Module):
    """The decoder plus the LM head. ``forward`` returns hidden states; ``compute_logits`` maps chosen rows.

    Splitting the two lets an engine compute logits only where it samples (the last token of each
    sequence), instead of ``[tokens, 151936]`` floats it would throw away.
    """

    def __init__(self, config: Qwen3Config) -> None:
        super().__init__()
        self.config = config
        self.model = Qwen3Model(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, attention: AttentionFn) -> torch.Tensor:
        return self.model(input_ids, positions, attention)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden).float()
