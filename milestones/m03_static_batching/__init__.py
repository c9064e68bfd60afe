"""m03_static_batching: a padded batch of requests runs together until its longest request is done.

New here: ``padded_batch.py`` (left padding, per-row positions, the mask), ``attention.py`` (m02's cached
attention with that mask) and ``engine.py`` (batches of ``max_num_seqs``; waste accounting).
"""

from milestones.m01_naive_loop import RequestOutput, SamplingParams

from .config import EngineConfig
from .engine import LLMEngine

__all__ = ["EngineConfig", "LLMEngine", "RequestOutput", "SamplingParams"]
