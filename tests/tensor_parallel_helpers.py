"""What the m14 tests run on every rank through ``engine.collective_rpc``, and an engine class for its CPU test of
the graph path. A worker imports this module to unpickle the functions, so it imports nothing heavy (not
``conftest``, which loads transformers' modelling code).
"""

from __future__ import annotations

import torch

from milestones.m14_tensor_parallel import LLMEngine


def poison_pool(engine) -> None:
    """``paged_helpers.poison`` on one rank: its K/V pool all NaN, so a slot read before it was written shows."""
    engine.kv_pool.k.fill_(float("nan"))
    engine.kv_pool.v.fill_(float("nan"))


def held_weights(engine) -> dict[str, torch.Tensor]:
    """Every weight a rank holds, by name (the big embedding as a float64 checksum)."""
    return {name: param.double().sum() if name.endswith("embed_tokens.weight") else param.detach().clone()
            for name, param in engine.model.named_parameters()}


def graph_steps(engine) -> tuple[int, int]:
    """(decode steps replayed, mixed steps run in pieces) on one rank."""
    return engine.stats.graph_steps, engine.stats.piecewise_steps


class GraphsWithoutCapture(LLMEngine):
    """m10's decode-graph runner and m12's piecewise runner on every rank, built as on a GPU but not captured: the
    CPU steps through their static buffers and pieces (the fused kernels in Triton's interpreter), as m10's and
    m12's CPU tests do."""

    def can_use_cuda_graphs(self) -> bool:
        return True

    def build_graph_runner(self, capture: bool = True):
        return super().build_graph_runner(capture=False)

    def build_piecewise_runner(self, capture: bool = True):
        return super().build_piecewise_runner(capture=False)
