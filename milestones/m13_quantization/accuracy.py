"""How far a quantized engine's logits are from the unquantized engine's, position by position.

Greedy tokens cannot measure a lossy engine: the first time a near-tie flips, the two engines continue from
different text and every later comparison is between different contexts. So both engines are **teacher-forced**
along the same tokens: the reference engine's greedy continuation of each prompt. At every generated position
each engine computes its logits over exactly the same context (its own weights, its own K/V cache, on its
own paths: prompt chunks, decode kernels, CUDA graphs), and the sampler, instead of choosing, records the row
and feeds the forced token. Three numbers summarise the rows:

* **relative RMS error**: ``rms(d) / rms(r)``, where ``r`` is the reference row and ``d`` the difference of the
  two rows, each row centred first (softmax ignores a constant added to every logit);
* **KL divergence** ``KL(p_ref || p)`` in nats, the mean and the largest over positions: how much probability
  moved, weighted by where the reference puts it;
* **top-1 agreement**: the fraction of positions whose most likely token is the same (what greedy decoding
  would pick, had the contexts stayed equal).

What these cannot say: whether answers got worse. Random weights give nearly flat distributions: a preset's
logits have a standard deviation of about ``0.02 * sqrt(hidden_size)`` (0.64 for Qwen3-0.6B's shape, 1.28 for
8B's) over 151,936 tokens, and the top two of that many draws lie about a fifth of that apart (arithmetic), so
a small error flips top-1 choices that a trained model, with a clear favourite, would keep. And trained weights
have outlier channels that random ones lack, which per-row int8 and 128-wide int4 groups absorb differently.
Task quality needs real weights and real evaluations (perplexity on text, benchmarks);
``benchmarks/quant_accuracy.py --model Qwen/Qwen3-0.6B`` runs this same comparison on real weights.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass

import torch

from milestones.m01_naive_loop.sampling_params import SamplingParams


@dataclass(frozen=True)
class LogitError:
    """One engine against the reference over ``positions`` teacher-forced positions."""

    positions: int
    rel_rms: float
    kl_mean: float
    kl_max: float
    top1_agreement: float

    def as_dict(self) -> dict:
        return asdict(self)


class ForcedSampler:
    """Stands in for an engine's sampler: records every row of logits it is given and returns the forced token.

    ``continuations[i]`` is the token sequence prompt ``i`` is forced along; a request is recognised by its prompt
    (the prompts of one comparison are distinct) and its position by the tokens it has so far, those sampled but
    not yet read back included (m12 reads a step's ids one step late: ``num_pending``). Rows are copied: a
    replayed CUDA graph writes its logits into the same buffer every step.
    """

    def __init__(self, prompts: Sequence[Sequence[int]], continuations: Sequence[Sequence[int]]) -> None:
        self.by_prompt = {tuple(p): (i, list(c)) for i, (p, c) in enumerate(zip(prompts, continuations))}
        if len(self.by_prompt) != len(prompts):
            raise ValueError("teacher forcing needs distinct prompts")
        self.rows: dict[tuple[int, int], torch.Tensor] = {}

    def sample_ids(self, logits: torch.Tensor, requests: list) -> torch.Tensor:
        tokens = []
        for row, request in zip(logits, requests):
            index, continuation = self.by_prompt[tuple(request.prompt_token_ids)]
            position = len(request.output_token_ids) + getattr(request, "num_pending", 0)
            self.rows[(index, position)] = row.float().clone()
            tokens.append(continuation[position])
        return torch.tensor(tokens, dtype=torch.long, device=logits.device)

    def __call__(self, logits: torch.Tensor, requests: list) -> list[int]:
        return self.sample_ids(logits, requests).tolist()

    def release(self, request) -> None:
        pass

    def stacked(self) -> torch.Tensor:
        """``[positions, vocab]`` in (prompt, position) order."""
        return torch.stack([self.rows[key] for key in sorted(self.rows)])


@contextmanager
def forced_sampler(engine, sampler: ForcedSampler):
    original = engine.sampler
    engine.sampler = sampler
    try:
        yield sampler
    finally:
        engine.sampler = original


def forced_logits(engine, prompts: Sequence[Sequence[int]], continuations: Sequence[Sequence[int]]) -> torch.Tensor:
    """``engine``'s logits at every position of each prompt's continuation, teacher-forced along it."""
    params = [SamplingParams(max_tokens=len(c), ignore_eos=True) for c in continuations]
    with forced_sampler(engine, ForcedSampler(prompts, continuations)) as sampler:
        engine.generate([list(p) for p in prompts], params, use_tqdm=False)
    return sampler.stacked()


def logit_error(reference: torch.Tensor, logits: torch.Tensor) -> LogitError:
    """Compare two ``[positions, vocab]`` stacks of logits row by row (see the module docstring)."""
    reference, logits = reference.float(), logits.to(reference.device).float()
    ref_centred = reference - reference.mean(-1, keepdim=True)
    diff = (logits - logits.mean(-1, keepdim=True)) - ref_centred
    rel_rms = (diff.pow(2).mean().sqrt() / ref_centred.pow(2).mean().sqrt().clamp(min=1e-30)).item()
    log_p_ref, log_p = reference.log_softmax(-1), logits.log_softmax(-1)
    kl = (log_p_ref.exp() * (log_p_ref - log_p)).sum(-1).clamp(min=0.0)
    top1 = (reference.argmax(-1) == logits.argmax(-1)).float().mean().item()
    return LogitError(reference.shape[0], rel_rms, kl.mean().item(), kl.max().item(), top1)


def compare_logits(reference_engine, engines: dict[str, object], prompts: Sequence[Sequence[int]],
                   max_tokens: int) -> dict[str, LogitError]:
    """Each engine's ``LogitError`` against ``reference_engine``, teacher-forced along the reference's greedy
    continuation (``max_tokens`` tokens) of every prompt."""
    greedy = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    continuations = [o.token_ids for o in reference_engine.generate([list(p) for p in prompts], greedy,
                                                                    use_tqdm=False)]
    reference = forced_logits(reference_engine, prompts, continuations)
    errors = {}
    for label, engine in engines.items():
        errors[label] = logit_error(reference, forced_logits(engine, prompts, continuations))
        if not math.isfinite(errors[label].rel_rms):  # a broken path, not a small error: say so
            raise RuntimeError(f"{label}: its logits are not finite (NaN or inf)")
    return errors
