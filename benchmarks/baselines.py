"""transformers as the yardstick, on exactly our weights: ``generate`` on static batches (``hf-static``). How it
is driven, credited and timed: docs/benchmarks.md, "The engines". Two more baselines were retired after commit
0c790fd, their results kept in ``results/h200/``: transformers' continuous batching manager (``hf-cb``, m04's
yardstick) and ``generate`` with a static cache and compiled decoding steps (``hf-compiled``, m10 and m12's peer).
"""

from __future__ import annotations

import time

import torch

from milestones.m01_naive_loop.config import EngineConfig
from milestones.m01_naive_loop.loader import PRESETS, load_model, preset_config
from milestones.m01_naive_loop.request import RequestMetrics, RequestOutput

from .runners import PhaseResult, Runner, kv_bytes_per_token, register_runner, sync, warmup_requests
from .workloads import MAX_IN_FLIGHT, Phase, RequestSpec, Workload

PAD_ID = 0  # any id works: padded positions are masked out


def build_hf_model(model: str, device: torch.device, dtype: torch.dtype, seed: int):
    """``transformers.Qwen3ForCausalLM`` with our engine's weights (presets) or the checkpoint's (directories)."""
    import transformers

    if model in PRESETS:
        config = preset_config(model)
        config._attn_implementation = "sdpa"
        with torch.device(device):
            hf = transformers.Qwen3ForCausalLM(config)
        ours = load_model(model, device, dtype, seed=seed).model
        hf.to(dtype)
        missing, unexpected = hf.load_state_dict(ours.state_dict(), strict=False)
        missing = [k for k in missing if not (config.tie_word_embeddings and k == "lm_head.weight")]
        if missing or unexpected:
            raise RuntimeError(f"weights do not line up: missing {missing[:3]}, unexpected {unexpected[:3]}")
        del ours
    else:
        hf = transformers.Qwen3ForCausalLM.from_pretrained(model, dtype=dtype, attn_implementation="sdpa").to(device)
    hf.eval().requires_grad_(False)
    hf.generation_config.eos_token_id = None  # ignore_eos: never stop early
    hf.generation_config.pad_token_id = PAD_ID
    return hf


def _output(request_id: str, spec: RequestSpec, tokens: list[int], arrival: float, times: list[float]) -> RequestOutput:
    times = times[: len(tokens)]
    metrics = RequestMetrics(arrival, times[0] if times else None, list(times), times[-1] if times else None)
    return RequestOutput(request_id, None, list(spec.prompt_token_ids), list(tokens), "", "length", metrics)


