"""Mixed steps (prompt chunks beside decodes) replayed from CUDA graphs in pieces, with attention in between.

m10 replays only decode-only steps: a step with a prompt chunk has another token count every time, and its
attention (chunks of different lengths, causal, over cached prefixes) is shaped by the step's metadata. So
every step that admits a request runs eagerly: some 3,000 operations launched one by one from Python, about
40 ms on the H200's host (``step_kinds_*_offline.json``) against 1.8 ms for a replayed decode step. Overlap
cannot hide that: the GPU idles while the host launches. On ``offline`` those steps are 59 of 417 and 79% of the
wall time.

vLLM's answer (its ``PIECEWISE`` CUDA-graph mode) is to record everything *between* the attentions, for a ladder
of token counts, and to run only attention eagerly::

    piece 0:      embed -> norm -> layer 0's q/k/v (projection, q/k norm, RoPE)        } replayed, padded to the
    attention 0   store K/V, attend (decode kernel + prompt chunks), eagerly              } bucket's token count
    piece 1:      layer 0's o_proj, add + norm, MLP, add + norm -> layer 1's q/k/v      }
    attention 1 ...
    piece L:      layer L-1's o_proj, add + norm, MLP, add + final norm

A piece is the fused layers' code (``fused_layers.py``) between fixed buffers (token ids, positions, the residual
stream, q/k/v, the attention output), one graph per piece and bucket. Rows past the step's tokens are padding:
every piece computes each row on its own (projections, norms), so they never touch the real rows, and attention
sees only the real rows. What is left to launch per step: the pieces' replays, each layer's attention, the LM head.
"""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F

from .fused_kernels import add_rms_norm, qk_norm_rope, silu_and_mul
from .fused_layers import FusedQwen3Model


def token_buckets(max_tokens: int) -> list[int]:
    """16, 32, ... 512 doubling, then 768, 1024, 1536, 2048, 3072 ... (each power of two and one and a half of
    it), ending at ``max_tokens``: a step pads at most 2x below 512 tokens, 1.5x above."""
    sizes, size = [], 16
    while size < max_tokens:
        sizes.append(size)
        size = size * 2 if size < 512 else size * 3 // 2 if size & (size - 1) == 0 else size * 4 // 3
    return sizes + [max_tokens]


class PiecewiseGraphRunner:
    """The pieces of a forward pass over ``max_tokens`` rows of static buffers, one graph per piece and bucket.

    ``capture=False`` records nothing: ``run`` launches the same pieces eagerly (the CPU tests check the buffers,
    the padding and the order of pieces and attention that way)."""

    def __init__(self, model: FusedQwen3Model, max_tokens: int, device: torch.device, capture: bool = True) -> None:
        self.model, self.device = model, device
        self.buckets = token_buckets(max_tokens)
        attn = model.layers[0].self_attn
        heads, kv_heads, dim = attn.num_heads, attn.num_kv_heads, attn.head_dim
        hidden = model.embed_tokens.embedding_dim
        dtype = model.embed_tokens.weight.dtype
        rows = self.buckets[-1]

        def zeros(*shape, kind=dtype):
            return torch.zeros(*shape, dtype=kind, device=device)

        self.input_ids, self.positions = zeros(rows, kind=torch.long), zeros(rows, kind=torch.long)
        self.residual, self.hidden = zeros(rows, hidden), zeros(rows, hidden)
        self.q, self.k, self.v = zeros(rows, heads, dim), zeros(rows, kv_heads, dim), zeros(rows, kv_heads, dim)
        self.attention_out = zeros(rows, heads * dim)
        self.graphs: dict[tuple[int, int], torch.cuda.CUDAGraph] = {}
        self.capture_seconds = self.capture() if capture else 0.0

    # ------------------------------------------------------------------ the pieces

    def piece(self, index: int, rows: int) -> None:
        """Piece ``index`` over the first ``rows`` rows: 0 starts the pass, ``L`` ends it, the rest join layers."""
        layers, model = self.model.layers, self.model
        residual, hidden = self.residual[:rows], self.hidden[:rows]
        if index == 0:
            residual.copy_(model.embed_tokens(self.input_ids[:rows]))
            norm = layers[0].input_layernorm
            hidden.copy_(F.rms_norm(residual, (residual.shape[-1],), norm.weight, norm.eps))
        else:
            layer = layers[index - 1]
            norm = layer.post_attention_layernorm
            mlp_in = add_rms_norm(layer.self_attn.o_proj(self.attention_out[:rows]), residual, norm.weight, norm.eps)
            mlp = layer.mlp
            after = layers[index].input_layernorm if index < len(layers) else model.norm
            add_rms_norm(mlp.down_proj(silu_and_mul(mlp.gate_up_proj(mlp_in))), residual, after.weight, after.eps,
                         out=hidden)
        if index < len(layers):
            attn = layers[index].self_attn
            heads, kv_heads, dim = attn.num_heads, attn.num_kv_heads, attn.head_dim
            qkv = attn.qkv_proj(hidden)
            qk_norm_rope(qkv, heads, kv_heads, dim, attn.qk_norm_weight, model.rotary_emb.cos,
                         model.rotary_emb.signed_sin, self.positions[:rows], attn.eps,
                         out=(self.q[:rows], self.k[:rows]))
            self.v[:rows].copy_(qkv[:, (heads + kv_heads) * dim:].view(rows, kv_heads, dim))

    def capture(self) -> float:
        """Record every piece at every bucket, largest bucket first (the smaller ones reuse its memory pool)."""
        torch.cuda.synchronize(self.device)
        began, pool = time.perf_counter(), None
        for rows in reversed(self.buckets):
            for index in range(len(self.model.layers) + 1):
                self.piece(index, rows)  # warm-up: Triton compiles, the allocator sizes its blocks
                torch.cuda.synchronize(self.device)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool):
                    self.piece(index, rows)
                pool = graph.pool() if pool is None else pool
                self.graphs[index, rows] = graph
        torch.cuda.synchronize(self.device)
        return time.perf_counter() - began

    # ------------------------------------------------------------------ one step

    def bucket(self, num_tokens: int) -> int | None:
        """The smallest bucket that holds ``num_tokens`` rows, or None (the step runs eagerly)."""
        return next((size for size in self.buckets if size >= num_tokens), None)

    def run(self, input_ids: torch.Tensor, positions: torch.Tensor, attention, sample_rows: torch.Tensor,
            compute_logits) -> torch.Tensor:
        """One forward pass of ``len(input_ids)`` tokens: pieces replayed, ``attention`` (the step's) launched
        between them on the real rows; returns the logits of ``sample_rows``."""
        tokens = len(input_ids)
        rows = self.bucket(tokens)
        self.input_ids[:tokens].copy_(input_ids)
        self.positions[:tokens].copy_(positions)
        self.input_ids[tokens:rows] = 0  # padding rows: a valid token at position 0, never read back
        self.positions[tokens:rows] = 0
        for index in range(len(self.model.layers) + 1):
            if index:
                out = attention(index - 1, self.q[:tokens], self.k[:tokens], self.v[:tokens])
                self.attention_out[:tokens].copy_(out.view(tokens, -1))
            graph = self.graphs.get((index, rows))
            if graph is not None:
                graph.replay()
            else:
                self.piece(index, rows)
        return compute_logits(self.hidden[:tokens][sample_rows])
