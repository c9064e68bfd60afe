"""m14_tensor_parallel: one model across several GPUs: every layer split by heads and features, one worker
process per extra rank, two all-reduces per layer through torch.distributed (NCCL on GPUs, gloo on CPUs).

New here: ``parallel_layers.py`` (which slice of each weight a rank holds; ``RowParallelLinear``, the layer that
all-reduces), ``sharded_loader.py`` (a rank's share read slice by slice from the checkpoint, or drawn as m01
draws a preset), ``parallel_state.py`` (the process groups: joining, timeouts, leaving), ``step_broadcast.py``
(each step's inputs from rank 0 to every rank), ``worker.py`` (a worker process: the same engine, forward passes
only), ``worker_processes.py`` (rank 0's handle: start, watch, stop), ``engine.py`` and ``config.py``
(``tensor_parallel_size``, ``distributed_timeout_s``).
"""

from milestones.m13_quantization import RequestOutput, SamplingParams

from .config import EngineConfig
from .engine import LLMEngine, TensorParallelError

__all__ = ["EngineConfig", "LLMEngine", "RequestOutput", "SamplingParams", "TensorParallelError"]
