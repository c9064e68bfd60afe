"""m12's fused decoder, with each quantized matmul finishing the small kernel after it.

At batch 1 the decode step's CUDA graph launches, per layer, four GEMVs and seven small kernels; three of those
follow a GEMV directly and need only its outputs: the add + RMSNorm after ``o_proj`` and after ``down_proj``,
and SiLU * up after ``gate_up_proj``. Here those three are done by the GEMV's finishing programs
(``gemv_epilogues.py``), through m12's two seams::

    m12:  hidden = add_rms_norm(o_proj(heads), residual, norm)        two kernels
    here: hidden = quantized_add_rms_norm(heads, o_proj's W, residual, norm)   one kernel

    m12:  act = silu_and_mul(gate_up_proj(hidden))                    two kernels
    here: act = quantized_silu_and_mul(hidden, gate_up_proj's W)      one kernel

At one row, three kernels fewer per layer (108 of a Qwen3-8B step's 400); at two, one (SiLU * up: the norm
stays m12's kernel, below). Beyond the GEMV's rows (``GEMV_MAX_M``) the
same calls run the matmul and then m12's kernel; an unquantized layer, or one on the torch reference, keeps
m12's path.

Which epilogues pay was measured on the H200 (calls 57-58, ``docs/int4-gemv-journal.md``, "A seventh guess"):
SiLU * up costs its GEMV almost nothing and saves a kernel (gate_up 22.2 µs a launch against 23.6 with m12's
kernel after it, batch 1); the norm costs the GEMV about what m12's kernel costs (its last program waits for
the count, then loads and stores a row: a chain of latencies), so it pays only in the kernel boundaries it
saves, at one row; at two rows it cost 2.3 µs a launch more, and the step keeps m12's kernel there
(``NORM_EPILOGUE_MAX_ROWS``).

Where the matmul after a norm multiplies x as 16-bit integers (int4's GEMV on ``dp4a``, 1-4 rows), the norm
stays a kernel of its own and writes that x too (``integer_norm.py``), so the GEMV needs no conversion launch
before it: q/k/v and gate_up read ``IntegerRows`` through m12's seams ``project_qkv`` and ``gate_up_silu``. In a
decode graph o_proj's x comes the same way from the attention's combine (``integer_heads.py``, through m12's
``attend``), and down_proj's from gate_up's GEMV, each of whose programs makes a whole group of outputs and
converts it from registers, at one row (``SILU_WORDS_MAX_ROWS``); the head's x and layer 0's q/k/v's are still
converted by a launch.

On ``dp4a`` (1-4 rows) two more things move out of the GEMVs and the norms:

* q/k/v, o_proj and down_proj leave their slices of K unadded, and the kernel after each adds them as it loads
  (``sliced_sums.py``): q/k norm + RoPE (m12's seam ``rotate_qkv``) and the norm.
* That norm, before q/k/v and gate_up, leaves 1 / rms to them (``deferred_norm.py``; ``DeferredRows``): it runs as
  8 programs a row, q/k norm + RoPE multiplies q/k/v's sums by 1 / rms where it adds the slices, and gate_up's
  GEMV its sums before SiLU * up. ``DEFERRED_NORM_MAX_ROWS = 0`` keeps the exact norm (``integer_norm.py``).

On the H200 the two took the batch-1 step from 2.18x bf16's to 2.24x and then 2.34x (the journal's fifteenth and
sixteenth guesses). With ``ROPE_STORES_KV`` q/k norm + RoPE also writes K/V into a decode graph's cache, and the
graph's store launch goes (``kv_at_rope.py``, through m12's ``attend_qkv``): 2.36x (the seventeenth, call 99).
With ``ROPE_IN_DECODE`` the decode kernel's programs do that work themselves (``rope_in_decode.py``): one kernel a
layer fewer, 22 µs a step at one row (the twenty-third guess, calls 122-128). With ``NORM_IN_GEMV_MAX_ROWS`` the
deferred norm after o_proj and down_proj is done by their GEMV's finish, the last program of each group of outputs
(``gemv_epilogues.deferred_norm_when_last``), and layer 0's input norm is the deferred one too (``first_norm``): the
step 2.50-2.54x bf16's in four of five H200 calls (the twenty-fourth guess, calls 129-134).
"""

from __future__ import annotations

import torch
from torch import nn

