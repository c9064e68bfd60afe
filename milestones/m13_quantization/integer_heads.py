"""Attention's output made integers where it is made: o_proj's x without a conversion launch.

int4's GEMV on ``dp4a`` reads x as 16-bit integers per group of 128 inputs (``integer_dots.py``). q/k/v (but
layer 0's) and gate_up get theirs from the norm before them (``integer_norm.py``); o_proj's x is the attention's
output, converted until here by a launch of its own. At batch 1 on the H200 the step's 74 conversion launches (36
of them o_proj's) cost 0.12 ms, 1.6 µs each (call 89, ``results/h200/m13_step_times+gemv-floor-5.json``).

In a decode graph the attention ends in m08's combine: one program per (sequence, query head) weighs the K
slices' partial outputs into that head's row. A head of 128 dimensions (Qwen3's) is one group of o_proj's
input, so the program that makes it holds everything the conversion needs::

    before: out[seq, head] = combine(partials)    (m08's kernel), then int16_x(out)   (m13's launch, per layer)
    here:   out[seq, head] = combine(partials); words[seq, the head's groups] = int16_x's words of it   (one program)

``_combine_to_integers_kernel`` is that kernel: m08's arithmetic (``combine_splits``), the row stored as m08 stores it,
then rounded to the model's dtype and written as ``int16_x`` would write it (``store_int16_groups``), so the
integers are the same to the bit. ``IntegerHeadsAttention`` is m10's graph attention with that combine, which
the decoder puts in its place where o_proj multiplies on ``dp4a`` (``epilogue_layers.py``); a step whose
attention is not split (no combine) or whose heads are not whole groups keeps the conversion launch. On the
H200 the batch-1 step of Qwen3-8B's shape took 2.302 ms against 2.368 with the launch, 2.17x bf16 against 2.11x
(call 91, ``results/h200/m13_step_times+integer-heads.json``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from milestones.m08_triton_kernel.device_kernel import device_kernel
from milestones.m08_triton_kernel.paged_decode_kernel import combine_splits
from milestones.m10_cuda_graphs.graph_runner import GraphDecodeAttention

from .integer_dots import int16_x_words, store_int16_groups
from .quantize import GROUP_SIZE

# warps a (sequence, head) program of the combine: 2 were no faster in the batch-1 step on the H200 (2.31x bf16's
# against 2.33x, results/h200/m13_step_times+launch-knobs.json)
COMBINE_WARPS = 4


@device_kernel
@triton.jit(do_not_specialize=["num_splits"])
def _combine_to_integers_kernel(partial_ptr, lse_ptr, out_ptr, words_ptr, num_splits, stride_out_seq,
                                stride_out_head, stride_words, HEAD_DIM: tl.constexpr, SPLITS_POW2: tl.constexpr,
                                GROUP: tl.constexpr):
    """One (sequence, query head): m08's combine, then the head's ``HEAD_DIM // GROUP`` groups as integers."""
    seq = tl.program_id(0)
    head = tl.program_id(1)
    out = combine_splits(partial_ptr, lse_ptr, seq * tl.num_programs(1) + head, num_splits, HEAD_DIM, SPLITS_POW2)
    out = out.to(out_ptr.dtype.element_ty)
    tl.store(out_ptr + seq * stride_out_seq + head * stride_out_head + tl.arange(0, HEAD_DIM), out)
    groups_per_head: tl.constexpr = HEAD_DIM // GROUP
    groups = head * groups_per_head + tl.arange(0, groups_per_head)
    x = tl.reshape(out.to(tl.float32), [groups_per_head, GROUP])  # as o_proj reads it: the stored row
    store_int16_groups(x, groups, groups < tl.num_programs(1) * groups_per_head, words_ptr + seq * stride_words,
                       tl.num_programs(1) * HEAD_DIM, groups_per_head, GROUP)


def heads_are_groups(head_dim: int) -> bool:
    """Whether each attention head's output is whole groups of o_proj's integer input."""
    return head_dim % GROUP_SIZE == 0


class IntegerHeadsAttention(GraphDecodeAttention):
    """m10's graph attention whose combine also writes its output as ``int16_x``'s words: the decoder takes them
    after each layer's attention (``take_words``: None where the step's attention was not split, so no combine
    ran, or its heads are not whole groups)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.words: torch.Tensor | None = None

    @classmethod
    def like(cls, attention: GraphDecodeAttention) -> IntegerHeadsAttention:
        """The same static buffers as ``attention`` (the graph runner's), with this class's combine."""
        return cls(attention.cache, attention.slot_mapping, attention.block_tables, attention.context_lens,
                   attention.max_context_len)

    def decode(self, layer_idx: int, q: torch.Tensor, **options) -> torch.Tensor:
        self.words = None
        if not heads_are_groups(q.shape[-1]):
            return super().decode(layer_idx, q, **options)
        return super().decode(layer_idx, q, combine=self.combine, **options)

    def take_words(self) -> torch.Tensor | None:
        """The last layer's words, once."""
        words, self.words = self.words, None
        return words

    def combine(self, partial: torch.Tensor, lse: torch.Tensor, out: torch.Tensor, num_splits: int) -> None:
        """``paged_decode_attention``'s ``combine``: ``out`` ``[B, heads, dim]``, and ``words`` beside it."""
        batch, heads, _, dim = partial.shape
        self.words = torch.empty((batch, int16_x_words(heads * dim)), dtype=torch.int32, device=out.device)
        _combine_to_integers_kernel[(batch, heads)](
            partial, lse, out, self.words, num_splits, out.stride(0), out.stride(1), self.words.stride(0),
            HEAD_DIM=dim, SPLITS_POW2=triton.next_power_of_2(num_splits), GROUP=GROUP_SIZE, num_warps=COMBINE_WARPS)
