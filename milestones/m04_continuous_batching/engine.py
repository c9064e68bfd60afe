"""m04's engine: continuous batching, and the step API every later milestone keeps.

Static batches (m03) waste their finished rows until the longest request is done. Here the scheduler
rebuilds the batch every step: finished requests leave at once and waiting ones take their place.

The engine is now driven one step at a time, which is also what a server needs:

    request_id = engine.add_request(prompt, params)   # validated, queued
    while engine.has_unfinished():
        for output in engine.step():                  # one scheduler decision, one forward pass
            ...                                        # a new token (and maybe a finish) per request
    engine.abort(request_id)                           # leave now, give the K/V back

``generate`` (inherited) is built on the same steps (see ``run``); if it is interrupted (Ctrl-C, a forward
pass that raises), ``abort_requests`` takes its requests out of the scheduler and frees their K/V, so the
engine is idle and usable again.

K/V memory: a single pool holds every request's cache in a contiguous region reserved for its maximum
length. ``stats.kv_reserved_peak_bytes`` against ``stats.kv_used_peak_bytes`` shows how much of it sits
idle: the waste paged blocks (m05) recover.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from milestones.m01_naive_loop.request import Request, RequestOutput
from milestones.m01_naive_loop.sampling_params import SamplingParams
from milestones.m03_static_batching.engine import LLMEngine as StaticBatchingEngine
from milestones.m03_static_batching.padded_batch import PaddedBatch, padded_causal_mask

from .config import EngineConfig
from .kv_allocator import ContiguousAllocator
from .kv_pool import DecodeAttention, KVPool, PrefillAttention
from .scheduler import Scheduler, kv_slots_needed


class LLMEngine(StaticBatchingEngine):
    milestone = "m04_continuous_batching"
    config: EngineConfig

    def __init__(self, config: EngineConfig | None = None) -> None:
        super().__init__(config if config is not None else EngineConfig())
        self.kv_bytes_per_token = KVPool.bytes_per_token(self.model_config, self.dtype)
        self.kv_pool = self.make_kv_pool()
        self.scheduler = self.make_scheduler()

    def make_kv_pool(self) -> KVPool:
        capacity = self.config.kv_cache_tokens or self.default_kv_capacity()
        return KVPool.for_model(self.model_config, capacity, self.dtype, self.device)

    def make_scheduler(self) -> Scheduler:
        return Scheduler(self.config.max_num_seqs, ContiguousAllocator(self.kv_pool.capacity))

    def default_kv_capacity(self) -> int:
        wanted = self.config.max_num_seqs * self.max_model_len
        budget = torch.cuda.mem_get_info(self.device)[0] // 2 if self.device.type == "cuda" else 512 * 2**20
        return max(1, min(wanted, budget // self.kv_bytes_per_token))

    # ------------------------------------------------------------------ the step API

    def add_request(self, prompt: str | list[int], params: SamplingParams | None = None) -> str:
        """Validate and queue one request; returns its id."""
        request = self.make_request(prompt, params if params is not None else SamplingParams())
        self.scheduler.add(request)
        return request.request_id

    @torch.inference_mode()
    def step(self) -> list[RequestOutput]:
        """Run one scheduler decision; return an output for every request that got a token."""
        return [self.make_output(r) for r in self.engine_step()]

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    def abort(self, request_id: str) -> bool:
        """Stop a waiting or running request and free its K/V. Returns False for an unknown or finished id."""
        request = self.scheduler.abort(request_id)
        if request is None:
            return False
        request.finish(time.perf_counter(), "abort")
        self.sampler.release(request)
        return True

    # ------------------------------------------------------------------ generate() on top of the steps

    def run(self, requests: list[Request], on_finish: Callable[[Request], None]) -> None:
        """Queue every request and step until all are done (an interruption is cleaned up by
        ``abort_requests``, called from ``generate``)."""
        if self.scheduler.has_unfinished():  # their outputs would be consumed here and never reach the caller
            raise ValueError("generate() needs an idle engine, but requests added with add_request() are still "
                             "unfinished: drive them with step() until has_unfinished() is False, or abort them")
        for request in requests:
            self.scheduler.add(request)
        while self.scheduler.has_unfinished():
            for request in self.engine_step():
                if request.is_finished:
                    on_finish(request)

    def abort_requests(self, requests: list[Request]) -> None:
        """An interrupted ``generate``: take its requests out of the queue and give their K/V back.

        ``abort`` finds a request wherever the interruption left it (waiting, running, or finished but not
        yet removed) and does nothing for one that already left; then m01 releases the sampler state.
        """
        for request in requests:
            self.abort(request.request_id)
        super().abort_requests(requests)

    def make_request(self, prompt, params: SamplingParams, where: str = "prompt") -> Request:
        request = super().make_request(prompt, params, where)
        if kv_slots_needed(request) > self.kv_pool.capacity:
            raise ValueError(
                f"{where}: needs {kv_slots_needed(request)} K/V slots (prompt + max_tokens "
                f"- 1) but the pool holds {self.kv_pool.capacity}; raise kv_cache_tokens or lower max_tokens"
            )
        return request

    # ------------------------------------------------------------------ one step

    def engine_step(self) -> list[Request]:
        if not self.scheduler.has_unfinished():
            return []
        batch = self.scheduler.schedule()
        if batch.prefills:
            self.prefill(batch.prefills)
            touched = batch.prefills
        elif batch.decodes:
            self.decode(batch.decodes)
            touched = batch.decodes
        else:
            raise RuntimeError("scheduler produced an empty step while requests are waiting")  # invariant
        self.record_kv_usage()  # before finished requests give their regions back: this step used them
        self.stats.running_per_step.append(len(self.scheduler.running))
        self.stats.waiting_per_step.append(len(self.scheduler.waiting))
        for request in self.scheduler.remove_finished():
            self.sampler.release(request)
        return touched

    def region_starts(self, requests: list[Request]) -> torch.Tensor:
        starts = [self.scheduler.allocator.start_of(r.request_id) for r in requests]
        return torch.tensor(starts, device=self.device)

    def prefill(self, requests: list[Request]) -> None:
        padded = PaddedBatch.from_requests(requests, self.device)
        width = padded.input_ids.shape[1]
        columns = torch.arange(width, device=self.device)[None, :]
        is_token = columns >= padded.pad_lens[:, None]
        slots = self.region_starts(requests)[:, None] + padded.positions
        slot_mapping = torch.where(is_token, slots, self.kv_pool.trash_slot)
        mask = padded_causal_mask(padded.pad_lens, 0, width, width)
        hidden = self.model(padded.input_ids, padded.positions, PrefillAttention(self.kv_pool, slot_mapping, mask))
        self.stats.steps += 1
        self.stats.tokens_computed += len(requests) * width
        self.stats.padding_tokens += padded.num_padding
        self.stats.prompt_tokens_computed += sum(r.num_prompt_tokens for r in requests)
        self.sample_and_append(hidden[:, -1], requests)

    def decode(self, requests: list[Request]) -> None:
        lengths = torch.tensor([r.num_tokens for r in requests], device=self.device)  # incl. the new token
        starts = self.region_starts(requests)
        ids = torch.tensor([[r.output_token_ids[-1]] for r in requests], device=self.device)
        positions = (lengths - 1)[:, None]
        slot_mapping = starts[:, None] + positions
        offsets = torch.arange(max(r.num_tokens for r in requests), device=self.device)[None, :]
        is_key = offsets < lengths[:, None]
        # Rows shorter than the longest still gather S keys; point the extra ones at the row's first slot.
        # They are masked out, but must hold finite numbers: a zero attention weight times NaN is still NaN.
        kv_indices = torch.where(is_key, starts[:, None] + offsets, starts[:, None])
        attention = DecodeAttention(self.kv_pool, slot_mapping, kv_indices, is_key[:, None, None, :])
        hidden = self.model(ids, positions, attention)
        self.stats.steps += 1
        self.stats.tokens_computed += len(requests)
        self.sample_and_append(hidden[:, -1], requests)

    def record_kv_usage(self) -> None:
        """Peak K/V reserved (whole regions) against used (tokens actually cached) so far."""
        allocator = self.scheduler.allocator
        cached = sum(r.num_tokens - 1 for r in self.scheduler.running)  # the newest token is not cached yet
        self.stats.record_kv(allocator.reserved_slots * self.kv_bytes_per_token, cached * self.kv_bytes_per_token)

    # ------------------------------------------------------------------ retired: m03's static batches

    def run_static_batch(self, batch: list[Request], on_finish: Callable[[Request], None]) -> None:
        raise NotImplementedError("m04 rebuilds the batch every step, no static batches: see engine_step()")

    def sample_active_rows(self, last_hidden: torch.Tensor, batch: list[Request],
                           on_finish: Callable[[Request], None]) -> None:
        raise NotImplementedError("m04 rebuilds the batch every step, no static batches: see engine_step()")

    def count_step(self, cache, batch: list[Request], tokens: int, wasted: int) -> None:
        raise NotImplementedError("m04 rebuilds the batch every step, no static batches: see engine_step()")
