"""m02's engine: prefill once, then one token per step against the request's K/V cache.

    prefill:  model(prompt[0:P])   -> K/V for slots 0..P-1 stored, first token sampled
    decode:   model(last token)    -> its K/V stored at the next slot, next token sampled

m01's engine re-ran the whole sequence for every token; here a decode step runs *one* token through the
model. Everything else (loading, tokenizer, sampler, stop conditions, outputs) is m01's, unchanged: this
class only replaces ``generate_one``, the loop that produces one request's tokens.
"""

from __future__ import annotations

import torch

from milestones.m01_naive_loop.engine import LLMEngine as NaiveLoopEngine
from milestones.m01_naive_loop.request import Request

from .kv_cache import CachedAttention, KVCache


class LLMEngine(NaiveLoopEngine):
    milestone = "m02_kv_cache"

    def generate_one(self, request: Request) -> None:
        # Reserve the cache for the longest this request can get; the last token is never fed back, hence -1.
        cache = KVCache.for_model(self.model_config, 1, request.max_num_tokens - 1, self.dtype, self.device)
        prompt = torch.tensor([request.prompt_token_ids], device=self.device)
        self.forward_and_sample(request, cache, prompt, start=0)
        self.stats.prompt_tokens_computed += request.num_prompt_tokens
        while not request.is_finished:
            last = torch.tensor([[request.output_token_ids[-1]]], device=self.device)
            self.forward_and_sample(request, cache, last, start=request.num_tokens - 1)

    def forward_and_sample(self, request: Request, cache: KVCache, ids: torch.Tensor, start: int) -> None:
        positions = torch.arange(start, start + ids.shape[1], device=self.device)[None, :]
        hidden = self.model(ids, positions, CachedAttention(cache, start, ids.shape[1]))
        self.stats.steps += 1
        self.stats.tokens_computed += ids.shape[1]
        self.stats.record_kv(cache.reserved_bytes, (start + ids.shape[1]) * cache.bytes_per_slot)
        self.sample_and_append(hidden[:, -1], [request])
