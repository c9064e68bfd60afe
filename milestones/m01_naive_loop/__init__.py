"""m01_naive_loop: our own Qwen3 forward pass, and generation by re-running the whole sequence every step.

The honest baseline. Read in this order: ``model.py`` (Qwen3), ``loader.py`` (weights), ``tokenizer.py``,
``sampler.py``, ``request.py`` (stop conditions), ``engine.py`` (the loop).
"""

from .config import EngineConfig
from .engine import LLMEngine
from .request import RequestOutput
from .sampling_params import SamplingParams

__all__ = ["EngineConfig", "LLMEngine", "RequestOutput", "SamplingParams"]
