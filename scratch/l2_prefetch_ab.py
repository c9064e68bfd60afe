"""One GPU call: fill L2 with the next weights while attention runs (a side stream in the decode graph).

Between a layer's qkv GEMV and its o_proj GEMV the batch-1 step of qwen3-8b-random runs q/k norm + RoPE, the K/V
store, the decode kernel and its combine: about 10 us a layer in which HBM is nearly idle (2 MB of K/V at 512
keys), and at 4 TB/s that is ~40 MB it could move. Here a side stream forks after the qkv GEMV (or before it:
"early"), asks L2 for o_proj's weights and scales and for the first MiB of gate_up's weights
(``cp.async.bulk.prefetch.L2``, fire and forget, from a few one-warp programs), and joins before o_proj.
Nothing is computed differently. Modes (quant_step, batch 1 and 2, 5 interleaved rounds, 512 keys):
    bf16, int4               m13 at this commit
    int4-pf-o                + o_proj's weights and scales
    int4-pf-o16, -o32        + the first 16 / 32 MiB of gate_up's weights (of 48) and all its scales
    int4-pf-o16-early        the fork before the qkv GEMV
Each prefetching engine first generates greedily through its graphs: its tokens must be int4's.

    python3 scratch/l2_prefetch_ab.py OUT_DIR
"""

from __future__ import annotations

import json
import sys

import torch
import triton
import triton.language as tl

import benchmarks.quant_step as quant_step
from benchmarks.env import environment
from milestones.m12_async_scheduling.fused_kernels import qk_norm_rope
from milestones.m13_quantization import SamplingParams
from milestones.m13_quantization import engine as m13_engine
from milestones.m13_quantization.epilogue_layers import EpilogueCausalLM, EpilogueQwen3Model, _on_triton

CHUNK = 8192  # bytes a bulk prefetch asks for
PER_PROGRAM = 32  # one warp, a prefetch a lane
SETTINGS = {"int4-pf-o": (0, False), "int4-pf-o16": (16 << 20, False), "int4-pf-o32": (32 << 20, False),
            "int4-pf-o16-early": (16 << 20, True)}
MODES = ("bf16", "int4", "int4-pf-o", "int4-pf-o16", "int4-pf-o32", "int4-pf-o16-early")
TOKENS: dict = {}


@triton.jit
def _prefetch_l2_kernel(ptr, nbytes, CHUNK: tl.constexpr, PER_PROGRAM: tl.constexpr):
    offs = (tl.program_id(0) * PER_PROGRAM + tl.arange(0, PER_PROGRAM)).to(tl.int64) * CHUNK
    size = tl.maximum(tl.minimum(nbytes - offs, CHUNK), 0).to(tl.int32)
    tl.inline_asm_elementwise(
        "{ .reg .pred p; setp.gt.s32 p, $2, 0; @p cp.async.bulk.prefetch.L2.global [$1], $2; mov.u32 $0, 0; }",
        "=r,l,r", [ptr + offs, size], dtype=tl.int32, is_pure=False, pack=1)


def prefetch_l2(tensor: torch.Tensor, nbytes: int | None = None) -> None:
    total = tensor.untyped_storage().nbytes() - tensor.storage_offset() * tensor.element_size()
    nbytes = min(total, nbytes if nbytes is not None else total) // 16 * 16
    raw = tensor.view(-1).view(torch.uint8) if tensor.is_contiguous() else \
        torch.empty(0, dtype=torch.uint8, device=tensor.device).set_(tensor.untyped_storage())
    _prefetch_l2_kernel[(triton.cdiv(nbytes, CHUNK * PER_PROGRAM),)](raw, nbytes, CHUNK=CHUNK,
                                                                     PER_PROGRAM=PER_PROGRAM, num_warps=1)


class PrefetchQwen3Model(EpilogueQwen3Model):
    gate_up_bytes, early = 0, False

    def attend(self, attn, x, positions, attention):
        layer = self.layers[attn.layer_idx]
        if not _on_triton(attn.o_proj):
            return super().attend(attn, x, positions, attention)
        here = torch.cuda.current_stream()
        side = self.__dict__.setdefault("_side", torch.cuda.Stream())
        if self.early:
            side.wait_stream(here)
        heads, kv_heads, dim = attn.num_heads, attn.num_kv_heads, attn.head_dim
        qkv = attn.qkv_proj(x)
        if not self.early:
            side.wait_stream(here)
        with torch.cuda.stream(side):
            prefetch_l2(attn.o_proj.qweight)
            prefetch_l2(attn.o_proj.scales)
            if self.gate_up_bytes:
                prefetch_l2(layer.mlp.gate_up_proj.qweight, self.gate_up_bytes)
                prefetch_l2(layer.mlp.gate_up_proj.scales)
        q, k = qk_norm_rope(qkv, heads, kv_heads, dim, attn.qk_norm_weight, self.rotary_emb.cos,
                            self.rotary_emb.signed_sin, positions, attn.eps)
        v = qkv[:, (heads + kv_heads) * dim:].view(-1, kv_heads, dim)
        out = attention(attn.layer_idx, q, k, v).reshape(-1, heads * dim)
        here.wait_stream(side)
        return out


def main(out_dir: str) -> None:
    plain_build = quant_step.build

    def build(mode, args):
        saved = m13_engine.LLMEngine.model_for_graphs
        try:
            if mode in SETTINGS:
                gate_up_bytes, early = SETTINGS[mode]
                decoder = type("Decoder", (PrefetchQwen3Model,), {"gate_up_bytes": gate_up_bytes, "early": early})
                lm = type("LM", (EpilogueCausalLM,), {"decoder_class": decoder})
                m13_engine.LLMEngine.model_for_graphs = lambda self: lm(self.model)
            engine = plain_build(mode, args)
        finally:
            m13_engine.LLMEngine.model_for_graphs = saved
        print(f"[{mode}] graphs record {type(engine.graph_runner.model.model).__mro__[1].__name__}", flush=True)
        if mode != "bf16":
            TOKENS[mode] = {}
            for size in (1, 2):
                prompts = [[(7 * i + 13 * j) % 1000 + 5 for j in range(24 + 5 * i)] for i in range(size)]
                outs = engine.generate(prompts, SamplingParams(max_tokens=32, ignore_eos=True), use_tqdm=False)
                TOKENS[mode][size] = [list(o.token_ids) for o in outs]
            print(f"[{mode}] tokens as int4's: {TOKENS[mode] == TOKENS.get('int4')}", flush=True)
        return engine

    for mode in MODES:
        quant_step.MODES.setdefault(mode, {"quantization": mode.split("-")[0]})
    quant_step.build = build
    quant_step.main(["--modes", ",".join(MODES), "--batches", "1,2", "--rounds", "5",
                     "--out", f"{out_dir}/m13_step_times_l2_prefetch_ab.json"])
    same = {mode: TOKENS[mode] == TOKENS["int4"] for mode in TOKENS}
    with open(f"{out_dir}/m13_l2_prefetch_tokens.json", "w") as f:
        json.dump({"env": environment("cuda"), "same_as_int4": same, "tokens": TOKENS}, f)
    print(f"tokens as int4's: {same}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else ".")
