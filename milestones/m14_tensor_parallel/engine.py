"""m14's engine: the previous milestone's, with every layer split across ``tensor_parallel_size`` ranks.

Rank 0 is this engine, in the caller's process (offline ``generate``) or in m11's engine core process (served):
its scheduler, block manager, sampler and outputs are the previous milestone's, unchanged. Ranks 1..N-1 are
worker processes it starts (``worker_processes.py``), each building this same class with ``parallel`` given
(``worker.py``). What this class changes, all at seams of earlier milestones:

* ``load_model`` (m01's seam): this rank's share of the weights (``sharded_loader.py``), read slice by slice
  from the checkpoint or drawn as m01 draws a preset. Its config (``shard_config``) has ``1/N`` of the heads,
  K/V heads and intermediate features, so the K/V pool m05 sizes from it holds this rank's K/V heads of every
  block, and ``kv_bytes_per_token`` is per rank;
* ``resolve_num_blocks`` (m05's seam): every rank gets the *smallest* number of blocks any rank can afford, so
  one block id means the same slots everywhere;
* ``forward`` (m05's seam, through m10's and m12's): rank 0 first broadcasts the step's packed inputs
  (``step_broadcast.py``), then every rank runs the same forward pass; the all-reduces inside meet;
* ``fill_pending_ids`` (m12's seam): after rank 0 has written step N's sampled ids into step N+1's inputs on its
  device, it broadcasts the filled ids device to device, so no worker ever computes from a placeholder;
* ``engine_step``: a step that raises leaves the ranks at different points of their collectives, so a
  tensor-parallel engine cannot go on after one: it stops its workers and says why (a worker that died is
  named with its exit), now and on every later call.

``tensor_parallel_size=1`` changes nothing: no worker, no collective, the previous milestone's model, K/V pool
and graphs. ``close()`` (or garbage collection, or the interpreter's exit) stops the workers.
"""

from __future__ import annotations

import dataclasses
import gc
import pickle
from pathlib import Path

import torch
import torch.distributed as dist

from milestones.m01_naive_loop.loader import PRESETS, LoadedModel, resolve_checkpoint
from milestones.m05_paged_blocks.engine import HostBatch
from milestones.m13_quantization import LLMEngine as PreviousEngine

from .config import EngineConfig
from .parallel_layers import check_tensor_parallel_size
from .parallel_state import TensorParallelGroup, open_store, rank_devices
from .sharded_loader import full_config, load_shard
from .step_broadcast import gather_results, send_call, send_shutdown, send_step
from .worker import CallFailed, one_line
from .worker_processes import STOP_GRACE_S, WorkerProcesses

# m13's int8/int4 weights (packed matrices with per-row or per-group scales) are not split here: refused at N > 1.
# Its FP8 K/V cache needs nothing: each rank's pool holds its own K/V heads, with scales of its own.
UNSHARDABLE = ("quantization",)


class TensorParallelError(RuntimeError):
    """The tensor-parallel group failed (a worker died, a collective timed out): this engine cannot go on."""