@register_runner("hf-static")
class HFStaticRunner(Runner):
    """``model.generate`` over static batches of ``max_num_seqs`` requests, in request order."""

    engine_label = "transformers.generate (static batches, left padding)"
    gate_skip_reason = "a transformers baseline: it is the reference itself"  # the gate's record says this

    @classmethod
    def cannot_run(cls, workload: Workload) -> str | None:
        if workload.needs_step_api:
            return (f"{cls.name} runs whole batches; it cannot stop one request at its real length, and workload "
                    f"{workload.name} needs that (client: {workload.client})")
        return None

    def __init__(self, workload: Workload, *, model: str, device: str, dtype: str, seed: int,
                 overrides: dict | None = None, kv_tokens: int | None = None, inject: bool = True) -> None:
        import transformers

        transformers.logging.set_verbosity_error()
        shared = EngineConfig(model=model, device=device, dtype=dtype, seed=seed)
        self.device = shared.resolve_device()
        self.dtype = shared.resolve_dtype(self.device)
        self.model_name, self.seed = model, seed
        self.overrides = dict(overrides or {})
        self.max_num_seqs = int(self.overrides.pop("max_num_seqs", workload.max_num_seqs or MAX_IN_FLIGHT))
        if self.overrides:
            raise ValueError(f"{self.name} has no knob(s) {sorted(self.overrides)} (it takes: max_num_seqs)")
        self.model = build_hf_model(model, self.device, self.dtype, seed)
        self.kv_bytes_per_token = kv_bytes_per_token(self.model.config, self.dtype)

    def knobs(self) -> dict:
        import transformers

        return {"model": self.model_name, "device": str(self.device),
                "dtype": str(self.dtype).removeprefix("torch."), "seed": self.seed,
                "max_num_seqs": self.max_num_seqs, "transformers": transformers.__version__,
                "attn_implementation": getattr(self.model.config, "_attn_implementation", None),
                "batching": "static, request order", "padding": "left, to the longest prompt",
                "max_new_tokens": "longest output asked for in the batch", "eos": "ignored"}

    def close(self) -> None:
        del self.model

    def _generate(self, batch: list[RequestSpec]) -> tuple[torch.Tensor, list[float], int]:
        """One static batch, left-padded: its generated tokens ``[rows, new_tokens]``, the time after each
        step, and the padded prompt length."""
        from transformers import StoppingCriteriaList

        longest = max(r.prompt_len for r in batch)
        ids = torch.full((len(batch), longest), PAD_ID, dtype=torch.long)
        mask = torch.zeros((len(batch), longest), dtype=torch.long)
        for row, r in enumerate(batch):
            ids[row, longest - r.prompt_len:] = torch.tensor(r.prompt_token_ids)
            mask[row, longest - r.prompt_len:] = 1
        new_tokens = max(r.max_tokens for r in batch)
        times: list[float] = []

        def note_time(input_ids: torch.Tensor, scores, **kwargs) -> torch.Tensor:  # a criterion that never stops
            sync(self.device)
            times.append(time.perf_counter())
            return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)

        with torch.inference_mode():
            out = self.model.generate(
                input_ids=ids.to(self.device), attention_mask=mask.to(self.device), max_new_tokens=new_tokens,
                do_sample=False, eos_token_id=None, pad_token_id=PAD_ID, use_cache=True,
                stopping_criteria=StoppingCriteriaList([note_time]),
            )
        generated = out[:, longest:].cpu()
        if generated.shape[1] != new_tokens:
            raise RuntimeError(f"generate stopped after {generated.shape[1]} of {new_tokens} tokens")
        return generated, times, longest

    def warmup(self) -> None:
        self._generate(warmup_requests())

    def batches(self, phase: Phase) -> list[list[RequestSpec]]:
        """The static batches of a phase: ``max_num_seqs`` requests at a time, in request order."""
        requests = list(phase.requests)
        return [requests[first:first + self.max_num_seqs] for first in range(0, len(requests), self.max_num_seqs)]

    def run_phase(self, phase: Phase, use_tqdm: bool) -> PhaseResult:
        from tqdm.auto import tqdm

        stats = dict(steps=0, tokens_computed=0, padding_tokens=0, prompt_tokens_computed=0,
                     kv_reserved_peak_bytes=0, kv_used_peak_bytes=0)
        outputs: list[RequestOutput] = []
        sync(self.device)
        start = time.perf_counter()
        with tqdm(total=len(phase.requests), desc=self.name, unit="req", disable=not use_tqdm) as bar:
            for batch in self.batches(phase):
                generated, times, longest = self._generate(batch)
                for row, spec in enumerate(batch):
                    tokens = generated[row, :spec.max_tokens].tolist()
                    outputs.append(_output(str(len(outputs)), spec, tokens, start, times))
                new_tokens = generated.shape[1]
                computed = len(batch) * (longest + new_tokens - 1)
                useful = sum(r.prompt_len + r.max_tokens - 1 for r in batch)
                stats["steps"] += new_tokens
                stats["tokens_computed"] += computed
                stats["padding_tokens"] += computed - useful
                stats["prompt_tokens_computed"] += sum(r.prompt_len for r in batch)
                # a dynamic cache holds every row at the padded length to the end: every position computed
                stats["kv_reserved_peak_bytes"] = max(stats["kv_reserved_peak_bytes"],
                                                      computed * self.kv_bytes_per_token)
                stats["kv_used_peak_bytes"] = max(stats["kv_used_peak_bytes"], useful * self.kv_bytes_per_token)
                bar.update(len(batch))
        sync(self.device)
        return PhaseResult(outputs, time.perf_counter() - start, stats)  # harness adds useful_token_fraction
