"""From logits to one token per request: greedy, temperature, top-k and top-p.

For a sampled request the recipe is

    logits / temperature -> keep the top-k -> keep the top-p nucleus -> softmax -> draw one token

The draw uses the "exponential race": ``argmax(probs / E)`` with ``E ~ Exponential(1)`` i.i.d. picks token
``i`` with probability ``probs[i]``, and it needs only one random number per token, drawn from the request's
*own* ``torch.Generator``. So a request with a seed gets the same tokens whatever else shares its batch, and
row order never matters.
"""

from __future__ import annotations

import torch

from .request import Request
from .sampling_params import SamplingParams


def filtered_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """The distribution a sampled request draws from: ``[V]`` float32 logits -> ``[V]`` probabilities."""
    logits = logits.float() / params.temperature
    if params.top_k > 0 and params.top_k < logits.shape[-1]:
        kth_largest = torch.topk(logits, params.top_k).values[-1]
        logits = logits.masked_fill(logits < kth_largest, float("-inf"))  # ties with the k-th are kept
    if params.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True)
        sorted_probs = sorted_logits.softmax(-1)
        mass_before = sorted_probs.cumsum(-1) - sorted_probs  # probability of all strictly better tokens
        drop_sorted = mass_before >= params.top_p  # never drops the best token (its mass_before is 0)
        logits = logits.masked_fill(drop_sorted.scatter(0, order, drop_sorted), float("-inf"))
    return logits.softmax(-1)


class Sampler:
    """Picks the next token of each request from its row of logits, keeping one RNG per sampled request."""

    def __init__(self, seed: int = 0) -> None:
        self._seed_source = torch.Generator().manual_seed(seed)  # seeds requests that bring no seed
        self._generators: dict[str, torch.Generator] = {}

    def __call__(self, logits: torch.Tensor, requests: list[Request]) -> list[int]:
        """``logits``: ``[len(requests), V]``; returns one token id per request."""
        return self.sample_ids(logits, requests).tolist()

    def sample_ids(self, logits: torch.Tensor, requests: list[Request]) -> torch.Tensor:
        """The same choice as a tensor on the logits' device (reading it on the host waits for the GPU)."""
        tokens = logits.argmax(dim=-1)
        sampled_rows = [i for i, r in enumerate(requests) if not r.params.greedy]
        for i in sampled_rows:
            probs = filtered_probs(logits[i], requests[i].params)
            race = torch.empty_like(probs).exponential_(generator=self._generator(requests[i], probs.device))
            tokens[i] = (probs / race).argmax()
        return tokens

    def _generator(self, request: Request, device: torch.device) -> torch.Generator:
        if request.request_id not in self._generators:
            seed = request.params.seed
            if seed is None:
                seed = int(torch.randint(0, 2**62, (1,), generator=self._seed_source))
            self._generators[request.request_id] = torch.Generator(device=device).manual_seed(seed)
        return self._generators[request.request_id]

    def release(self, request: Request) -> None:
        """Forget a finished request's RNG."""
        self._generators.pop(request.request_id, None)
