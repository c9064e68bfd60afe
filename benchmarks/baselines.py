"""transformers as the yardstick, on exactly our weights: ``generate`` on static batches (``hf-static``), the
same with a static cache and compiled decoding steps (``hf-compiled``: the peer m10's CUDA graphs must beat), and
its continuous batching manager (``hf-cb``). How each is driven, credited and timed: docs/benchmarks.md, "The
engines".
"""

from __future__ import annotations

import dataclasses
import logging
import math
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


class _BaselineRunner(Runner):
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
        logging.getLogger("ContinuousBatchingLogger").setLevel(logging.ERROR)
        shared = EngineConfig(model=model, device=device, dtype=dtype, seed=seed)
        self.device = shared.resolve_device()
        self.dtype = shared.resolve_dtype(self.device)
        self.model_name, self.seed = model, seed
        self.overrides = dict(overrides or {})
        self.max_num_seqs = int(self.overrides.pop("max_num_seqs", workload.max_num_seqs or MAX_IN_FLIGHT))
        self.model = build_hf_model(model, self.device, self.dtype, seed)
        self.kv_bytes_per_token = kv_bytes_per_token(self.model.config, self.dtype)
        self.kv_tokens = kv_tokens

    def _base_knobs(self) -> dict:
        import transformers

        return {"model": self.model_name, "device": str(self.device),
                "dtype": str(self.dtype).removeprefix("torch."), "seed": self.seed,
                "max_num_seqs": self.max_num_seqs, "transformers": transformers.__version__,
                "attn_implementation": getattr(self.model.config, "_attn_implementation", None)}

    def close(self) -> None:
        del self.model