class LLMEngine(PreviousEngine):
    milestone = "m14_tensor_parallel"
    config: EngineConfig

    def __init__(self, config: EngineConfig | None = None, parallel: TensorParallelGroup | None = None) -> None:
        """``parallel``: given only to a worker's engine (rank > 0); rank 0 starts the workers and makes its own."""
        config = config if config is not None else EngineConfig()
        self.parallel, self.workers, self.failure = parallel, None, None
        self.pending_rows, self.step_ids_on_device = None, False
        try:
            if parallel is None and config.tensor_parallel_size > 1:
                self.start_workers(config)
            super().__init__(config)
        except BaseException as error:
            died = self.workers.dead_worker(wait_s=1.0) if self.workers is not None else None
            self.close()
            if died is not None and not isinstance(error, ValueError):
                raise TensorParallelError(f"tensor-parallel worker {died}") from error
            raise

    # ------------------------------------------------------------------ the group

    def start_workers(self, config: EngineConfig) -> None:
        """Check the split before any process starts, then start ranks 1..N-1 (the group is joined once every rank
        has loaded its weights: ``resolve_num_blocks``)."""
        world_size = config.tensor_parallel_size
        devices = rank_devices(config.resolve_device(), world_size)
        for name in UNSHARDABLE:
            if getattr(config, name, None) is not None:
                raise ValueError(f"{name}={getattr(config, name)!r} cannot be split across ranks yet: use it with "
                                 "tensor_parallel_size=1")
        self.checkpoint_dir = None if config.model in PRESETS else resolve_checkpoint(config.model)
        check_tensor_parallel_size(full_config(config.model, self.checkpoint_dir), world_size)
        if dist.is_initialized():
            gc.collect()  # an engine nobody holds any more gives its group back when collected
        if dist.is_initialized():
            raise ValueError("this process already has a torch.distributed group (another tensor-parallel engine "
                             "that is not closed?): close() it first; one tensor-parallel engine per process")
        store = open_store(world_size, config.distributed_timeout_s)
        worker_model = config.model if self.checkpoint_dir is None else str(self.checkpoint_dir)  # no worker downloads
        configs = [dataclasses.replace(config, model=worker_model, device=str(device)) for device in devices[1:]]
        # On NCCL a worker's death aborts rank 0's collectives at once (gloo fails them by itself).
        on_death = TensorParallelGroup.abort if devices[0].type == "cuda" else None
        self.workers = WorkerProcesses(type(self), configs, store.port, on_death)
        self.parallel = TensorParallelGroup(0, world_size, devices[0], store, config.distributed_timeout_s)

    @property
    def is_driver(self) -> bool:
        """Rank 0 of a tensor-parallel engine: the one that schedules and sends the steps."""
        return self.parallel is not None and self.parallel.rank == 0

    def close(self) -> None:
        """Stop the workers and leave the group (idempotent; nothing to do at ``tensor_parallel_size=1``)."""
        workers = getattr(self, "workers", None)
        if workers is None:
            return
        self.workers = None
        healthy = self.failure is None
        if healthy:
            self.failure = "the engine was closed"
            if self.parallel is not None:
                try:
                    send_shutdown(self.parallel.cpu_group)  # the workers leave their loop and the group
                except Exception:  # a worker already gone: stop() ends the rest
                    healthy = False
        workers.stop(timeout_s=STOP_GRACE_S if healthy else 0.0)  # a failed group's workers are ended at once
        TensorParallelGroup.destroy()

    def collective_rpc(self, function, *args) -> list:
        """``function(engine, *args)`` on every rank, the results in rank order (vLLM's name). ``function`` is a
        module-level function (pickled by reference: a worker imports its module) or the name of an engine
        method. For tests and the demo: what each rank holds, what it counted. A call that raises on any rank
        raises here, naming the rank; the group goes on (every rank still sends its result)."""
        if isinstance(function, str):
            function = getattr(type(self), function)
        if self.parallel is None:
            return [function(self, *args)]
        self.raise_if_failed()
        pickle.dumps((function, args))  # what cannot be sent fails here, before the workers are told anything
        try:
            send_call(self.parallel.cpu_group, function, args)
            try:
                own = function(self, *args)
            except Exception as error:
                own = CallFailed(one_line(error))
            results = gather_results(self.parallel.cpu_group, own, self.parallel.world_size, 0)
        except BaseException as error:
            raise self.fail(error) from error
        for rank, result in enumerate(results):
            if isinstance(result, CallFailed):
                raise RuntimeError(f"rank {rank}: {result.message}")
        return results

    # ------------------------------------------------------------------ weights and K/V, per rank

    def load_model(self) -> LoadedModel:
        if self.parallel is None:
            return super().load_model()
        self.check_kv_cache_dtype()  # m13's refusal of an FP8 cache this device cannot run, before any loading
        checkpoint = getattr(self, "checkpoint_dir", None)
        if checkpoint is None and self.config.model not in PRESETS:  # a worker: rank 0 resolved the directory
            checkpoint = resolve_checkpoint(self.config.model)
        self.full_model_config = full_config(self.config.model, checkpoint)
        return load_shard(self.config.model, checkpoint, self.parallel.rank, self.parallel.world_size, self.device,
                          self.dtype, self.config.seed)

    def load_tokenizer(self, checkpoint_dir: Path | None):
        """A worker never sees text: no tokenizer (rank 0 tokenizes and detokenizes)."""
        if self.parallel is not None and self.parallel.rank > 0:
            return None
        return super().load_tokenizer(checkpoint_dir)

    def resolve_num_blocks(self) -> int:
        """The first moment the ranks must agree: each has loaded its share on its own; here they join the group
        (rank 0 waiting for the workers), then take the smallest number of blocks any rank can afford."""
        if self.parallel is None:
            return super().resolve_num_blocks()
        self.parallel.join(dead_worker=self.workers.dead_worker if self.workers is not None else None)
        return self.parallel.min_over_ranks(super().resolve_num_blocks())

    def describe_kv_cache(self) -> str:
        text = super().describe_kv_cache()
        if self.parallel is None:
            return text
        return (f"{text} on each of {self.parallel.world_size} ranks ({self.model_config.num_key_value_heads} of "
                f"the {self.full_model_config.num_key_value_heads} K/V heads each)")

    # ------------------------------------------------------------------ one step, on every rank

    def engine_step(self):
        if self.parallel is None:
            return super().engine_step()
        self.raise_if_failed()
        try:
            return super().engine_step()
        except Exception as error:
            raise self.fail(error) from error
        except BaseException as error:  # Ctrl-C: the caller's, but the ranks are out of step all the same
            self.fail(error)
            raise

    def forward(self, host: HostBatch) -> torch.Tensor | None:
        if self.is_driver:
            self.step_ids_on_device = self.config.async_scheduling and self.pending_rows is not None
            send_step(self.parallel.cpu_group, host, self.block_table_array(host.block_tables),
                      self.step_ids_on_device)
        return super().forward(host)

    def fill_pending_ids(self, input_ids: torch.Tensor) -> None:
        super().fill_pending_ids(input_ids)  # rank 0: step N's samples into their rows (a worker has none)
        if self.parallel is not None and self.step_ids_on_device:
            self.parallel.broadcast_from_rank0(input_ids)  # rank 0 sends the filled ids, the workers take them

    def run_worker_step(self, host: HostBatch, ids_on_device: bool) -> None:
        """A worker's step: rank 0's inputs through the same ``forward`` (logits: none, no LM head here)."""
        self.pending_rows, self.step_ids_on_device = None, ids_on_device
        self.forward(host)

    # ------------------------------------------------------------------ failure

    def raise_if_failed(self) -> None:
        if self.failure is not None:
            raise TensorParallelError(self.failure)

    def fail(self, error: BaseException) -> TensorParallelError:
        """A step (or call) raised: stop the workers, remember why; returns the error to raise."""
        died = self.workers.dead_worker(wait_s=1.0) if self.workers is not None else None
        if died is not None:
            self.failure = f"tensor-parallel worker {died}: this engine cannot go on (build a new one)"
        else:
            self.failure = (f"a tensor-parallel step failed ({one_line(error)}); its ranks may be mid-collective, "
                            "so the engine stopped its workers (build a new one)")
        self.in_flight = None  # its sampled ids will never be read
        self.close()
        return TensorParallelError(self.failure)
