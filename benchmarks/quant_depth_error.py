"""How far int8 / int4 weights alone move a random Qwen3-8B's logits: its 36 layers in float32, one at a time, on a CPU.

    python -m benchmarks.quant_depth_error [LAYERS] [--out DIR]   # ~15-25 min on 2 CPU cores, ~4 GB of memory

Each decoder layer is drawn as the preset draws it, run on the reference hidden states, then quantized by the torch
reference (``quantize_weight``, dequantized to float32) and run on each format's own stream; the layer is then
dropped, so the 8B model never exists whole. It tells what the format does from what a kernel might get wrong.
``--out DIR`` writes ``DIR/cpu/quant_depth_error.json``: one matmul's weight error (layer 0's), the hidden
state's error after every layer, and ``accuracy.logit_error`` of the final logits (8 positions of one prompt).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from milestones.m01_naive_loop.loader import preset_config
from milestones.m01_naive_loop.model import Qwen3DecoderLayer, RotaryEmbedding, rope_theta
from milestones.m13_quantization.accuracy import logit_error
from milestones.m13_quantization.quantize import dequantize_weight, quantize_weight

from .env import environment, write_json

POSITIONS = 8  # one causal prompt of 8 tokens
FORMATS = ("int8", "int4")


def attention(layer_idx: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Causal attention over the one prompt (``[T, heads, dim]``), K/V heads repeated for grouped queries."""
    repeat = q.shape[-2] // k.shape[-2]
    k, v = (t.repeat_interleave(repeat, -2).transpose(0, 1) for t in (k, v))
    return F.scaled_dot_product_attention(q.transpose(0, 1), k, v, is_causal=True).transpose(0, 1)


def quantize_linears_(module: nn.Module, method: str) -> list[float]:
    """Replace every linear weight by its quantized-then-dequantized copy; each one's relative error."""
    errors = []
    for linear in (m for m in module.modules() if isinstance(m, nn.Linear)):
        weight = linear.weight.data
        linear.weight.data = dequantize_weight(*quantize_weight(weight, method), method, torch.float32)
        errors.append(((linear.weight.data - weight).norm() / weight.norm()).item())
    return errors


@torch.no_grad()
def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.quant_depth_error", description=__doc__.split("\n")[0])
    parser.add_argument("layers", type=int, nargs="?", default=None, help="layers to run (default: all 36)")
    parser.add_argument("--out", type=Path, default=None, help="write <out>/cpu/quant_depth_error.json")
    args = parser.parse_args(argv)
    torch.set_num_threads(min(2, torch.get_num_threads()))
    cfg = preset_config("qwen3-8b-random")
    num_layers, std = args.layers or cfg.num_hidden_layers, cfg.initializer_range
    record = {"benchmark": "quant_depth_error", "model": "qwen3-8b-random", "dtype": "float32", "positions": POSITIONS,
              "layers": num_layers, "weight_rel_err": {}, "hidden_rel_err": {m: [] for m in FORMATS}, "logit_error": {}}
    gen = torch.Generator().manual_seed(0)
    embedded = torch.empty(POSITIONS, cfg.hidden_size).normal_(0, std, generator=gen)
    x = {m: embedded.clone() for m in ("ref", *FORMATS)}
    rope = RotaryEmbedding(128, 64, rope_theta(cfg)).lookup(torch.arange(POSITIONS))
    for i in range(num_layers):
        began = time.time()
        layer = Qwen3DecoderLayer(cfg, i)
        for name, p in layer.named_parameters():  # as the preset draws them: norms 1.0, the rest normal
            if name.endswith("norm.weight"):
                p.data.fill_(1.0)
            else:
                p.data.normal_(0, std, generator=gen)
        drawn = {n: p.data.clone() for n, p in layer.named_parameters()}
        x["ref"] = layer(x["ref"], rope, attention)
        for m in FORMATS:
            for n, p in layer.named_parameters():
                p.data = drawn[n].clone()
            errors = quantize_linears_(layer, m)
            if i == 0:
                record["weight_rel_err"][m] = sum(errors) / len(errors)
            x[m] = layer(x[m], rope, attention)
            record["hidden_rel_err"][m].append(((x[m] - x["ref"]).norm() / x["ref"].norm()).item())
        rel = {m: record["hidden_rel_err"][m][-1] for m in FORMATS}
        print(f"layer {i}: |x| {x['ref'].norm().item():.3g} hidden rel err int8 {rel['int8']:.4f} int4 "
              f"{rel['int4']:.4f} ({time.time() - began:.1f}s)", flush=True)
    head = torch.empty(cfg.vocab_size, cfg.hidden_size).normal_(0, std, generator=gen)
    reference = F.rms_norm(x["ref"], (cfg.hidden_size,), None, cfg.rms_norm_eps) @ head.T
    for m in FORMATS:
        logits = F.rms_norm(x[m], (cfg.hidden_size,), None, cfg.rms_norm_eps) @ dequantize_weight(
            *quantize_weight(head, m), m).T
        error = logit_error(reference, logits)
        record["logit_error"][m] = error.as_dict()
        print(m, "logits:", error, flush=True)
    if args.out is not None:
        record["env"] = environment("cpu")
        print(f"wrote {write_json(record, args.out / 'cpu' / 'quant_depth_error.json')}")
    return record


if __name__ == "__main__":
    main()