@register_runner("hf-static")
class HFStaticRunner(_BaselineRunner):
    """``model.generate`` over static batches of ``max_num_seqs`` requests, in request order."""

    engine_label = "transformers.generate (static batches, left padding)"
    extra_knobs: tuple[str, ...] = ()  # config overrides a subclass takes besides max_num_seqs

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        unknown = sorted(set(self.overrides) - set(self.extra_knobs))
        if unknown:
            raise ValueError(f"{self.name} has no knob(s) {unknown} (it takes: "
                             f"{', '.join(('max_num_seqs',) + self.extra_knobs)})")

    def knobs(self) -> dict:
        return {**self._base_knobs(), "batching": "static, request order", "padding": "left, to the longest prompt",
                "max_new_tokens": "longest output asked for in the batch", "eos": "ignored"}

    def _generate_kwargs(self) -> dict:  # a subclass's cache and compilation settings
        return {}

    def _generate(self, batch: list[RequestSpec], max_new_tokens: int | None = None
                  ) -> tuple[torch.Tensor, list[float], int]:
        """One static batch, left-padded: its generated tokens ``[rows, new_tokens]``, the time after each
        step, and the padded prompt length. ``max_new_tokens`` caps the batch's longest output (warm-ups)."""
        from transformers import StoppingCriteriaList

        longest = max(r.prompt_len for r in batch)
        ids = torch.full((len(batch), longest), PAD_ID, dtype=torch.long)
        mask = torch.zeros((len(batch), longest), dtype=torch.long)
        for row, r in enumerate(batch):
            ids[row, longest - r.prompt_len:] = torch.tensor(r.prompt_token_ids)
            mask[row, longest - r.prompt_len:] = 1
        new_tokens = min(max(r.max_tokens for r in batch), max_new_tokens or math.inf)
        times: list[float] = []

        def note_time(input_ids: torch.Tensor, scores, **kwargs) -> torch.Tensor:  # a criterion that never stops
            sync(self.device)
            times.append(time.perf_counter())
            return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)

        with torch.inference_mode():
            out = self.model.generate(
                input_ids=ids.to(self.device), attention_mask=mask.to(self.device), max_new_tokens=new_tokens,
                do_sample=False, eos_token_id=None, pad_token_id=PAD_ID, use_cache=True,
                stopping_criteria=StoppingCriteriaList([note_time]), **self._generate_kwargs(),
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

    def _kv_reserved_tokens(self, rows: int, longest: int, new_tokens: int) -> int:
        """K/V positions at the batch's peak: a dynamic cache holds every row at the padded length to the end."""
        return rows * (longest + new_tokens - 1)

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
                reserved = self._kv_reserved_tokens(len(batch), longest, new_tokens)
                stats["kv_reserved_peak_bytes"] = max(stats["kv_reserved_peak_bytes"],
                                                      reserved * self.kv_bytes_per_token)
                stats["kv_used_peak_bytes"] = max(stats["kv_used_peak_bytes"], useful * self.kv_bytes_per_token)
                bar.update(len(batch))
        sync(self.device)
        return PhaseResult(outputs, time.perf_counter() - start, stats)  # harness adds useful_token_fraction


WARMUP_NEW_TOKENS = 8  # hf-compiled's warm-up: a prefill and 7 decoding steps: compile, record the graphs, replay
DEFAULT_COMPILE = {"compile_backend": "inductor", "compile_mode": "reduce-overhead"}


def compile_counts() -> dict[str, int]:
    """dynamo's own counters, for this process so far: graphs torch.compile has built, and compiled graphs
    inductor chose not to replay as CUDA graphs (it also logs why; on a CPU every inductor graph counts, on the
    GPU 0 is what ``mode="reduce-overhead"`` should give)."""
    counters = torch._dynamo.utils.counters
    return {"torch_compilations": int(counters["stats"]["unique_graphs"]),
            "cudagraph_skips": int(counters["inductor"]["cudagraph_skips"])}


@register_runner("hf-compiled")
class HFCompiledRunner(HFStaticRunner):
    """hf-static with ``cache_implementation="static"`` and generate's compiled decoding step, warmed up on
    every batch shape of the workload."""

    engine_label = "transformers.generate (static batches, left padding, static cache, compiled decoding)"
    extra_knobs = tuple(DEFAULT_COMPILE)  # compile_backend="aot_eager" tests the plumbing on a CPU in seconds
    gate_skip_reason = ("transformers' compiled generate: its float32 tokens equal hf-static's in the CPU tests; "
                        "a check here would compile it once more (a minute or two)")

    def __init__(self, workload: Workload, **kwargs) -> None:
        super().__init__(workload, **kwargs)
        from transformers import CompileConfig

        knobs = {**DEFAULT_COMPILE, **self.overrides}
        self.compile_config = CompileConfig(backend=knobs["compile_backend"], mode=knobs["compile_mode"],
                                            fullgraph=True, dynamic=False)
        if self.device.type != "cuda":
            # generate compiles on its own only on accelerators; this flag (transformers' own, "useful for
            # testing purposes") lets a CPU run the same code path.
            self.compile_config._compile_all_devices = True
        self.phases = workload.phases
        # positions a batch fills: its padded prompt length plus its longest output
        self.max_cache_len = max(max(r.prompt_len for r in batch) + max(r.max_tokens for r in batch)
                                 for phase in self.phases for batch in self.batches(phase))

    def _generate_kwargs(self) -> dict:
        return {"cache_implementation": "static", "max_cache_len": self.max_cache_len,
                "compile_config": self.compile_config}

    def _kv_reserved_tokens(self, rows: int, longest: int, new_tokens: int) -> int:
        return rows * max(self.max_cache_len, longest + new_tokens)  # the static cache, whatever the batch uses

    def knobs(self) -> dict:
        config = self.compile_config
        return {**super().knobs(), "cache_implementation": "static", "max_cache_len": self.max_cache_len,
                "compile": {"backend": config.backend, "mode": config.mode, "fullgraph": config.fullgraph,
                            "dynamic": config.dynamic,
                            "scope": "generate's decoding forward (CompileConfig); the prefill runs eager"},
                "timestamps": "after every step, after a device sync (transformers' loop syncs every step too)"}

    def warmup(self) -> dict:
        """The first batch of every distinct row count, twice, outputs capped: every shape a timed run meets."""
        first_of_each: dict[int, list[RequestSpec]] = {}
        for phase in self.phases:
            for batch in self.batches(phase):
                first_of_each.setdefault(len(batch), batch)
        shapes = []
        for rows, batch in first_of_each.items():
            before, calls = compile_counts(), []
            for _ in range(2):
                began = time.perf_counter()
                self._generate(batch, max_new_tokens=WARMUP_NEW_TOKENS)
                calls.append(time.perf_counter() - began)
            shapes.append({"rows": rows, "prompt_len": max(r.prompt_len for r in batch),
                           "max_cache_len": self.max_cache_len,
                           "new_tokens": min(WARMUP_NEW_TOKENS, max(r.max_tokens for r in batch)),
                           "first_call_s": calls[0], "second_call_s": calls[1],
                           **{key: count - before[key] for key, count in compile_counts().items()}})
        # transformers sets _compiled_call when it compiles the decoding forward (get_compiled_call): without it,
        # every step ran eagerly. (A count of compilations cannot tell: a graph cached earlier may be reused.)
        if not hasattr(self.model, "_compiled_call") and any(s["new_tokens"] > 1 for s in shapes):
            raise RuntimeError("generate did not compile its decoding step (transformers' auto-compile criteria "
                               "were not met): this run would measure an eager static cache, not hf-compiled")
        return {"what": f"the first batch of each distinct row count, twice, outputs capped at "
                        f"{WARMUP_NEW_TOKENS} tokens",
                "num_requests": 2 * sum(len(b) for b in first_of_each.values()), "shapes": shapes,
                **{key: sum(s[key] for s in shapes) for key in before},
                "compile_s_estimate": sum(s["first_call_s"] - s["second_call_s"] for s in shapes)}

    def run_phase(self, phase: Phase, use_tqdm: bool):
        before = compile_counts()["torch_compilations"]
        result = super().run_phase(phase, use_tqdm)
        # 0: the warm-up covered every shape
        result.stats["torch_compilations"] = compile_counts()["torch_compilations"] - before
        return result

    def close(self) -> None:
        super().close()
        torch._dynamo.reset()  # the compiled graphs and CUDA graph pools hold memory (and the weights) otherwise


PAGE_TOKENS = 256  # K/V tokens per page of hf-cb's cache: transformers' default (5.17's block_size, 5.24's page_size)


@register_runner("hf-cb")
class HFContinuousBatchingRunner(_BaselineRunner):
    """transformers' continuous batching manager: every request submitted at once, its own ``max_new_tokens``."""

    engine_label = "transformers continuous batching (paged attention)"
    holds_kv_pool = True

    def __init__(self, workload: Workload, **kwargs) -> None:
        super().__init__(workload, **kwargs)
        from transformers import GenerationConfig

        self.workload = workload
        self.generation_config = GenerationConfig(do_sample=False, max_new_tokens=max(r.max_tokens for r in
                                                  workload.requests), pad_token_id=PAD_ID)
        self.generation_config.eos_token_id = None  # the manager turns this into -1: no EOS
        self.manager = None
        self.cb_config = self._cb_config()

    def _cb_config(self):
        from transformers import ContinuousBatchingConfig  # transformers 5.x; an older one fails here, in one line

        names = {f.name for f in dataclasses.fields(ContinuousBatchingConfig)}
        unknown = sorted(set(self.overrides) - names)
        if unknown:
            raise ValueError(f"ContinuousBatchingConfig has no field(s) {unknown}")
        wanted = {"max_requests_per_batch": self.max_num_seqs,
                  # transformers >= 5.2x would switch sdpa to a flash kernel if one is installed; keep sdpa.
                  "auto_switch_to_flash": False}
        reqs = self.workload.requests
        if self.device.type != "cuda":
            # Off the GPU, the manager would size its cache from host memory and warm up at that size (tens of
            # seconds on a laptop). Size it for this workload instead; on CUDA, transformers' own sizing stands.
            wanted["page_size" if "page_size" in names else "block_size"] = PAGE_TOKENS
            wanted["num_blocks"] = sum(-(-(r.prompt_len + r.max_tokens) // PAGE_TOKENS) for r in reqs) + 2
            wanted["max_batch_tokens"] = max(256, min(4096, max(r.prompt_len for r in reqs)))
        elif self.kv_tokens is not None:
            # Asked to share the GPU (an interleaved comparison): hold what the workload needs, not ~90% of it.
            wanted["num_blocks"] = -(-self.kv_tokens // PAGE_TOKENS) + 2
        wanted.update(self.overrides)
        return ContinuousBatchingConfig(**{k: v for k, v in wanted.items() if k in names})

    def knobs(self) -> dict:
        # the manager's is resolved (num_blocks, max_batch_tokens ...); before it starts, what we asked for
        cb = getattr(self.manager, "continuous_batching_config", None) or self.cb_config
        return {**self._base_knobs(), "api": "manager", "per_request_max_new_tokens": True,
                "eos": "ignored", "continuous_batching_config": cb,
                "attn_implementation_during_run": getattr(self, "_attn_during_run", None)}

    def _start(self) -> None:
        from transformers.generation.continuous_batching.utils import WorkloadHints

        reqs = self.workload.requests
        hints = WorkloadHints(max_prompt_length=max(r.prompt_len for r in reqs),
                              max_generated_length=max(r.max_tokens for r in reqs), num_requests=len(reqs))
        self.manager = self.model.init_continuous_batching(
            generation_config=self.generation_config, continuous_batching_config=self.cb_config, workload_hints=hints)
        self.manager.warmup()  # CUDA graph capture where the manager uses graphs
        self.manager.start()
        self._attn_during_run = getattr(self.model.config, "_attn_implementation", None)

    def _run_requests(self, requests: list[RequestSpec], prefix: str, use_tqdm: bool = False
                      ) -> tuple[list[RequestOutput], float]:
        from tqdm.auto import tqdm

        manager = self.manager
        ids = [f"{prefix}-{i}" for i in range(len(requests))]
        sync(self.device)
        start = time.perf_counter()
        for rid, spec in zip(ids, requests):
            if manager.add_request(list(spec.prompt_token_ids), request_id=rid, max_new_tokens=spec.max_tokens,
                                   record_timestamps=True, eos_token_id=-1) is None:
                raise RuntimeError("the continuous batching manager refused a request")
        results = {}
        with tqdm(total=len(ids), desc="hf-cb", unit="req", disable=not use_tqdm) as bar:
            while len(results) < len(ids):
                result = manager.get_result(timeout=1)
                if result is None:
                    if not manager.is_running():
                        raise RuntimeError("the continuous batching thread stopped before every request finished")
                    continue
                if result.is_finished():
                    if result.error:
                        raise RuntimeError(f"request {result.request_id} failed: {result.error}")
                    results[result.request_id] = result
                    bar.update(1)
        sync(self.device)
        wall = time.perf_counter() - start
        return [_output(rid, spec, list(results[rid].generated_tokens)[:spec.max_tokens], start,
                        list(results[rid].timestamps or [])) for rid, spec in zip(ids, requests)], wall

    def warmup(self) -> None:
        self._start()
        self._run_requests(warmup_requests(), "warmup")

    def run_phase(self, phase: Phase, use_tqdm: bool) -> PhaseResult:
        requests = list(phase.requests)
        if self.manager is None:
            self._start()
        outputs, wall = self._run_requests(requests, phase.label, use_tqdm)
        stats = dict(steps=None, tokens_computed=None, padding_tokens=None,
                     prompt_tokens_computed=sum(r.prompt_len for r in requests),
                     kv_reserved_peak_bytes=self._kv_reserved(), kv_used_peak_bytes=None)
        return PhaseResult(outputs, wall, stats)

    def reset(self) -> bool:
        """A new manager: transformers may share cached blocks between requests (``allow_block_sharing``)."""
        if self.manager is not None:
            self._stop()
            self.warmup()
        return True

    def _kv_reserved(self) -> int | None:
        cb = getattr(self.manager, "continuous_batching_config", None)  # resolved when the manager started
        blocks = getattr(cb, "num_blocks", None)
        page = getattr(cb, "page_size", None) or getattr(cb, "block_size", None)
        return blocks * page * self.kv_bytes_per_token if blocks and page else None

    def _stop(self) -> None:
        try:
            self.manager.stop(block=True, timeout=30, hard_stop=True)
        finally:
            self.manager.destroy()
            self.manager = None

    def close(self) -> None:
        if self.manager is not None:
            self._stop()
        super().close()
