"""Loading one rank's share of the model, tensor by tensor: no rank ever holds the whole model.

The rank's model is m01's ``Qwen3ForCausalLM`` built from ``shard_config`` (``1/N`` of the heads, K/V heads and
intermediate features), first on the meta device (shapes, no memory), with o_proj and down_proj made
``RowParallelLinear``. Then every parameter gets real memory, filled from one of two sources:

* **a checkpoint**: ``safe_open(...).get_slice(name)`` reads only this rank's rows (column-parallel) or
  columns (row-parallel) of each tensor from the memory-mapped file, never the rest;
* **a random preset**: m01's ``init_random_`` draws every parameter, in ``named_parameters()`` order, from one
  seeded generator on the device. To hold the same weights as one rank would, each rank draws the same full
  tensors in the same order (one at a time: at most one full matrix exists) and keeps its slice. So TP=2 and
  TP=1 compute the same function, and their tokens can be compared.

Rank 0 also holds the LM head (untied: read or drawn; tied: the embedding it holds anyway); a worker gets
``NoLMHead``. The head comes last in m01's order, so a worker that skips drawing it changes no other draw.
"""

from __future__ import annotations

from contextlib import ExitStack
from pathlib import Path

import torch
from safetensors import safe_open
from torch import nn
from transformers import Qwen3Config

from milestones.m01_naive_loop.loader import LoadedModel, build_model, preset_config
from milestones.m01_naive_loop.model import Qwen3ForCausalLM, RotaryEmbedding, rope_theta

from .parallel_layers import NoLMHead, RowParallelLinear, head_dim_of, shard_config, shard_dim, shard_range


def full_config(model: str, checkpoint: Path | None) -> Qwen3Config:
    """The whole model's config: a preset's, or the checkpoint's ``config.json``."""
    return preset_config(model) if checkpoint is None else Qwen3Config.from_pretrained(checkpoint)


class RandomShards:
    """m01's seeded random weights, drawn whole on the device, sliced."""

    def __init__(self, seed: int, std: float, device: torch.device, dtype: torch.dtype) -> None:
        self.generator = torch.Generator(device=device).manual_seed(seed)
        self.std, self.device, self.dtype = std, device, dtype

    def read(self, name: str, shape: torch.Size, dim: int | None, rank: int, world_size: int) -> torch.Tensor:
        full = torch.empty(shape, dtype=self.dtype, device=self.device)
        if name.endswith("norm.weight"):
            full.fill_(1.0)
        else:
            full.normal_(0.0, self.std, generator=self.generator)
        if dim is None or world_size == 1:
            return full
        start, stop = shard_range(shape[dim], rank, world_size)
        return full.narrow(dim, start, stop - start).clone()  # the full tensor is freed on return


class CheckpointShards:
    """Slices read from the ``*.safetensors`` files of a checkpoint directory (memory-mapped: only the bytes of
    the slice are read)."""

    def __init__(self, directory: Path, files: ExitStack, device: torch.device, dtype: torch.dtype) -> None:
        self.device, self.dtype, self.where = device, dtype, {}
        for path in sorted(directory.glob("*.safetensors")):
            handle = files.enter_context(safe_open(str(path), framework="pt", device="cpu"))
            for name in handle.keys():
                self.where[name] = (path.name, handle)

    def read(self, name: str, shape: torch.Size, dim: int | None, rank: int, world_size: int) -> torch.Tensor:
        if name not in self.where:
            raise ValueError(f"the checkpoint lacks tensor {name!r}")
        file_name, handle = self.where[name]
        tensor_slice = handle.get_slice(name)
        found = tuple(tensor_slice.get_shape())
        if found != tuple(shape):
            raise ValueError(f"{file_name}: {name!r} has shape {found}, config.json implies {tuple(shape)}")
        if dim is None:
            part = tensor_slice[:]
        else:
            start, stop = shard_range(shape[dim], rank, world_size)
            part = tensor_slice[start:stop] if dim == 0 else tensor_slice[:, start:stop]
        return part.to(self.device, self.dtype)

    def check_no_extra(self, expected: set[str], tied: bool) -> None:
        extra = sorted(set(self.where) - expected - ({"lm_head.weight"} if tied else set()))
        if extra:
            file_name = self.where[extra[0]][0]
            raise ValueError(f"{file_name}: unexpected tensor {extra[0]!r} for a Qwen3 model")


