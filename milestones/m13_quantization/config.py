"""m13's config: the previous milestone's plus how weights and K/V are stored (vLLM's names)."""

from __future__ import annotations

from dataclasses import dataclass

from milestones.m12_async_scheduling import EngineConfig as PreviousConfig

from .quantize import QUANTIZATION_METHODS

KV_CACHE_DTYPES = ("auto", "fp8", "fp8_e4m3")


@dataclass
class EngineConfig(PreviousConfig):
    """* ``quantization``: ``None`` (weights in ``dtype``), ``"int8"`` (one byte per weight, a float32 scale per
      output row) or ``"int4"`` (half a byte per weight, a float32 scale per 128 inputs of a row). Weight-only:
      activations, the K/V cache and the embedding stay in ``dtype``; every linear layer of the decoder layers
      and an untied LM head are quantized at load.
    * ``kv_cache_dtype``: ``"auto"`` (the K/V cache in ``dtype``) or ``"fp8"`` / ``"fp8_e4m3"`` (float8 e4m3,
      one byte per value, with a float32 scale per layer for K and one for V): the same memory holds about twice
      the tokens of a bf16 cache.
    * ``calculate_kv_scales``: with an FP8 cache, set each layer's scales from the K/V of the first prompt the
      engine runs (``max |k| / 200``, ``max |v| / 100``, as vLLM does); otherwise they stay 1.0 (vLLM's
      default)."""

    quantization: str | None = None
    kv_cache_dtype: str = "auto"
    calculate_kv_scales: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.quantization is not None and self.quantization not in QUANTIZATION_METHODS:
            raise ValueError(f"unknown quantization {self.quantization!r}: use None, "
                             f"{' or '.join(repr(m) for m in QUANTIZATION_METHODS)}")
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            hint = " (e5m2 is not supported here)" if self.kv_cache_dtype == "fp8_e5m2" else ""
            raise ValueError(f"unknown kv_cache_dtype {self.kv_cache_dtype!r}{hint}: use "
                             f"{', '.join(repr(d) for d in KV_CACHE_DTYPES)}")
        if not isinstance(self.calculate_kv_scales, bool):
            raise ValueError(f"calculate_kv_scales must be True or False, got {self.calculate_kv_scales!r}")
        if self.calculate_kv_scales and self.kv_cache_dtype == "auto":
            raise ValueError("calculate_kv_scales needs an FP8 K/V cache (kv_cache_dtype='fp8')")

    @property
    def kv_cache_fp8(self) -> bool:
        return self.kv_cache_dtype != "auto"
