"""m01's engine: the most honest way to generate text, and the slowest.

For each request, one at a time::

    tokens = prompt
    repeat until a stop condition:
        logits = model(tokens)          # the WHOLE sequence, every step
        tokens.append(sample(logits[-1]))

Step ``n`` recomputes the keys and values of all ``prompt + n`` earlier tokens, so generating ``N`` tokens
costs ``O(N * (P + N))`` token-passes and per-token latency grows with the sequence. m02 removes that by
caching K and V; m03 and later fill the GPU with many requests at once.

This class also holds what every later engine shares: loading the model and tokenizer, turning prompts into
validated ``Request`` objects, stop conditions (in ``Request``), sampling, and building ``RequestOutput``s.
Later milestones override ``run`` (how requests are scheduled) and the step functions.
"""

from __future__ import annotations

import itertools
import json
import numbers
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
from tqdm.auto import tqdm

from .attention import CausalAttention
from .config import EngineConfig
from .loader import LoadedModel, load_model
from .request import Request, RequestOutput
from .sampler import Sampler
from .sampling_params import SamplingParams
from milestones.common.engine_stats import EngineStats
from .tokenizer import load_tokenizer

Prompt = str | list[int]


class LLMEngine:
    """Offline generation: ``LLMEngine(EngineConfig(...)).generate(prompts, SamplingParams(...))``."""

    milestone = "m01_naive_loop"
    request_class = Request  # later milestones keep more per-request state in a subclass (m05: ``Sequence``)

    def __init__(self, config: EngineConfig | None = None) -> None:
        self.config = config if config is not None else EngineConfig()
        self.device = self.config.resolve_device()
        self.dtype = self.config.resolve_dtype(self.device)
        if self.device.type == "cuda":
            # cuDNN's attention backend plans a graph per new shape: about 1.5 ms of CPU per call, measured on
            # the H200 machine, and our shapes change every step. Flash / memory-efficient kernels don't.
            torch.backends.cuda.enable_cudnn_sdp(False)
        loaded = self.load_model()
        self.model, self.model_config = loaded.model, loaded.config
        self.tokenizer = self.load_tokenizer(loaded.checkpoint_dir)
        self.vocab_size = self.model_config.vocab_size
        self.max_model_len = self._resolve_max_model_len()
        self.eos_token_ids = self._eos_token_ids(loaded.checkpoint_dir)
        self.sampler = Sampler(seed=self.config.seed)
        self.stats = self.new_stats()  # reset by every generate() call
        self._request_ids = itertools.count()

    def load_model(self) -> LoadedModel:
        """The model named by ``config.model``, on this engine's device in its dtype (``loader.py``). Called
        once, before anything else is sized, so a later milestone can change the weights as they load (m13
        quantizes them there, before the K/V cache takes what memory they leave)."""
        return load_model(self.config.model, self.device, self.dtype, seed=self.config.seed)

    def load_tokenizer(self, checkpoint_dir: Path | None):
        """The checkpoint's tokenizer, or Qwen3's built-in one (``tokenizer.py``). A seam: a process that never
        sees text needs none (m14's worker processes)."""
        return load_tokenizer(checkpoint_dir)

    # ------------------------------------------------------------------ public API

    @torch.inference_mode()
    def generate(
        self,
        prompts: Prompt | Sequence[Prompt],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = True,
    ) -> list[RequestOutput]:
        """Generate for every prompt; outputs come back in prompt order.

        ``prompts`` are strings or lists of token ids; ``sampling_params`` is one ``SamplingParams`` for all
        or one per prompt. Every prompt is validated before any work starts, so bad input costs nothing.
        If the run is interrupted (Ctrl-C, or a forward pass that raises), its requests are aborted and give
        back what they hold before the exception goes on, so the engine stays usable.
        """
        requests = self.make_requests(prompts, sampling_params)
        self.stats = self.new_stats()
        with tqdm(total=len(requests), desc=self.milestone, unit="req", disable=not use_tqdm) as bar:
            try:
                self.run(requests, on_finish=lambda _: bar.update(1))
            except BaseException:  # KeyboardInterrupt too: the caller may catch it and keep using the engine
                self.abort_requests(requests)
                raise
        return [self.make_output(r) for r in requests]

    # ------------------------------------------------------------------ scheduling (overridden later)

    def run(self, requests: list[Request], on_finish: Callable[[Request], None]) -> None:
        """m01 and m02: requests run one after another, each to completion."""
        for request in requests:
            self.generate_one(request)
            self.sampler.release(request)
            on_finish(request)

    def abort_requests(self, requests: list[Request]) -> None:
        """Give back what the requests of an interrupted ``run`` hold; m01 and m02 hold only sampler state.

        Later milestones hold more (queue places, K/V) and extend this; it must work whatever point the
        run reached, including requests that finished, or never started.
        """
        now = time.perf_counter()
        for request in requests:
            if not request.is_finished:
                request.finish(now, "abort")
            self.sampler.release(request)

    def generate_one(self, request: Request) -> None:
        """m01: every step runs the model over every token of the sequence."""
        while not request.is_finished:
            ids = torch.tensor([request.all_token_ids], device=self.device)
            positions = torch.arange(ids.shape[1], device=self.device)[None, :]
            hidden = self.model(ids, positions, CausalAttention())
            self.stats.steps += 1
            self.stats.tokens_computed += ids.shape[1]
            self.stats.prompt_tokens_computed += request.num_prompt_tokens
            self.sample_and_append(hidden[:, -1], [request])

    def sample_and_append(self, last_hidden: torch.Tensor, requests: list[Request]) -> None:
        """LM head on one hidden row per request, sample, and append each token (which may finish it)."""
        self.sample_logits_and_append(self.model.compute_logits(last_hidden), requests)

    def sample_logits_and_append(self, logits: torch.Tensor, requests: list[Request]) -> None:
        """Sample one token per row of ``logits`` and append it to its request."""
        tokens = self.sampler(logits, requests)
        now = time.perf_counter()
        for request, token in zip(requests, tokens):
            request.append_token(token, now)

    # ------------------------------------------------------------------ requests in, outputs out

    def make_requests(
        self,
        prompts: Prompt | Sequence[Prompt],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
    ) -> list[Request]:
        """Validate and tokenize every prompt, before any work; errors name the prompt by its index."""
        prompts = self._as_prompt_list(prompts)
        params = self._as_params_list(sampling_params, len(prompts))
        return [self.make_request(p, sp, where=f"prompt {i}") for i, (p, sp) in enumerate(zip(prompts, params))]

    def make_request(self, prompt: Prompt, params: SamplingParams, where: str = "prompt") -> Request:
        """Tokenize and validate one prompt; raises ``ValueError`` starting with ``where`` (e.g. "prompt 3")."""
        if not isinstance(params, SamplingParams):
            raise ValueError(f"{where}: sampling params must be SamplingParams, got {_describe(params)}")
        token_ids, text = self._prompt_token_ids(prompt, where)
        if not token_ids:
            raise ValueError(f"{where}: the prompt has no tokens")
        # Checked for strings too: a tokenizer with more ids than the model (e.g. Qwen3's on a tiny test model).
        bad = [t for t in token_ids if not 0 <= t < self.vocab_size]
        if bad:
            raise ValueError(f"{where}: token ids {bad[:5]} are outside [0, {self.vocab_size})")
        total = len(token_ids) + params.max_tokens
        if total > self.max_model_len:
            raise ValueError(
                f"{where}: prompt ({len(token_ids)} tokens) + max_tokens ({params.max_tokens}) = "
                f"{total} exceeds max_model_len ({self.max_model_len})"
            )
        request_id = str(next(self._request_ids))
        return self.request_class(request_id, token_ids, params, self.eos_token_ids, prompt=text)

    def _prompt_token_ids(self, prompt: Prompt, where: str) -> tuple[list[int], str | None]:
        """(token ids, the text or None) of a string or token-id prompt; anything else is a ``ValueError``."""
        if isinstance(prompt, str):
            if not prompt:
                raise ValueError(f"{where}: the prompt is an empty string")
            try:
                prompt.encode("utf-8")
            except UnicodeEncodeError as error:  # a lone surrogate such as "\ud800" is not text
                bad = prompt[error.start:error.end]
                raise ValueError(f"{where}: the prompt is not valid Unicode text: {bad!r} at index "
                                 f"{error.start} is a lone surrogate") from None
            return self.tokenizer.encode(prompt, add_special_tokens=False), prompt
        if not isinstance(prompt, (list, tuple)):
            raise ValueError(f"{where}: a prompt is a string or a list of token ids, got {_describe(prompt)}")
        for i, token in enumerate(prompt):
            # bool is an int subclass (True == 1); numpy integers are fine.
            if isinstance(token, bool) or not isinstance(token, numbers.Integral):
                raise ValueError(f"{where}: a prompt is a string or a list of token ids, but token {i} is "
                                 f"{_describe(token)}")
        return [int(t) for t in prompt], None

    def make_output(self, request: Request) -> RequestOutput:
        return RequestOutput(
            request_id=request.request_id,
            prompt=request.prompt,
            prompt_token_ids=request.prompt_token_ids,
            token_ids=list(request.output_token_ids),
            text=self.output_text(request),
            finish_reason=request.finish_reason,
            metrics=request.metrics,
        )

    def output_text(self, request: Request) -> str:
        """The output decoded to text (m09's server decodes incrementally itself and skips this while running)."""
        return self.tokenizer.decode(request.output_token_ids, skip_special_tokens=True)

    # ------------------------------------------------------------------ helpers

    def new_stats(self) -> EngineStats:
        """Fresh counters (a later milestone returns its own ``EngineStats`` subclass)."""
        return EngineStats()

    @staticmethod
    def _as_prompt_list(prompts: Prompt | Sequence[Prompt]) -> list[Prompt]:
        if isinstance(prompts, str):
            return [prompts]
        if not isinstance(prompts, (list, tuple)):
            raise ValueError(f"prompts must be a string or a list of prompts, got {_describe(prompts)}")
        if prompts and all(isinstance(p, int) for p in prompts):
            raise ValueError("prompts must be a list of prompts; wrap one token-id prompt as [[id, id, ...]]")
        if not prompts:
            raise ValueError("no prompts given")
        return list(prompts)

    @staticmethod
    def _as_params_list(params: SamplingParams | Sequence[SamplingParams] | None, n: int) -> list[SamplingParams]:
        if params is None:
            return [SamplingParams()] * n
        if isinstance(params, SamplingParams):
            return [params] * n
        if not isinstance(params, (list, tuple)):  # a dict is iterable too: refuse it before list() does
            raise ValueError("sampling_params must be a SamplingParams, a list of them (one per prompt) or None, "
                             f"got {_describe(params)}")
        if len(params) != n:
            raise ValueError(f"got {n} prompts but {len(params)} sampling params; pass one, or one per prompt")
        for i, p in enumerate(params):
            if not isinstance(p, SamplingParams):
                raise ValueError(f"sampling_params[{i}] must be a SamplingParams, got {_describe(p)}")
        return list(params)

    def _resolve_max_model_len(self) -> int:
        limit = self.model_config.max_position_embeddings
        wanted = self.config.max_model_len
        if wanted is None:
            return limit
        if not 1 <= wanted <= limit:
            raise ValueError(f"max_model_len must be in [1, {limit}] for this model, got {wanted}")
        return wanted

    def _eos_token_ids(self, checkpoint_dir) -> frozenset[int]:
        """EOS ids from config.json, plus generation_config.json where the checkpoint has one (Qwen3 lists two)."""
        ids: set[int] = set()
        sources = [self.model_config.eos_token_id]
        if checkpoint_dir is not None and (checkpoint_dir / "generation_config.json").is_file():
            sources.append(json.loads((checkpoint_dir / "generation_config.json").read_text()).get("eos_token_id"))
        for value in sources:
            if isinstance(value, int):
                ids.add(value)
            elif isinstance(value, list):
                ids.update(v for v in value if isinstance(v, int))
        return frozenset(ids)


def _describe(value: object) -> str:
    """A short, safe description of a bad value for an error message: its type and a clipped repr."""
    text = repr(value)
    if len(text) > 60:
        text = text[:57] + "..."
    return f"{type(value).__name__} {text}"
