"""m11's engine: m10's, plus what an engine core needs — requests that arrive with the front end's ids, and
outputs that are per step, not per token.

Offline, nothing changes: ``generate`` is m10's, in this process. Served, the engine runs inside
``EngineCore`` (``core.py``) in a process of its own, and that loop needs two things m10's step API does not
give:

* ``add_core_request``: a request that was validated and tokenized by the front end, keeping the front end's
  id (the outputs go back under it);
* ``step_outputs``: one step, returned as ``StepOutput``s — each request's *new* token id and, if it
  finished, why. m04's ``step()`` builds a full ``RequestOutput`` per request per step (a copy of every token
  list so far, and text): fine for a demo, wasted in a loop that must hand the GPU its next step quickly.

``make_engine_client`` tells the server (m09's, unchanged) to talk to ``AsyncLLM``, which starts this engine in
the core process, instead of driving it from a thread.
"""

from __future__ import annotations

import torch

from milestones.m10_cuda_graphs import EngineConfig, LLMEngine as CUDAGraphEngine

from .messages import AddRequest, CoreLimits, StepOutput


class LLMEngine(CUDAGraphEngine):
    milestone = "m11_engine_core"
    serves_in_server_process = False  # served, it runs in the engine core process (``make_engine_client``)
    config: EngineConfig

    @classmethod
    def make_engine_client(cls, config: EngineConfig):
        """What the server talks to: ``AsyncLLM``, with this engine in a process of its own."""
        from .async_llm import AsyncLLM

        return AsyncLLM(config, engine_class=cls)

    def limits(self) -> CoreLimits:
        """What the front end must know to refuse a request exactly as ``make_request`` would."""
        return CoreLimits(milestone=self.milestone, max_model_len=self.max_model_len, vocab_size=self.vocab_size,
                          kv_capacity_tokens=self.kv_pool.capacity)

    def add_core_request(self, request: AddRequest) -> None:
        """Queue a request the front end validated and tokenized, under the front end's id."""
        seq = self.make_request(request.prompt_token_ids, request.sampling_params)  # checked again: cheap
        seq.request_id = request.request_id
        self.scheduler.add(seq)

    @torch.inference_mode()
    def step_outputs(self) -> list[StepOutput]:
        """One step; for every request that got a token, that token (and its finish reason, if it finished)."""
        return [StepOutput(seq.request_id, seq.output_token_ids[-1:], seq.finish_reason, seq.num_cached_tokens)
                for seq in self.engine_step()]