from milestones.m01_naive_loop.model import AttentionFn
from milestones.m10_cuda_graphs.graph_runner import GraphDecodeAttention
from milestones.m12_async_scheduling.fused_kernels import add_rms_norm
from milestones.m12_async_scheduling.fused_layers import FusedCausalLM, FusedQwen3Model

from .deferred_norm import DeferredRows, deferred_add_rms_norm, deferred_rms_norm
from .epilogue_matmuls import (deferred_matmul_slices, quantized_add_rms_norm, quantized_deferred_add_norm,
                               quantized_matmul_slices, quantized_silu_and_mul, quantized_silu_and_mul_int16)
from .integer_heads import IntegerHeadsAttention
from .integer_norm import IntegerRows, add_rms_norm_int16
from .kv_at_rope import CacheSlots
from .launch_config import LAUNCH_TABLE, regime
from .matmul_kernels import quantized_matmul
from .quantize import QuantizedLinear
from .rope_in_decode import rope_decode_attention
from .sliced_sums import SlicedSums, sliced_qk_norm_rope


NORM_EPILOGUE_MAX_ROWS = 1  # the add + norm epilogue's rows of x, at most (measured: above)
INTEGER_X_MAX_ROWS = 4  # x made 16-bit where it is made (norms, combine, gate_up) up to this many rows (0: never)
# SiLU * up's GEMV writes down_proj's x as 16-bit integers too, where down_proj multiplies them, up to this many
# rows: on the H200 the step took 18 µs less at one row and 31 and 81 µs more at two and four, where each
# group's last program read its rows back (results/h200/m13_step_times+silu-words.json); with a group a program
# (launch_config.SILU_WORDS_GEMV), 78 and 833 µs more (m13_step_times+words-per-float.json)
SILU_WORDS_MAX_ROWS = 1
# A split GEMV's slices of K added by the kernel after it, not by the GEMV's finishing programs (sliced_sums.py),
# up to this many rows (0: never): o_proj's and down_proj's by the norm that writes the integers, q/k/v's by q/k
# norm + RoPE
NORM_ADDS_SLICES_MAX_ROWS = 4
ROPE_ADDS_SLICES_MAX_ROWS = 4  # after a deferred norm q/k/v leaves its slices whatever this says (1 / rms is there)
# The norm before q/k/v and gate_up run as 8 programs a row, with 1 / rms left to the reader (deferred_norm.py),
# up to this many rows (0: never; the norm that writes the integers in one program a row, integer_norm.py)
DEFERRED_NORM_MAX_ROWS = 4
# That norm done by o_proj's and down_proj's GEMV, the last program of each group of outputs adding its slices
# (gemv_epilogues.deferred_norm_when_last), up to this many rows (0: never; the norm's own launch). On the H200
# the batch-1 step took 1.977 ms against 2.045 with the norm's launch, 2.50x bf16's against 2.42x; 2 rows 2.295
# against 2.333, 4 rows 3.294 against 3.259 (call 130, results/h200/m13_step_times+norm-in-gemv.json)
NORM_IN_GEMV_MAX_ROWS = 2
# In a decode graph, q/k norm + RoPE over q/k/v's slices writes K and V into the cache itself (kv_at_rope.py).
# On since call 99 timed it: the batch-1 step 2.116 ms against 2.136 with the store's launch, 2.36x bf16's against
# 2.34x (results/h200/m13_step_times+rope-kv.json)
ROPE_STORES_KV = True
# With ROPE_STORES_KV, the decode kernel's programs do q/k norm + RoPE and the K/V store themselves (rope_in_decode.py).
# On since calls 125-128 timed it: the batch-1 step 2.026 ms against 2.049 with RoPE's kernel, 2.46x bf16's against
# 2.43x, 2 rows 2.314 against 2.355 (call 128, m13_step_times+rope-in-decode-every-split.json); 4 rows 3.257 against
# 3.288, 4,096 keys 2.176 against 2.198 (call 127, before every split made q: +rope-in-decode-prefetch*.json)
ROPE_IN_DECODE = True


def _on_triton(proj: nn.Module) -> bool:
    return isinstance(proj, QuantizedLinear) and proj.kernel == "triton" and proj.bias is None


