"""How far int8 / int4 weights alone move a random Qwen3-8B's logits: its 36 layers in float32, one at a time, on a CPU.

    python -m benchmarks.quant_depth_error [LAYERS] [--out DIR]   # ~15-25 min on 2 CPU cores, ~4 GB of memory

Each decoder layer is drawn (normal, std initializer_range, norms 1.0, as the preset), run on the reference
hidden states, then quantized (``quantize_weight``, dequantized back to float32: the torch reference of the
kernels) and run on each quantized stream's own hidden states; the layer is then dropped, so the 8B model never
exists whole. Printed: each stream's relative error of the hidden state after every layer, then ``accuracy``'s
``logit_error`` of the final logits (8 positions of one causal prompt). It tells a kernel bug from what the
format does: on the H200, quant_step measured int8 rel_rms 0.146 / top-1 66% and int4 1.07 / 0% against bf16.
``--out DIR`` also writes ``DIR/cpu/quant_depth_error.json``: each format's relative error of one matmul's weights
(layer 0's, ``weight_rel_err``), of the hidden state after every layer, and of the logits.
"""
import argparse
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from milestones.m01_naive_loop.loader import preset_config
from milestones.m01_naive_loop.model import Qwen3DecoderLayer, RotaryEmbedding, rope_theta
from milestones.m13_quantization.quantize import quantize_weight, dequantize_weight
from milestones.m13_quantization.accuracy import logit_error

from .env import environment, write_json


T_POSITIONS = 8  # one causal prompt of 8 tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("layers", type=int, nargs="?", default=None, help="layers to run (default: all 36)")
    parser.add_argument("--out", type=Path, default=None, help="write <out>/cpu/quant_depth_error.json")
    args = parser.parse_args()
    torch.set_num_threads(min(2, torch.get_num_threads()))
    cfg = preset_config("qwen3-8b-random")
    L = args.layers or cfg.num_hidden_layers
    record = {"benchmark": "quant_depth_error", "model": "qwen3-8b-random", "dtype": "float32", "positions": T_POSITIONS,
              "layers": L, "weight_rel_err": {}, "hidden_rel_err": {"int8": [], "int4": []}, "logit_error": {}}
    T = T_POSITIONS
    g = torch.Generator().manual_seed(0)
    std = cfg.initializer_range
    emb_rows = torch.empty(T, cfg.hidden_size).normal_(0, std, generator=g)
    x = {m: emb_rows.clone() for m in ("ref", "int8", "int4")}
    rope = RotaryEmbedding(128, 64, rope_theta(cfg)).lookup(torch.arange(T))
    def attention(i, q, k, v):
        rep = q.shape[-2] // k.shape[-2]
        k = k.repeat_interleave(rep, -2); v = v.repeat_interleave(rep, -2)
        o = F.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), is_causal=True)
        return o.transpose(0, 1)
    def fill(module):
        for name, p in module.named_parameters():
            if name.endswith("norm.weight"): p.data.fill_(1.0)
            else: p.data.normal_(0, std, generator=g)
    def quantized_copy(module, method):
        errors = []
        for lin in [m for m in module.modules() if isinstance(m, nn.Linear)]:
            q, s = quantize_weight(lin.weight.data, method)
            quantized = dequantize_weight(q, s, method, torch.float32)
            errors.append(((quantized - lin.weight.data).norm() / lin.weight.data.norm()).item())
            lin.weight.data = quantized
        return errors
    with torch.no_grad():
        for i in range(L):
            t0 = time.time()
            layer = Qwen3DecoderLayer(cfg, i); fill(layer)
            ref_w = {n: p.data.clone() for n, p in layer.named_parameters()}
            x["ref"] = layer(x["ref"], rope, attention)
            for m in ("int8", "int4"):
                for n, p in layer.named_parameters(): p.data = ref_w[n].clone()
                errors = quantized_copy(layer, m)
                if i == 0:
                    record["weight_rel_err"][m] = sum(errors) / len(errors)
                x[m] = layer(x[m], rope, attention)
            rel = {m: ((x[m] - x["ref"]).norm() / x["ref"].norm()).item() for m in ("int8", "int4")}
            for m in rel:
                record["hidden_rel_err"][m].append(rel[m])
            print(f"layer {i}: |x| {x['ref'].norm().item():.3g} hidden rel err int8 {rel['int8']:.4f} int4 {rel['int4']:.4f} ({time.time()-t0:.1f}s)", flush=True)
        head = torch.empty(cfg.vocab_size, cfg.hidden_size).normal_(0, std, generator=g)
        norm = lambda h: F.rms_norm(h, (h.shape[-1],), None, cfg.rms_norm_eps)
        ref_logits = norm(x["ref"]) @ head.T
        for m in ("int8", "int4"):
            q, s = quantize_weight(head, m)
            logits = norm(x[m]) @ dequantize_weight(q, s, m).T
            error = logit_error(ref_logits, logits)
            record["logit_error"][m] = error.as_dict()
            print(m, "logits:", error, flush=True)
    if args.out is not None:
        record["env"] = environment("cpu")
        print(f"wrote {write_json(record, args.out / 'cpu' / 'quant_depth_error.json')}")


if __name__ == "__main__":
    main()
