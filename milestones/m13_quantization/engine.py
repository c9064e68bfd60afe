"""m13's engine: the previous milestone's, with weights and K/V stored in fewer bytes.

Four overrides, the first three at the moment their memory is decided:

* ``load_model`` (m01's seam, before anything else is sized): with ``quantization`` set, a preset is built and
  quantized one decoder layer at a time, a checkpoint loaded and then quantized layer by layer
  (``quantized_loader.py``); from then on every linear layer is a ``QuantizedLinear`` whose matmul unpacks the
  weight in registers (``matmul_kernels.py``). The K/V budget below is then sized with the smaller weights in
  memory, as vLLM profiles after loading.
* ``make_kv_pool`` (m04's seam): with ``kv_cache_dtype="fp8"``, an ``FP8PagedKVCache``; ``kv_bytes_per_token``
  halves, so the same budget buys twice the blocks. Every path that stores or reads K/V asks the cache
  (``write`` / ``gather`` on the torch path, ``kernel_scales`` for m08's kernels and m10's graphs).
* ``make_attention`` (m05's seam): while an FP8 cache still waits for its scales (``calculate_kv_scales``),
  the step stores through the cache's torch ``write``, which sets them from the K/V it is given, and runs
  eagerly (``replays_mixed_steps``: m12's graphs store through the kernels). That is the engine's first step.
* ``model_for_graphs`` (m10's seam): a quantized engine's decode graphs record ``EpilogueQwen3Model``, m12's fused
  layers whose GEMVs finish the small kernel after them (``epilogue_layers.py``).

Nothing else changes: the scheduler and the blocks work as before, on fewer bytes.
"""

from __future__ import annotations

import logging

import torch

from milestones.m01_naive_loop.loader import PRESETS, LoadedModel
from milestones.m04_continuous_batching.kv_pool import KVPool
from milestones.m05_paged_blocks.paged_attention import AttentionMetadata, PagedAttention
from milestones.m12_async_scheduling import LLMEngine as PreviousEngine

from .config import EngineConfig
from .epilogue_layers import EpilogueCausalLM
from .fp8_kv_cache import FP8_DTYPE, FP8PagedKVCache, fp8_unsupported_reason
from .quantize import bytes_per_weight
from .quantized_loader import check_quantizable, load_preset_quantized, quantize_model_, weight_bytes

logger = logging.getLogger(__name__)


def format_bytes(num_bytes: float) -> str:
    """``209190912`` -> ``"199.5 MiB"``: the largest binary unit that leaves a number >= 1."""
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if num_bytes >= size:
            return f"{num_bytes / size:,.1f} {unit}"
    return f"{num_bytes:,.0f} bytes"


class LLMEngine(PreviousEngine):
    milestone = "m13_quantization"
    config: EngineConfig

    def __init__(self, config: EngineConfig | None = None) -> None:
        super().__init__(config if config is not None else EngineConfig())
        logger.info(self.describe_weights())

    # ------------------------------------------------------------------ weights

    @property
    def matmul_kernel(self) -> str:
        """Who runs the quantized matmuls: the Triton kernels on a GPU; on a CPU the torch reference (dequantize,
        then ``F.linear``), since Triton's interpreter would take minutes per step."""
        return "triton" if self.device.type == "cuda" else "torch"

    def load_model(self) -> LoadedModel:
        self.check_kv_cache_dtype()  # refuse an FP8 cache the device cannot run before loading anything
        method = self.config.quantization
        if method is None:
            return super().load_model()
        if self.config.model in PRESETS:
            return load_preset_quantized(self.config.model, self.device, self.dtype, self.config.seed, method,
                                         self.matmul_kernel)
        loaded = super().load_model()
        check_quantizable(loaded.config, method)
        quantize_model_(loaded.model, method, self.matmul_kernel)
        if self.device.type == "cuda":
            torch.cuda.empty_cache()  # the bf16 matrices just freed: give them back before K/V is sized
        return loaded

    def model_for_graphs(self):
        """Quantized: m12's fused layers whose GEMVs finish SiLU * up, and at one row the add + norm, after them
        (``epilogue_layers``)."""
        if self.config.quantization is None:
            return super().model_for_graphs()
        return EpilogueCausalLM(self.model)

    def describe_weights(self) -> str:
        sizes = weight_bytes(self.model)
        method = self.config.quantization or str(self.dtype).removeprefix("torch.")
        return (f"weights: linear layers {format_bytes(sizes['linear'])} in {method} "
                f"({bytes_per_weight(self.config.quantization, self.dtype):.3g} bytes per weight), embedding "
                f"{format_bytes(sizes['embedding'])}, norms {format_bytes(sizes['other'])}"
                + ("" if self.config.quantization is None else f"; matmuls: {self.matmul_kernel}"))

    # ------------------------------------------------------------------ K/V

    def check_kv_cache_dtype(self) -> None:
        if not self.config.kv_cache_fp8:
            return
        backend = self.config.attention_backend
        uses_triton = backend == "triton" or (backend == "auto" and self.device.type == "cuda")
        reason = fp8_unsupported_reason(self.device, "triton" if uses_triton else "torch")
        if reason is not None:
            raise ValueError(f"kv_cache_dtype={self.config.kv_cache_dtype!r} cannot run here: {reason}")

    def make_kv_pool(self):
        if not self.config.kv_cache_fp8:
            return super().make_kv_pool()
        self.kv_bytes_per_token = KVPool.bytes_per_token(self.model_config, FP8_DTYPE)
        pool = FP8PagedKVCache.for_model(self.model_config, self.resolve_num_blocks(), self.config.block_size,
                                         self.dtype, self.device)
        if self.config.calculate_kv_scales:
            pool.calculate_scales_on_first_write()
        return pool

    def replays_mixed_steps(self) -> bool:
        return super().replays_mixed_steps() and not getattr(self.kv_pool, "needs_scales", False)

    def make_attention(self, metadata: AttentionMetadata):
        if getattr(self.kv_pool, "needs_scales", False):
            return PagedAttention(self.kv_pool, metadata)  # torch store: the cache sets its scales as it writes
        return super().make_attention(metadata)