def meta_model(config: Qwen3Config) -> Qwen3ForCausalLM:
    """m01's model of this shape on the meta device (no memory), o_proj and down_proj row-parallel."""
    model = build_model(config, torch.device("meta"), torch.float32)
    with torch.device("meta"):
        for layer in model.model.layers:
            for parent, name in ((layer.self_attn, "o_proj"), (layer.mlp, "down_proj")):
                linear = getattr(parent, name)
                setattr(parent, name, RowParallelLinear(linear.in_features, linear.out_features,
                                                        bias=linear.bias is not None))
    return model


@torch.no_grad()
def load_shard(model: str, checkpoint: Path | None, rank: int, world_size: int, device: torch.device,
               dtype: torch.dtype, seed: int) -> LoadedModel:
    """Rank ``rank``'s share of ``model`` (a preset when ``checkpoint`` is None), on ``device`` in ``dtype``."""
    config = full_config(model, checkpoint)
    local = meta_model(shard_config(config, world_size))
    whole = meta_model(config)  # names and full shapes, in m01's order; holds no memory
    tied = config.tie_word_embeddings
    with ExitStack() as files:
        if checkpoint is None:
            source = RandomShards(seed, config.initializer_range, device, dtype)
        else:
            source = CheckpointShards(checkpoint, files, device, dtype)
            source.check_no_extra({name for name, _ in whole.named_parameters()}, tied)
        for name, full in whole.named_parameters():
            if name == "lm_head.weight" and rank > 0:
                continue  # untied head: rank 0's alone
            tensor = source.read(name, full.shape, shard_dim(name), rank, world_size)
            owner, _, attribute = name.rpartition(".")
            setattr(local.get_submodule(owner), attribute, nn.Parameter(tensor, requires_grad=False))
    if rank > 0:
        local.lm_head = NoLMHead()
    elif tied:
        local.lm_head.weight = local.model.embed_tokens.weight
    with torch.device(device):  # the tables are computed in __init__: the meta ones hold nothing
        rotary = RotaryEmbedding(head_dim_of(config), config.max_position_embeddings, rope_theta(config))
    local.model.rotary_emb = rotary.to(dtype)
    return LoadedModel(local.eval().requires_grad_(False), local.config, checkpoint)


def weights_held(engine) -> dict[str, torch.Tensor]:
    """Every weight one rank holds, by name, copied (run on every rank through ``collective_rpc``: the tests and
    the notebook put the ranks' slices back together and compare them with one rank's weights)."""
    return {name: param.detach().clone() for name, param in engine.model.named_parameters()}


LAYER_WEIGHTS = {"q/k/v (packed)": "self_attn.qkv_proj", "o_proj": "self_attn.o_proj",
                 "gate/up (packed)": "mlp.gate_up_proj", "down_proj": "mlp.down_proj"}


def describe_shard(engine) -> dict:
    """What one rank holds (run on every rank through ``collective_rpc``): its device, the shape of each of a
    decoder layer's matrices, the embedding and LM head, and the bytes of all its weights (a tied head counted
    once) and of its K/V per token."""
    model, layer = engine.model, engine.model.model.layers[0]
    held = {id(p): p.numel() * p.element_size() for p in model.parameters()}  # a tied head is one tensor
    head = getattr(model.lm_head, "weight", None)
    row = {"rank": engine.parallel.rank if engine.parallel is not None else 0, "device": str(engine.device)}
    for label, path in LAYER_WEIGHTS.items():
        row[label] = "x".join(map(str, layer.get_submodule(path).weight.shape))
    row["embedding"] = "x".join(map(str, model.model.embed_tokens.weight.shape))
    row["LM head"] = "none" if head is None else ("the embedding" if head is model.model.embed_tokens.weight
                                                  else "x".join(map(str, head.shape)))
    row["weights (MiB)"] = sum(held.values()) / 2**20
    row["K/V bytes per token"] = engine.kv_bytes_per_token
    return row
