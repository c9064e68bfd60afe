"""Fewer kernels per layer: q/k/v and gate/up packed into one weight each at load time (checkpoints unchanged).

A CUDA graph removes the CPU's cost of launching kernels, but the GPU still runs them one by one, each with a
start-up cost of its own, and steps with prompt chunks still launch eagerly. So m10 also cuts the number of
kernels in every layer, without changing what is computed:

    before (m01's modules)                         after (packed here)
    q_proj, k_proj, v_proj     3 matmuls           qkv_proj         1 matmul, split into views
    q_norm, k_norm             2 norms             one RMSNorm over the q and k heads together, then the
                                                   per-head weights (q's for the first heads, k's for the rest)
    RoPE on q, RoPE on k       2 x 4 kernels       RoPE on [q | k] together: 4 kernels
    gate_proj, up_proj         2 matmuls           gate_up_proj     1 matmul, split into halves

The packed weights are concatenations of the checkpoint's: a packed matmul's output columns are exactly the
three (or two) separate outputs side by side, so the tokens do not change (in float32, up to the summation
order the matrix library picks for the wider matrix).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from milestones.m01_naive_loop.model import AttentionFn, Qwen3Attention, Qwen3ForCausalLM, Qwen3MLP, apply_rope


def packed_linear(*parts: nn.Linear) -> nn.Linear:
    """One ``nn.Linear`` whose output is the outputs of ``parts`` side by side."""
    weight = torch.cat([p.weight for p in parts])
    bias = None if parts[0].bias is None else torch.cat([p.bias for p in parts])
    packed = nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None, device=weight.device,
                       dtype=weight.dtype)
    packed.weight.data.copy_(weight)
    if bias is not None:
        packed.bias.data.copy_(bias)
    return packed.requires_grad_(False)


class PackedAttention(nn.Module):
    """``Qwen3Attention`` with one qkv matmul, one q/k norm and one RoPE."""

    def __init__(self, attn: Qwen3Attention) -> None:
        super().__init__()
        self.layer_idx, self.head_dim = attn.layer_idx, attn.head_dim
        self.num_heads, self.num_kv_heads = attn.num_heads, attn.num_kv_heads
        self.qkv_proj = packed_linear(attn.q_proj, attn.k_proj, attn.v_proj)
        self.o_proj = attn.o_proj
        # Row h of this table is the norm weight of head h of [q | k]: q_norm's for the query heads, then k_norm's.
        weights = torch.cat([attn.q_norm.weight.expand(self.num_heads, -1),
                             attn.k_norm.weight.expand(self.num_kv_heads, -1)])
        self.register_buffer("qk_norm_weight", weights.contiguous())
        self.eps = attn.q_norm.eps

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], attention: AttentionFn) -> torch.Tensor:
        lead, heads, kv_heads, dim = x.shape[:-1], self.num_heads, self.num_kv_heads, self.head_dim
        qkv = self.qkv_proj(x)
        qk = qkv[..., :(heads + kv_heads) * dim].view(*lead, heads + kv_heads, dim)
        v = qkv[..., (heads + kv_heads) * dim:].view(*lead, kv_heads, dim)
        qk = F.rms_norm(qk, (dim,), eps=self.eps) * self.qk_norm_weight
        qk = apply_rope(qk, *rope)
        out = attention(self.layer_idx, qk[..., :heads, :], qk[..., heads:, :], v)
        return self.o_proj(out.reshape(*lead, heads * dim))


class PackedMLP(nn.Module):
    """SwiGLU with one gate/up matmul."""

    def __init__(self, mlp: Qwen3MLP) -> None:
        super().__init__()
        self.gate_up_proj = packed_linear(mlp.gate_proj, mlp.up_proj)
        self.down_proj = mlp.down_proj

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(F.silu(gate) * up)


@torch.no_grad()
def pack_projections(model: Qwen3ForCausalLM) -> Qwen3ForCausalLM:
    """Swap every layer's attention and MLP for their packed versions, in place (old weights are freed).
    Layers already packed are left as they are (m13 packs, then quantizes, as it loads)."""
    for layer in model.model.layers:
        if not isinstance(layer.self_attn, PackedAttention):
            layer.self_attn = PackedAttention(layer.self_attn)
        if not isinstance(layer.mlp, PackedMLP):
            layer.mlp = PackedMLP(layer.mlp)
    return model
