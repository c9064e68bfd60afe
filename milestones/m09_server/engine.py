"""The engine m09 serves: m08's, unchanged except that a running request's step outputs carry no text.

A server needs the step API (``add_request`` / ``step`` / ``abort``) and nothing else new: the new idea of
m09 lives around the engine, in the thread that drives it (``async_engine.py``) and in the HTTP layer.

One thing changes. ``step()`` returns a ``RequestOutput`` per request every step, and earlier milestones
decode the request's *whole* output to text each time: O(length) work per token, O(length^2) per request,
paid inside the engine loop where every other request waits for it. The server streams text with an
incremental detokenizer of its own (``detokenizer.py``), so here a running request's output carries
``text=""``; a finished one still carries its full text (decoded once), and ``generate`` is unchanged.

A later milestone that serves a faster engine subclasses this ``LLMEngine`` and reuses every server file.
"""

from __future__ import annotations

from milestones.m01_naive_loop.request import Request
from milestones.m08_triton_kernel import EngineConfig, LLMEngine as TritonKernelEngine, RequestOutput, SamplingParams

__all__ = ["EngineConfig", "LLMEngine", "RequestOutput", "SamplingParams"]


class LLMEngine(TritonKernelEngine):
    """m08's engine; ``step()`` outputs of running requests leave ``text`` empty (see the module docstring)."""

    milestone = "m09_server"
    serves_in_server_process = True  # the server drives this engine from a thread of its own process

    @classmethod
    def make_engine_client(cls, config: EngineConfig):
        """What the server talks to: this engine driven from a thread of the server's own process."""
        from .async_engine import AsyncLLMEngine

        return AsyncLLMEngine(cls(config))

    def output_text(self, request: Request) -> str:
        if not request.is_finished:
            return ""  # the server detokenizes incrementally; token_ids are all there
        return super().output_text(request)
