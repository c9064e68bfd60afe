"""m08_triton_kernel: a Triton paged-attention decode kernel reads K/V in place through the block tables.

New here: ``paged_decode_kernel.py`` (the decode kernel: grouped-query heads per program, online softmax,
split-K for long contexts at small batch), ``launch_config.py`` (its configuration per regime, split or direct),
``store_kv_kernel.py`` (the step's K/V into the cache in one launch), ``attention.py`` (decodes to the kernel,
prompt chunks to m05's torch path, in one step) and ``config.py`` / ``engine.py`` (``attention_backend``: auto,
torch, triton).
"""

import os

import torch

if not torch.cuda.is_available():  # without a GPU, Triton kernels can run only in Triton's interpreter, which
    os.environ.setdefault("TRITON_INTERPRET", "1")  # must be chosen before anything imports triton

from milestones.m01_naive_loop import SamplingParams  # noqa: E402
from milestones.m06_prefix_cache import RequestOutput  # noqa: E402

from .config import EngineConfig  # noqa: E402
from .engine import LLMEngine  # noqa: E402

__all__ = ["EngineConfig", "LLMEngine", "RequestOutput", "SamplingParams"]
