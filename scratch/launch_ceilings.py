"""One GPU call, a timing question only: how much of the batch-1 step the small kernels the journal's "What is left"
would fold away could give back at most. The step (quant_step, 5 interleaved rounds, 512 keys) of bf16, int4, and
int4 whose decode graphs were captured without q/k norm + RoPE's launch (q an empty tensor, K/V not written), without
the combine's launch (o_proj's x and its integers left as they were), and without both. The outputs are wrong on
purpose: a ceiling for a fusion that would do that work inside the next kernel, not a fusion.

    python3 scratch/launch_ceilings.py OUT_DIR
"""

from __future__ import annotations

import sys

import torch

import benchmarks.quant_step as quant_step
from milestones.m13_quantization import epilogue_layers, integer_heads
from milestones.m13_quantization.integer_dots import int16_x_words


def no_rope(qkv, num_heads, num_kv_heads, head_dim, *args, **kwargs):
    tokens = qkv.parts.shape[1]
    return torch.empty((tokens, num_heads, head_dim), dtype=qkv.dtype, device=qkv.parts.device), None, None


def no_combine(self, partial, lse, out, num_splits):
    batch, heads, _, dim = partial.shape
    self.words = torch.empty((batch, int16_x_words(heads * dim)), dtype=torch.int32, device=out.device)


def main(out_dir: str) -> None:
    plain_build = quant_step.build
    rope, combine = epilogue_layers.sliced_qk_norm_rope, integer_heads.IntegerHeadsAttention.combine

    def build(mode, args):
        try:  # the graphs record the launches they capture
            if mode in ("int4-no-rope", "int4-neither"):
                epilogue_layers.sliced_qk_norm_rope = no_rope
            if mode in ("int4-no-combine", "int4-neither"):
                integer_heads.IntegerHeadsAttention.combine = no_combine
            return plain_build(mode, args)
        finally:
            epilogue_layers.sliced_qk_norm_rope, integer_heads.IntegerHeadsAttention.combine = rope, combine

    compare = quant_step.compare_logits  # the ceilings' logits are wrong on purpose: compared for int4 only
    quant_step.compare_logits = lambda reference, engines, *a: compare(
        reference, {m: e for m, e in engines.items() if m == "int4"}, *a)
    for mode in ("int4-no-rope", "int4-no-combine", "int4-neither"):
        quant_step.MODES.setdefault(mode, quant_step.MODES["int4"])
    quant_step.build = build
    quant_step.main(["--modes", "bf16,int4,int4-no-rope,int4-no-combine,int4-neither", "--batches", "1",
                     "--rounds", "5", "--out", f"{out_dir}/m13_step_times_launch_ceilings.json"])


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else ".")
