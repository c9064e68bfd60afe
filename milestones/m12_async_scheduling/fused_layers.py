"""The decoder with fused kernels (``fused_kernels.py``), for the decode steps m10 records in CUDA graphs.

The residual stream changes shape to let one kernel do an addition and the next norm, across layer borders::

    m10:   x = x + attn(norm1(x));   x = x + mlp(norm2(x))                  (per layer: 2 adds, 2 norms)
    here:  h, residual = norm1(x), x
           for each layer:
               h = add_rms_norm(attn(h), residual, norm2)           residual += attn(h); h = norm2(residual)
               h = add_rms_norm(mlp(h), residual, next layer's norm1, or the final norm)

The weights are the same tensors (nothing is copied) and the forward signature is the model's, so m10's graph
runner records it unchanged. Only the graphs use it: a replay launches no kernel from Python, so fewer, larger
kernels are pure gain there, while in an eager step each Triton launch costs the host more than the torch ops it
replaces.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from milestones.m01_naive_loop.model import AttentionFn, Qwen3ForCausalLM, Qwen3Model
from milestones.m10_cuda_graphs.packed_layers import PackedAttention, PackedMLP

from .fused_kernels import add_rms_norm, qk_norm_rope, silu_and_mul


class FusedQwen3Model(nn.Module):
    """m01's ``Qwen3Model`` (its modules, shared) with one fused kernel for each add + norm, q/k norm + RoPE and
    SiLU * up."""

    def __init__(self, model: Qwen3Model) -> None:
        super().__init__()
        self.embed_tokens, self.layers, self.norm, self.rotary_emb = (model.embed_tokens, model.layers, model.norm,
                                                                      model.rotary_emb)
        for layer in self.layers:
            if not isinstance(layer.self_attn, PackedAttention) or not isinstance(layer.mlp, PackedMLP):
                raise ValueError("fused layers need m10's packed attention and MLP (pack_projections first)")

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, attention: AttentionFn) -> torch.Tensor:
        residual = self.embed_tokens(input_ids)
        hidden = self.first_norm(residual, self.layers[0].input_layernorm)
        norms = [layer.post_attention_layernorm for layer in self.layers]
        next_norms = [layer.input_layernorm for layer in self.layers[1:]] + [self.norm]
        for layer, norm, next_norm in zip(self.layers, norms, next_norms):
            attn, mlp = layer.self_attn, layer.mlp
            hidden = self.project_add_norm(attn.o_proj, self.attend(attn, hidden, positions, attention), residual,
                                           norm)
            hidden = self.project_add_norm(mlp.down_proj, self.gate_up_silu(mlp.gate_up_proj, hidden), residual,
                                           next_norm)
        return hidden

    def first_norm(self, residual: torch.Tensor, norm: nn.Module) -> torch.Tensor:
        """Layer 0's input norm, over the embedding's rows (a seam: m13's writes q/k/v's integers)."""
        return F.rms_norm(residual, (residual.shape[-1],), norm.weight, norm.eps)

    def attend(self, attn: PackedAttention, x: torch.Tensor, positions: torch.Tensor,
               attention: AttentionFn) -> torch.Tensor:
        """The attention heads' output, ``[T, heads * dim]``, before ``o_proj``."""
        heads = self.attend_qkv(attn, self.project_qkv(attn.qkv_proj, x), positions, attention)
        return heads.reshape(-1, attn.num_heads * attn.head_dim)

    def attend_qkv(self, attn: PackedAttention, qkv: torch.Tensor, positions: torch.Tensor,
                   attention: AttentionFn) -> torch.Tensor:
        """Attention over the packed projection's output (a seam: m13's RoPE writes K/V into the cache)."""
        return attention(attn.layer_idx, *self.rotate_qkv(attn, qkv, positions))

    def rotate_qkv(self, attn: PackedAttention, qkv: torch.Tensor,
                   positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q and k normalised and rotated, and v, from the packed projection's output (a seam, as below)."""
        heads, kv_heads, dim = attn.num_heads, attn.num_kv_heads, attn.head_dim
        q, k = qk_norm_rope(qkv, heads, kv_heads, dim, attn.qk_norm_weight, self.rotary_emb.cos,
                            self.rotary_emb.signed_sin, positions, attn.eps)
        return q, k, qkv[:, (heads + kv_heads) * dim:].view(-1, kv_heads, dim)

    def project_qkv(self, proj: nn.Module, x: torch.Tensor) -> torch.Tensor:
        """The packed q/k/v projection of the layer's normalised input (a seam, as the two below)."""
        return proj(x)

    def project_add_norm(self, proj: nn.Module, x: torch.Tensor, residual: torch.Tensor,
                         norm: nn.Module) -> torch.Tensor:
        """``residual += proj(x)``; returns ``norm(residual)`` (a seam: m13 folds the add and the norm into its
        quantized matmul)."""
        return add_rms_norm(proj(x), residual, norm.weight, norm.eps)

    def gate_up_silu(self, proj: nn.Module, x: torch.Tensor) -> torch.Tensor:
        """``silu(gate) * up`` of the packed gate/up projection (a seam, as above)."""
        return silu_and_mul(proj(x))


class FusedCausalLM(nn.Module):
    """The same ``Qwen3ForCausalLM`` (its modules, shared) whose forward runs ``FusedQwen3Model`` (or the
    subclass ``decoder_class`` names)."""

    decoder_class = FusedQwen3Model

    def __init__(self, model: Qwen3ForCausalLM) -> None:
        super().__init__()
        self.config, self.lm_head = model.config, model.lm_head
        self.model = self.decoder_class(model.model)
        self.compute_logits = model.compute_logits

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, attention: AttentionFn) -> torch.Tensor:
        return self.model(input_ids, positions, attention)
