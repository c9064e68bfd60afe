"""m03's engine: static batching. Requests run ``max_num_seqs`` at a time, as one padded batch.

A decode step of one sequence moves all 1.2 GB of Qwen3-0.6B's weights (and, on a GPU, launches hundreds of
kernels) to produce one token. The same step for 64 sequences reads the same weights once and produces 64
tokens: batching turns a memory- and launch-bound loop into useful arithmetic.

The batch is *static*: it is formed once, prefilled together, and decoded until its LONGEST request is done.
Rows that finish early stay in the batch, computing tokens nobody reads, and nobody can take their place.
``stats.padding_tokens`` counts that waste (left padding plus finished rows) and
``stats.useful_token_fraction`` = useful / computed tokens shows it; m04 removes it.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from milestones.m01_naive_loop.request import Request
from milestones.m02_kv_cache.engine import LLMEngine as KVCacheEngine
from milestones.m02_kv_cache.kv_cache import KVCache

from .attention import PaddedCachedAttention
from .config import EngineConfig
from .padded_batch import PaddedBatch


class LLMEngine(KVCacheEngine):
    milestone = "m03_static_batching"
    config: EngineConfig

    def __init__(self, config: EngineConfig | None = None) -> None:
        super().__init__(config if config is not None else EngineConfig())

    def run(self, requests: list[Request], on_finish: Callable[[Request], None]) -> None:
        size = self.config.max_num_seqs
        for first in range(0, len(requests), size):
            self.run_static_batch(requests[first:first + size], on_finish)

    def run_static_batch(self, batch: list[Request], on_finish: Callable[[Request], None]) -> None:
        padded = PaddedBatch.from_requests(batch, self.device)
        width = padded.input_ids.shape[1]
        longest_output = max(r.params.max_tokens for r in batch)
        cache = KVCache.for_model(self.model_config, len(batch), width + longest_output - 1, self.dtype, self.device)

        # Prefill: every row's whole prompt, in one forward pass.
        hidden = self.model(padded.input_ids, padded.positions,
                            PaddedCachedAttention(cache, 0, width, padded.pad_lens))
        self.count_step(cache, batch, tokens=len(batch) * width, wasted=padded.num_padding)
        self.stats.prompt_tokens_computed += sum(r.num_prompt_tokens for r in batch)
        self.sample_active_rows(hidden[:, -1], batch, on_finish)

        # Decode: every row feeds its last token, finished or not, until the whole batch is done.
        slot = width
        while not all(r.is_finished for r in batch):
            last = torch.tensor([[r.output_token_ids[-1]] for r in batch], device=self.device)
            positions = (slot - padded.pad_lens)[:, None]
            hidden = self.model(last, positions, PaddedCachedAttention(cache, slot, 1, padded.pad_lens))
            self.count_step(cache, batch, tokens=len(batch), wasted=sum(r.is_finished for r in batch))
            self.sample_active_rows(hidden[:, -1], batch, on_finish)
            slot += 1

    def sample_active_rows(self, last_hidden: torch.Tensor, batch: list[Request],
                           on_finish: Callable[[Request], None]) -> None:
        """Sample only for rows still running; the finished rows' results are thrown away."""
        active = [i for i, r in enumerate(batch) if not r.is_finished]
        self.sample_and_append(last_hidden[active], [batch[i] for i in active])
        for i in active:
            if batch[i].is_finished:
                self.sampler.release(batch[i])
                on_finish(batch[i])

    def count_step(self, cache: KVCache, batch: list[Request], tokens: int, wasted: int) -> None:
        self.stats.steps += 1
        self.stats.tokens_computed += tokens
        self.stats.padding_tokens += wasted
        used = sum(r.num_tokens for r in batch) * cache.bytes_per_slot
        self.stats.record_kv(cache.reserved_bytes, used)

    # ------------------------------------------------------------------ retired: m01-m02's loop over one request

    def generate_one(self, request: Request) -> None:
        raise NotImplementedError("m03 runs requests in padded batches, not one at a time: see run_static_batch()")

    def forward_and_sample(self, request: Request, cache: KVCache, ids: torch.Tensor, start: int) -> None:
        raise NotImplementedError("m03 runs requests in padded batches, not one at a time: see run_static_batch()")
