"""m08's config: m07's plus the attention backend."""

from __future__ import annotations

from dataclasses import dataclass, field

from milestones.m01_naive_loop.config import one_of
from milestones.m07_chunked_prefill.config import EngineConfig as ChunkedPrefillConfig

ATTENTION_BACKENDS = ("auto", "torch", "triton")


@dataclass
class EngineConfig(ChunkedPrefillConfig):
    """``attention_backend``: who computes decode attention.

    * ``triton``: the paged decode kernel (``paged_decode_kernel.py``), reading K/V in place through the block
      tables; on a CPU in Triton's interpreter (exact, and very slow);
    * ``torch``: m05's gather + ``scaled_dot_product_attention`` path;
    * ``auto`` (default): ``triton`` on a CUDA GPU where Triton is installed, ``torch`` everywhere else.

    Prompt chunks always take the torch path: many queries per sequence are a matrix product, which
    ``scaled_dot_product_attention``'s kernels already do well."""

    attention_backend: str = field(default="auto", metadata=one_of(*ATTENTION_BACKENDS))
