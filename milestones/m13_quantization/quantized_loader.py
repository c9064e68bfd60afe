"""Quantizing at load, one decoder layer at a time: the bf16 weights of the whole model never exist at once.

Per decoder layer: its weights are made (a preset's seeded random values, drawn on the device) or already
loaded (a checkpoint, through m01's loader), q/k/v and gate/up are packed into one matrix each (m10's
``PackedAttention`` / ``PackedMLP``), and the four matrices are quantized (``QuantizedLinear``); the layer's
bf16 matrices are then dropped. An untied LM head is quantized the same way; the embedding is not (a step
reads only one of its rows per token).

Peak memory while loading a preset: the quantized layers so far, plus one layer (and the embedding and the
head) in bf16. Qwen3-8B in int4: about 7 GB, against 33 GB for m01's float32-first build of the same preset.
A checkpoint is loaded whole by m01's loader first (its bf16 size at the peak), then quantized layer by layer.

The random values are exactly m01's (``init_random_``): the same generator, the same tensors in the same
order (every parameter of ``named_parameters()``, norms set to 1.0), so a quantized engine and an unquantized
one built from the same preset and seed hold the same weights, and their logits can be compared.
"""

from __future__ import annotations

import torch
from torch import nn

from milestones.m01_naive_loop.loader import LoadedModel, preset_config
from milestones.m01_naive_loop.model import Qwen3ForCausalLM, RotaryEmbedding, rope_theta
from milestones.m10_cuda_graphs.packed_layers import PackedAttention, PackedMLP

from .quantize import QuantizedLinear, check_groupable, check_method


def check_quantizable(config, method: str) -> None:
    """Refuse, before any work, a model whose layers int4 cannot group (in_features not a multiple of 128)."""
    check_method(method)
    if method != "int4":
        return
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    inputs = {"qkv_proj / gate_up_proj (hidden_size)": config.hidden_size,
              "o_proj (num_attention_heads * head_dim)": config.num_attention_heads * head_dim,
              "down_proj (intermediate_size)": config.intermediate_size}
    for name, in_features in inputs.items():
        check_groupable(in_features, name)


@torch.no_grad()
def quantize_layer_(layer: nn.Module, method: str, kernel: str) -> None:
    """Pack one decoder layer's projections (if not yet packed) and quantize its four matrices, in place."""
    attn = layer.self_attn if isinstance(layer.self_attn, PackedAttention) else PackedAttention(layer.self_attn)
    mlp = layer.mlp if isinstance(layer.mlp, PackedMLP) else PackedMLP(layer.mlp)
    attn.qkv_proj = QuantizedLinear.from_linear(attn.qkv_proj, method, kernel)
    attn.o_proj = QuantizedLinear.from_linear(attn.o_proj, method, kernel)
    mlp.gate_up_proj = QuantizedLinear.from_linear(mlp.gate_up_proj, method, kernel)
    mlp.down_proj = QuantizedLinear.from_linear(mlp.down_proj, method, kernel)
    layer.self_attn, layer.mlp = attn, mlp


@torch.no_grad()
def quantize_model_(model: Qwen3ForCausalLM, method: str, kernel: str) -> Qwen3ForCausalLM:
    """Every decoder layer, then an untied LM head (a tied one is the embedding, which stays as it is)."""
    check_quantizable(model.config, method)
    for layer in model.model.layers:
        quantize_layer_(layer, method, kernel)
    if not model.config.tie_word_embeddings:
        model.lm_head = QuantizedLinear.from_linear(model.lm_head, method, kernel)
    return model


def _materialize_(root: nn.Module, module: nn.Module, prefix: str, device: torch.device, dtype: torch.dtype,
                  generator: torch.Generator, std: float) -> None:
    """Give every parameter of ``module`` (still on the meta device) real memory and m01's random values."""
    for name, meta in list(module.named_parameters(prefix=prefix)):
        tensor = torch.empty(meta.shape, dtype=dtype, device=device)
        if name.endswith("norm.weight"):
            tensor.fill_(1.0)
        else:
            tensor.normal_(0.0, std, generator=generator)
        owner, _, attribute = name.rpartition(".")
        setattr(root.get_submodule(owner), attribute, nn.Parameter(tensor, requires_grad=False))


@torch.no_grad()
def load_preset_quantized(name: str, device: torch.device, dtype: torch.dtype, seed: int, method: str,
                          kernel: str) -> LoadedModel:
    """A preset built layer by layer on ``device``, each decoder layer quantized as soon as it exists."""
    config = preset_config(name)
    check_quantizable(config, method)
    with torch.device("meta"):
        model = Qwen3ForCausalLM(config)
    generator = torch.Generator(device=device).manual_seed(seed)
    std = config.initializer_range
    # m01's init_random_ draws in named_parameters() order: the embedding, each layer, the final norm, the head.
    _materialize_(model, model.model.embed_tokens, "model.embed_tokens", device, dtype, generator, std)
    for i, layer in enumerate(model.model.layers):
        _materialize_(model, layer, f"model.layers.{i}", device, dtype, generator, std)
        quantize_layer_(layer, method, kernel)
    _materialize_(model, model.model.norm, "model.norm", device, dtype, generator, std)
    if config.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    else:
        _materialize_(model, model.lm_head, "lm_head", device, dtype, generator, std)
        model.lm_head = QuantizedLinear.from_linear(model.lm_head, method, kernel)
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    with torch.device(device):  # its tables are computed in __init__: the meta ones hold nothing
        model.model.rotary_emb = RotaryEmbedding(head_dim, config.max_position_embeddings, rope_theta(config))
    model.model.rotary_emb.to(dtype)
    return LoadedModel(model.eval().requires_grad_(False), config, None)


def weight_bytes(model: nn.Module) -> dict[str, int]:
    """Bytes of the model's weights by kind: ``linear`` (the decoder layers' matrices and an untied head, scales
    included), ``embedding``, ``other`` (norms, q/k norm tables)."""
    linear = sum(m.weight_bytes for m in model.modules() if isinstance(m, QuantizedLinear))
    seen = set()
    embedding = other = 0
    for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
        if id(tensor) in seen or name.endswith(("qweight", "scales")) or "rotary_emb" in name:
            continue
        seen.add(id(tensor))
        size = tensor.numel() * tensor.element_size()
        if name.endswith("embed_tokens.weight"):
            embedding += size
        elif tensor.dim() == 2 and not name.endswith("qk_norm_weight"):
            linear += size
        else:
            other += size
    return {"linear": linear, "embedding": embedding, "other": other}
