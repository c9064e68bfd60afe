"""What crosses the socket between the front end and the engine core, as msgpack-encoded ``msgspec`` structs.

Two directions, and the rule that makes the split pay: **the core sends one message per step**, carrying the
new token of every request that got one, never one message per token per request::

    front end  ──  AddRequest(request_id, prompt_token_ids, sampling_params)  ─────────►  core
               ──  AbortRequests([request_id, ...])  ─────────────────────────────────►
               ──  Shutdown()  ──────────────────────────────────────────────────────►

    front end  ◄──  StepOutputs(outputs=[StepOutput(request_id, new_token_ids, finish_reason, ...), ...],
                                state=EngineState(running, waiting, K/V blocks ...))  ──  core, every step
               ◄──  CoreReady(limits, describe) / CoreFailed(message)  ───────  core, once, at start

A step of 256 running requests is one ~3 KB message: its encoding costs the core microseconds, where one
message (and one Python object) per token per request would cost it hundreds. Token *ids* cross, never text:
detokenizing is the front end's work.

``msgspec`` structs are typed: decoding checks every field (a ``str`` where an ``int`` belongs is an error, not
a surprise later), and ``tag=True`` makes each struct carry its name so one decoder tells the kinds apart.
"""

from __future__ import annotations

import msgspec

from milestones.m01_naive_loop.sampling_params import SamplingParams
from milestones.m09_server.async_engine import EngineState


class AddRequest(msgspec.Struct, tag=True):
    """A validated, tokenized request. The id is the front end's: outputs come back under it."""

    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams


class AbortRequests(msgspec.Struct, tag=True):
    request_ids: list[str]


class Shutdown(msgspec.Struct, tag=True):
    """Stop: abort what is running, close the sockets, exit."""


class StepOutput(msgspec.Struct, array_like=True):
    """One request's share of a step: the tokens it got (one per step today) and, last, how it finished.

    ``finish_reason`` is "stop" / "length" (finished), "error" (the step failed: ``error`` says why), or None.
    ``num_cached_tokens``: prompt tokens its admission found in the prefix cache (for ``usage``)."""

    request_id: str
    new_token_ids: list[int]
    finish_reason: str | None = None
    num_cached_tokens: int = 0
    error: str | None = None


class StepOutputs(msgspec.Struct, tag=True):
    """Everything one engine step produced, and the engine's state after it (for ``/metrics``)."""

    outputs: list[StepOutput]
    state: EngineState


class CoreLimits(msgspec.Struct):
    """What the front end needs to validate requests the way the engine would, without an engine."""

    milestone: str
    max_model_len: int
    vocab_size: int
    kv_capacity_tokens: int  # the most K/V slots one request may hold (prompt + max_tokens - 1)


class CoreReady(msgspec.Struct, tag=True):
    limits: CoreLimits
    describe: list[str]  # what the engine says about itself at start (K/V cache, CUDA graphs)
    state: EngineState  # before any request


class CoreFailed(msgspec.Struct, tag=True):
    """The core could not start, or its loop crashed: the whole engine is gone."""

    message: str


ToCore = AddRequest | AbortRequests | Shutdown
FromCore = StepOutputs | CoreReady | CoreFailed
