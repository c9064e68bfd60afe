"""m08's engine: m07's, with decode attention (and the K/V store) in Triton when the backend says so.

The scheduler, the packed batch and the metadata are m07's. What changes is the per-step attention callable:
``TritonPagedAttention`` sends the step's decodes to the paged decode kernel and leaves prompt chunks on m05's
torch path. ``attention_backend`` is resolved once at start: ``auto`` takes Triton on a CUDA GPU (if Triton is
installed) and torch anywhere else, so the engine keeps working on a laptop.
"""

from __future__ import annotations

import importlib.util

from milestones.m05_paged_blocks.paged_attention import AttentionMetadata
from milestones.m07_chunked_prefill.engine import LLMEngine as ChunkedPrefillEngine

from .attention import TritonPagedAttention
from .config import EngineConfig


def triton_unavailable_reason(device_type: str) -> str | None:
    """None if the Triton kernels can run on this device type; otherwise why not. On a CPU they run in Triton's
    interpreter, chosen at each launch (``device_kernel.py``)."""
    if importlib.util.find_spec("triton") is None:
        return "Triton is not installed (pip install 'nanoserve[kernels]')"
    if device_type == "cuda":
        return None
    from .device_kernel import interpreter_problem  # imports triton: only once it is known to be there

    return interpreter_problem()


class LLMEngine(ChunkedPrefillEngine):
    milestone = "m08_triton_kernel"
    config: EngineConfig

    def __init__(self, config: EngineConfig | None = None) -> None:
        super().__init__(config if config is not None else EngineConfig())
        self.attention_backend = self.resolve_attention_backend()

    def resolve_attention_backend(self) -> str:
        wanted = self.config.attention_backend
        if wanted == "torch":
            return "torch"
        reason = triton_unavailable_reason(self.device.type)
        if wanted == "auto":
            return "triton" if self.device.type == "cuda" and reason is None else "torch"
        if reason is not None:
            raise ValueError(f"attention_backend='triton' cannot run on {self.device}: {reason}")
        return "triton"

    def make_attention(self, metadata: AttentionMetadata):
        if self.attention_backend == "triton":
            return TritonPagedAttention(self.kv_pool, metadata)
        return super().make_attention(metadata)
