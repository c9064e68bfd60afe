"""Megatron-style tensor parallelism for Qwen3: which slice of every weight a rank holds, and the one layer that
talks to the other ranks.

A linear layer ``y = x W^T`` can be split two ways across ``N`` ranks:

* **column-parallel**: each rank holds ``1/N`` of the *output* features (rows of ``W``). Every rank reads the
  whole input and computes its own slice of ``y``; nothing is exchanged. q/k/v (a rank's slice is whole heads)
  and gate/up (a slice of the intermediate dimension) are split this way.
* **row-parallel**: each rank holds ``1/N`` of the *input* features (columns of ``W``) and sees only its slice of
  ``x``. Its product is a *partial sum* of ``y``; one **all-reduce** adds the ``N`` partial sums, and every
  rank then holds the whole ``y``. o_proj (the columns of a rank's heads) and down_proj (of its intermediate
  slice) are split this way.

Pairing them needs one all-reduce per pair (Megatron-LM's observation): the column split's output slice is
exactly the row split's input slice, and attention (per head) and SiLU * up (per feature) work within a slice::

    x (whole, on every rank)
     -> RMSNorm (replicated)  -> q, k, v of MY heads  -> q/k norm and RoPE (per head: local)
     -> attention of MY heads over MY K/V heads (and MY share of every K/V block)
     -> o_proj over MY heads' columns = partial sum -> ALL-REDUCE -> + x            (1 per layer)
     -> RMSNorm (replicated)  -> gate, up of MY slice -> SiLU * up (per feature: local)
     -> down_proj over MY slice's columns = partial sum -> ALL-REDUCE -> + x         (1 per layer)

Every slice here is one contiguous ``1/N`` chunk of one dimension of the checkpoint's tensor: heads are
contiguous blocks of ``head_dim`` rows, so the first ``heads/N`` heads are the first ``1/N`` of q_proj's rows.
GQA is kept: rank ``r`` holds query heads ``[r H/N, (r+1) H/N)`` and K/V heads ``[r K/N, (r+1) K/N)``, and
because query head ``h`` reads K/V head ``h // (H/K)``, a rank's query heads read only its own K/V heads.

Embedding and LM head are **replicated**, not split by vocabulary (``docs/m14-tensor-parallel.md`` has the
arithmetic): every rank looks tokens up in the whole table, and only rank 0, which samples, holds and runs the
LM head. A vocabulary-parallel head would spare rank 0 reading ``(N-1)/N`` of the head per step but add a gather
of ``[rows, vocab]`` logits and, for the embedding, one more all-reduce; for Qwen3's sizes the two roughly cancel.
"""

from __future__ import annotations

import copy

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from transformers import Qwen3Config

COLUMN_PARALLEL = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")  # output features split: dim 0
ROW_PARALLEL = ("o_proj", "down_proj")  # input features split: dim 1 of the weight; the bias is whole


def head_dim_of(config: Qwen3Config) -> int:
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def valid_sizes(config: Qwen3Config) -> list[int]:
    """Every tensor-parallel size that splits this model evenly."""
    sizes = (config.num_attention_heads, config.num_key_value_heads, config.intermediate_size)
    return [n for n in range(1, config.num_key_value_heads + 1) if all(size % n == 0 for size in sizes)]


def check_tensor_parallel_size(config: Qwen3Config, world_size: int) -> None:
    """One-line ``ValueError`` unless ``world_size`` divides the heads, the K/V heads and the intermediate size."""
    for field, what in (("num_key_value_heads", "K/V heads"), ("num_attention_heads", "attention heads"),
                        ("intermediate_size", "intermediate size")):
        if getattr(config, field) % world_size:
            raise ValueError(f"tensor_parallel_size={world_size} does not divide the model's {what} ({field}="
                             f"{getattr(config, field)}): use one of {', '.join(map(str, valid_sizes(config)))}")


def shard_config(config: Qwen3Config, world_size: int) -> Qwen3Config:
    """The shape of one rank's share: ``1/N`` of the heads, K/V heads and intermediate features. Everything sized
    from the config (m01's modules, the K/V pool and its bytes per token) then comes out per rank by itself."""
    check_tensor_parallel_size(config, world_size)
    local = copy.deepcopy(config)
    local.head_dim = head_dim_of(config)  # explicit: hidden_size // (fewer heads) would be wrong
    local.num_attention_heads = config.num_attention_heads // world_size
    local.num_key_value_heads = config.num_key_value_heads // world_size
    local.intermediate_size = config.intermediate_size // world_size
    return local


def shard_dim(name: str) -> int | None:
    """The dimension of checkpoint tensor ``name`` that is split across ranks; None: every rank holds it whole."""
    module = name.rsplit(".", 2)[-2] if name.count(".") >= 2 else ""
    if module in COLUMN_PARALLEL:
        return 0  # weight [out, in] and bias [out]: their output features
    if module in ROW_PARALLEL and name.endswith(".weight"):
        return 1  # weight [out, in]: its input features
    return None  # norms, embedding, LM head, a row-parallel bias (added once, after the all-reduce)


def shard_range(full_size: int, rank: int, world_size: int) -> tuple[int, int]:
    """``[start, stop)`` of rank ``rank``'s contiguous ``1/N`` of a dimension of ``full_size``."""
    size = full_size // world_size
    return rank * size, (rank + 1) * size


class RowParallelLinear(nn.Linear):
    """``nn.Linear`` over this rank's slice of the input features: its product is a partial sum, completed by one
    all-reduce over the tensor-parallel group (the default process group); the bias is added once, after it.

    The all-reduce sums in place on the device (NCCL on GPUs, gloo on CPUs) and, in a captured decode graph, is
    recorded into it like any kernel: every rank captures the same graphs in the same order, so the collectives
    of a replay meet their partners."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        partial = F.linear(x, self.weight)
        dist.all_reduce(partial)
        return partial if self.bias is None else partial + self.bias


class NoLMHead(nn.Module):
    """A worker's LM head: none. Only rank 0 samples, so only it holds the head; the shared code that asks a
    worker for logits gets ``[rows, 0]`` (nothing computed, nothing held)."""

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return hidden.new_empty((*hidden.shape[:-1], 0))


def all_reduce_bytes_per_token(config: Qwen3Config, dtype: torch.dtype) -> tuple[int, int]:
    """(bytes of one all-reduce per token: one hidden vector; all-reduces per token: two per layer)."""
    return config.hidden_size * torch.empty((), dtype=dtype).element_size(), 2 * config.num_hidden_layers