def _multiplies_integers(proj: nn.Module | None, rows: int, dtype: torch.dtype) -> bool:
    """Whether ``proj`` at this many rows of x runs int4's GEMV on ``dp4a`` (which reads x as integers)."""
    if proj is None or not _on_triton(proj) or proj.method != "int4" or dtype == torch.float32:
        return False  # float32 x keeps the float GEMV (matmul_kernels._gemv)
    config = LAUNCH_TABLE["int4"][regime(rows, "int4")]
    return 0 < rows <= INTEGER_X_MAX_ROWS and config.kernel == "gemv" and config.unpack == "dp4a"


def _project(proj: nn.Module, x: torch.Tensor, words: torch.Tensor | None) -> torch.Tensor:
    """``proj(x)``, multiplying ``words`` (x as 16-bit integers, made where x was) where they are given."""
    return proj(x) if words is None else quantized_matmul(x, proj.qweight, proj.scales, proj.method, x_words=words)


class EpilogueQwen3Model(FusedQwen3Model):
    """``FusedQwen3Model`` whose quantized ``gate_up_proj`` finishes SiLU * up in its own kernel, and ``o_proj``
    and ``down_proj`` the add + norm at one row, unless the GEMV after the norm is on ``dp4a``: then the norm
    writes that GEMV's x as integers too (as the combine does o_proj's, and gate_up's GEMV down_proj's): by
    default the deferred norm, whose 1 / rms q/k/v's reader and gate_up's GEMV multiply, after adding the
    slices o_proj and down_proj leave."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__(model)
        # the projection that reads each norm's output (the final norm's reader, the LM head, is outside)
        self.norm_readers = {layer.post_attention_layernorm: layer.mlp.gate_up_proj for layer in self.layers}
        self.norm_readers.update({layer.input_layernorm: layer.self_attn.qkv_proj for layer in self.layers[1:]})
        self.silu_readers = {layer.mlp.gate_up_proj: layer.mlp.down_proj for layer in self.layers}

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, attention) -> torch.Tensor:
        o_proj, dtype = self.layers[0].self_attn.o_proj, self.embed_tokens.weight.dtype
        if type(attention) is GraphDecodeAttention and _multiplies_integers(o_proj, len(input_ids), dtype):
            attention = IntegerHeadsAttention.like(attention)  # a decode graph's: its combine writes o_proj's x
        return super().forward(input_ids, positions, attention)

    def attend(self, attn: nn.Module, x: torch.Tensor | IntegerRows, positions: torch.Tensor,
               attention) -> torch.Tensor | IntegerRows:
        heads = super().attend(attn, x, positions, attention)
        words = attention.take_words() if isinstance(attention, IntegerHeadsAttention) else None
        return heads if words is None else IntegerRows(heads, words)

    def first_norm(self, residual: torch.Tensor, norm: nn.Module) -> torch.Tensor | DeferredRows:
        """Layer 0's input norm as the deferred norm (the residual only read), where q/k/v multiplies its words:
        one launch of 8 programs a row instead of m12's norm and a conversion."""
        rows, qkv_proj = residual.shape[0], self.layers[0].self_attn.qkv_proj
        if rows <= DEFERRED_NORM_MAX_ROWS and _multiplies_integers(qkv_proj, rows, residual.dtype):
            return deferred_rms_norm(residual, norm.weight, norm.eps)
        return super().first_norm(residual, norm)

    def project_add_norm(self, proj: nn.Module, x: torch.Tensor | IntegerRows, residual: torch.Tensor,
                         norm: nn.Module) -> torch.Tensor | IntegerRows:
        words = None
        if isinstance(x, IntegerRows):  # o_proj's x from the attention's combine, down_proj's from SiLU * up's GEMV
            x, words = x.x, x.words
        rows = x.shape[0]
        if _multiplies_integers(self.norm_readers.get(norm), rows, x.dtype):
            if rows <= min(DEFERRED_NORM_MAX_ROWS, NORM_IN_GEMV_MAX_ROWS) and _multiplies_integers(proj, rows, x.dtype):
                return quantized_deferred_add_norm(x, proj.qweight, proj.scales, proj.method, residual, norm.weight,
                                                   norm.eps, x_words=words)
            if rows <= NORM_ADDS_SLICES_MAX_ROWS and _multiplies_integers(proj, rows, x.dtype):
                sums = quantized_matmul_slices(x, proj.qweight, proj.scales, proj.method, x_words=words)
            else:
                sums = _project(proj, x, words)
            if rows <= DEFERRED_NORM_MAX_ROWS:
                return deferred_add_rms_norm(sums, residual, norm.weight, norm.eps)
            return add_rms_norm_int16(sums, residual, norm.weight, norm.eps)
        if not _on_triton(proj) or x.shape[0] > NORM_EPILOGUE_MAX_ROWS:
            return add_rms_norm(_project(proj, x, words), residual, norm.weight, norm.eps)
        return quantized_add_rms_norm(x, proj.qweight, proj.scales, proj.method, residual, norm.weight, norm.eps,
                                      x_words=words)

    def project_qkv(self, proj: nn.Module, x: torch.Tensor | IntegerRows | DeferredRows) -> torch.Tensor | SlicedSums:
        if isinstance(x, DeferredRows):  # slices always: the reader multiplies by 1 / rms where it adds them
            return deferred_matmul_slices(x, proj.qweight, proj.scales, proj.method)
        words = None
        if isinstance(x, IntegerRows):
            x, words = x.x, x.words
        if x.shape[0] <= ROPE_ADDS_SLICES_MAX_ROWS and _multiplies_integers(proj, x.shape[0], x.dtype):
            return quantized_matmul_slices(x, proj.qweight, proj.scales, proj.method, x_words=words)
        return _project(proj, x, words)

    def rotate_qkv(self, attn: nn.Module, qkv: torch.Tensor | SlicedSums,
                   positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        if not isinstance(qkv, SlicedSums):
            return super().rotate_qkv(attn, qkv, positions)
        return sliced_qk_norm_rope(qkv, attn.num_heads, attn.num_kv_heads, attn.head_dim, attn.qk_norm_weight,
                                   self.rotary_emb.cos, self.rotary_emb.signed_sin, positions, attn.eps)

    def attend_qkv(self, attn: nn.Module, qkv: torch.Tensor | SlicedSums, positions: torch.Tensor,
                   attention: AttentionFn) -> torch.Tensor:
        """With ``ROPE_STORES_KV``, in a decode graph whose q/k/v left its slices: q/k norm + RoPE writes K/V at
        the graph's slots (``kv_at_rope.py``), and the attention decodes over the cache without its store. Any
        other attention (a prefill's, an eager step's, a plain function) is given q, k and v as in m12."""
        if not (ROPE_STORES_KV and isinstance(qkv, SlicedSums) and isinstance(attention, GraphDecodeAttention)):
            return super().attend_qkv(attn, qkv, positions, attention)
        if ROPE_IN_DECODE:
            return rope_decode_attention(attention, attn.layer_idx, qkv, attn.num_heads, attn.num_kv_heads,
                                         attn.head_dim, attn.qk_norm_weight, self.rotary_emb.cos,
                                         self.rotary_emb.signed_sin, positions, attn.eps)
        layer, cache = attn.layer_idx, attention.cache
        slots = CacheSlots(cache.k[layer], cache.v[layer], attention.slot_mapping, **cache.kernel_scales(layer))
        q, _, _ = sliced_qk_norm_rope(qkv, attn.num_heads, attn.num_kv_heads, attn.head_dim, attn.qk_norm_weight,
                                      self.rotary_emb.cos, self.rotary_emb.signed_sin, positions, attn.eps, slots)
        return attention.decode_stored(layer, q)

    def gate_up_silu(self, proj: nn.Module, x: torch.Tensor | IntegerRows | DeferredRows) -> torch.Tensor | IntegerRows:
        if isinstance(x, DeferredRows):  # the GEMV's finish multiplies by 1 / rms
            rows, down_proj = x.words.shape[0], self.silu_readers.get(proj)
            if rows <= SILU_WORDS_MAX_ROWS and _multiplies_integers(down_proj, rows, x.dtype):
                return quantized_silu_and_mul_int16(x, proj.qweight, proj.scales, proj.method)
            return quantized_silu_and_mul(x, proj.qweight, proj.scales, proj.method)
        words = None
        if isinstance(x, IntegerRows):
            x, words = x.x, x.words
        if not _on_triton(proj):
            return super().gate_up_silu(proj, x)
        if x.shape[0] <= SILU_WORDS_MAX_ROWS and _multiplies_integers(self.silu_readers.get(proj), x.shape[0],
                                                                      x.dtype):
            return quantized_silu_and_mul_int16(x, proj.qweight, proj.scales, proj.method, x_words=words)
        return quantized_silu_and_mul(x, proj.qweight, proj.scales, proj.method, x_words=words)


class EpilogueCausalLM(FusedCausalLM):
    decoder_class = EpilogueQwen3Model
