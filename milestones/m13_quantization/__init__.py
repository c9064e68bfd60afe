"""m13_quantization: fewer bytes per weight and per cached token: int8/int4 weight-only matmuls and an FP8 K/V cache.

New here: ``quantize.py`` (the int8 and int4 formats, ``QuantizedLinear``), ``matmul_kernels.py`` (Triton matmuls
that unpack the weights in registers: a streaming GEMV at 1-2 rows, a tensor-core tile kernel to 16),
``swap_ab_matmul.py`` (17-512 rows: the tensor cores with W's unpacked tile as their register operand),
``weight_unpacking.py`` (how their bits become floats in registers), ``dequant_matmul.py`` (a bf16 scratch for
cuBLAS beyond 512 rows, and the float32 reference), ``gemv_epilogues.py`` (the GEMV's finish doing the small kernel
after it: SiLU * up, the add + norm) and ``epilogue_matmuls.py`` (the calls that launch it), ``launch_config.py``
(their configurations per regime), ``quantized_loader.py`` (quantizing one layer at a time as the model loads),
``epilogue_layers.py`` (m12's fused decoder with those epilogues, for the decode graphs; at 1-4 rows x as 16-bit
integers, ``integer_dots.py``, made where x is made, ``integer_norm.py``, ``integer_heads.py``, a GEMV's slices
added by its reader, ``sliced_sums.py``, the norm's 1 / rms left to its reader, ``deferred_norm.py``, and K/V
written by RoPE, ``kv_at_rope.py``), ``fp8_kv_cache.py`` (the
K/V cache in float8 e4m3 with per-layer scales), ``accuracy.py`` (logits of a quantized engine against the
unquantized one) and ``config.py`` / ``engine.py`` (``quantization``, ``kv_cache_dtype``, ``calculate_kv_scales``:
vLLM's names).
"""

from milestones.m12_async_scheduling import RequestOutput, SamplingParams

from .config import EngineConfig
from .engine import LLMEngine

__all__ = ["EngineConfig", "LLMEngine", "RequestOutput", "SamplingParams"]
