"""m08_triton_kernel: a Triton paged-attention decode kernel reads K/V in place through the block tables.

New here: ``paged_decode_kernel.py`` (the decode kernel: grouped-query heads per program, online softmax,
split-K for long contexts at small batch), ``launch_config.py`` (its configuration per regime, split or direct),
``store_kv_kernel.py`` (the step's K/V into the cache in one launch), ``device_kernel.py`` (each launch
compiled for a GPU or interpreted on a CPU, by its tensors' device), ``attention.py`` (decodes to the kernel,
prompt chunks to m05's torch path, in one step) and ``config.py`` / ``engine.py`` (``attention_backend``: auto,
torch, triton).
"""

from milestones.m01_naive_loop import SamplingParams
from milestones.m06_prefix_cache import RequestOutput

from .config import EngineConfig
from .engine import LLMEngine

__all__ = ["EngineConfig", "LLMEngine", "RequestOutput", "SamplingParams"]
