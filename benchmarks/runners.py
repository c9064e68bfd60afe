"""Runners: one engine on one device, driven the way a workload says; the harness only talks to this interface.

A milestone (``m04``, ``m04_continuous_batching``) is found under ``milestones/`` and run by ``MilestoneRunner``;
anything else is looked up in a registry filled by ``@register_runner("hf-static")`` in the modules named in
``RUNNER_PLUGINS`` (imported on first lookup, so the imports run one way). K/V sizing: docs/benchmarks.md.

    runner = make_runner("m04", workload, model="tiny", device="cpu", dtype="auto", seed=0)
    runner.warmup(); result = runner.run_phase(workload.phases[0], use_tqdm=False); runner.close()
"""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil
import random
import time
from collections.abc import Callable, Sequence

import torch

from milestones.m01_naive_loop.request import RequestOutput
from milestones.m04_continuous_batching.kv_pool import KVPool

from .workloads import Phase, RequestSpec, Workload, milestone_key

RUNNER_PLUGINS = ("benchmarks.baselines",)  # modules whose import registers runners
STEP_API = ("add_request", "step", "has_unfinished", "abort")
WARMUP_PROMPT_LENS = (16, 32)  # two short requests ...
WARMUP_OUTPUT_LEN = 8  # ... of a few decode steps each
KV_KNOBS = ("kv_cache_memory_bytes", "kv_cache_tokens", "gpu_memory_utilization")  # an override of one wins


class WorkloadNotSupported(Exception):
    """This engine cannot run this workload at all (no step API, too few positions...): a skip, not a failure."""


@dataclasses.dataclass
class PhaseResult:
    outputs: list[RequestOutput]
    wall_time_s: float
    stats: dict  # EngineStats.as_dict()-like; values may be None where unknown


class Runner:
    """One engine on one device, built as ``cls(workload, model=, device=, dtype=, seed=, overrides=, kv_tokens=,
    inject=)``: ``knobs()`` (its config, for the JSON), ``warmup()`` (untimed, on ``warmup_requests()``),
    ``run_phase``, ``reset()`` and ``close()``."""

    name: str = "?"  # registry name, or the milestone's short name
    engine_label: str = "?"
    mode: str | None = "generate: all requests submitted at once"  # how the last phase was driven
    device: torch.device
    dtype: torch.dtype

    @classmethod
    def cannot_run(cls, workload: Workload) -> str | None:
        """Why this kind of runner can never run ``workload`` (checked before building anything), or None."""
        return None

    def reset(self) -> bool:
        """Forget what earlier runs left that would speed up the next (a prefix cache), so that repeated runs
        measure the same work. False if this runner cannot: it must be built again."""
        return True

    def close(self) -> None:
        pass


_RUNNERS: dict[str, type[Runner]] = {}


def register_runner(name: str) -> Callable[[type[Runner]], type[Runner]]:
    """Class decorator: ``@register_runner("hf-static")`` makes ``make_runner("hf-static", ...)`` build it."""

    def decorate(cls: type[Runner]) -> type[Runner]:
        if _RUNNERS.get(name, cls) is not cls:
            raise ValueError(f"a runner named {name!r} is already registered ({_RUNNERS[name].__qualname__})")
        cls.name = name
        _RUNNERS[name] = cls
        return cls

    return decorate


def registered_runners() -> dict[str, type[Runner]]:
    for module in RUNNER_PLUGINS:
        importlib.import_module(module)
    return dict(_RUNNERS)


def resolve_milestone_module(milestone: str) -> str:
    """``m02`` or ``m02_kv_cache`` -> ``milestones.m02_kv_cache``."""
    import milestones

    names = sorted(m.name for m in pkgutil.iter_modules(milestones.__path__)
                   if m.ispkg and m.name[:1] == "m" and m.name[1:3].isdigit())  # not milestones._course
    for name in names:
        if milestone in (name, milestone_key(name)):
            return f"milestones.{name}"
    raise ValueError(f"unknown engine {milestone!r}: choose from {', '.join(names + list(registered_runners()))}")


def model_config(model: str):
    """The transformers config of a preset or checkpoint, without loading weights."""
    from transformers import Qwen3Config

    from milestones.m01_naive_loop.loader import PRESETS, preset_config, resolve_checkpoint

    return preset_config(model) if model in PRESETS else Qwen3Config.from_pretrained(resolve_checkpoint(model))


# K and V of one token over all layers: 2 * layers * kv_heads * head_dim * element size, as m04's pool counts it.
kv_bytes_per_token = KVPool.bytes_per_token


BLOCK_SLACK_TOKENS = 32  # per request in flight: rounding up to whole blocks (block sizes up to 32 tokens)


def kv_tokens_needed(workload: Workload) -> int:
    """K/V tokens that never make the workload wait or preempt: all of it at once, or, when that is more, twice
    what its in-flight cap can hold at once (room for a contiguous allocator's holes); plus a block's rounding
    per request in flight, and never less than the warm-up requests need."""
    sizes = sorted((r.prompt_len + r.max_tokens for r in workload.requests), reverse=True)
    cap = min(workload.max_num_seqs or 1, len(sizes))
    need = min(sum(sizes), 2 * sum(sizes[:cap])) + BLOCK_SLACK_TOKENS * cap
    return max(need, sum(n + WARMUP_OUTPUT_LEN + BLOCK_SLACK_TOKENS for n in WARMUP_PROMPT_LENS))


def cannot_run(name: str, workload: Workload, model: str) -> str | None:
    """Why ``name`` cannot run ``workload`` on ``model`` (checked before building anything), or None."""
    config = model_config(model)
    if workload.max_seq_len > config.max_position_embeddings:
        return (f"workload {workload.name} needs {workload.max_seq_len:,} positions (prompt + max_tokens), model "
                f"{model} has {config.max_position_embeddings:,}: use a longer model or fewer requests")
    runners = registered_runners()
    if name in runners:
        return runners[name].cannot_run(workload)
    engine_cls = importlib.import_module(resolve_milestone_module(name)).LLMEngine
    if workload.needs_step_api and not has_step_api(engine_cls):
        return (f"{milestone_key(name)} has no step API ({', '.join(STEP_API)}), and workload {workload.name} "
                f"needs one (its client {workload.client}s requests one by one)")
    return None


def has_step_api(engine) -> bool:
    return all(callable(getattr(engine, name, None)) for name in STEP_API)


def holds_kv_pool(name: str) -> bool:
    """Whether the engine keeps a K/V pool sized up front (and takes ``kv_tokens``), rather than allocating
    K/V per batch as it goes: milestones whose ``EngineConfig`` has a K/V knob (never transformers' batches)."""
    if name in registered_runners():
        return False
    config_cls = importlib.import_module(resolve_milestone_module(name)).EngineConfig
    return bool({f.name for f in dataclasses.fields(config_cls)} & set(KV_KNOBS))


def make_runner(name: str, workload: Workload, **kwargs) -> Runner:
    """Build the runner called ``name`` (a registered runner or a milestone) for ``workload``; ``kwargs`` are the
    ``Runner`` constructor's."""
    runners = registered_runners()
    if name in runners:
        return runners[name](workload, **kwargs)
    return MilestoneRunner(workload, module_name=resolve_milestone_module(name), **kwargs)


def warmup_requests(seed: int = 12345) -> list[RequestSpec]:
    rng = random.Random(seed)
    return [RequestSpec(tuple(rng.randrange(1000, 100000) for _ in range(n)), WARMUP_OUTPUT_LEN)
            for n in WARMUP_PROMPT_LENS]


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class MilestoneRunner(Runner):
    """A milestone's ``LLMEngine``, greedy with ``ignore_eos``: ``generate`` per phase, or the step API where the
    workload's client needs it (``inject``: long prompts added mid-decode; ``abort``: at ``stop_after`` tokens)."""

    def __init__(self, workload: Workload, *, module_name: str, model: str, device: str, dtype: str, seed: int,
                 overrides: dict | None = None, kv_tokens: int | None = None, inject: bool = True) -> None:
        module = importlib.import_module(module_name)
        self.module_name = self.engine_label = module_name
        self.name = milestone_key(module_name.removeprefix("milestones."))
        self.SamplingParams = module.SamplingParams
        config_cls = module.EngineConfig
        fields = {f.name for f in dataclasses.fields(config_cls)}
        overrides = dict(overrides or {})
        unknown = sorted(set(overrides) - fields)
        if unknown:
            raise ValueError(f"{module_name}.EngineConfig has no field(s) {unknown} "
                             f"(it has: {', '.join(sorted(fields))})")
        kwargs = {"model": model, "device": device, "dtype": dtype, "seed": seed}
        if workload.max_num_seqs is not None and "max_num_seqs" in fields:
            kwargs["max_num_seqs"] = workload.max_num_seqs
        config = config_cls(**{**kwargs, **overrides})
        self.kv_sizing = self._kv_sizing(config, fields, workload, model, kv_tokens, overrides)
        if self.kv_sizing.get("knob"):
            config = dataclasses.replace(config, **{self.kv_sizing["knob"]: self.kv_sizing["value"]})
        self.engine = module.LLMEngine(config)
        self.device, self.dtype = self.engine.device, self.engine.dtype
        self.workload, self.inject, self.mode = workload, inject, None

    @staticmethod
    def _kv_sizing(config, fields: set[str], workload: Workload, model: str, kv_tokens: int | None,
                   overrides: dict) -> dict:
        """Which K/V knob gets which value, and why (recorded in the result JSON as ``kv_sizing``)."""
        if set(overrides) & set(KV_KNOBS):
            return {"source": "config override", "knob": None}
        if workload.kv_budget_gib is None and kv_tokens is None:
            return {"source": "engine default", "knob": None}
        # An FP8 K/V cache (m13's kv_cache_dtype) stores one byte per element whatever the model's dtype.
        kv_dtype = torch.float8_e4m3fn if getattr(config, "kv_cache_fp8", False) else \
            config.resolve_dtype(config.resolve_device())
        per_token = kv_bytes_per_token(model_config(model), kv_dtype)
        # Split across ranks (m14), a rank holds 1/N of each token's K/V: the same tokens at any split.
        per_token //= getattr(config, "tensor_parallel_size", 1)
        if workload.kv_budget_gib is not None:
            source, budget = f"workload budget: {workload.kv_budget_gib} GiB", int(workload.kv_budget_gib * 2**30)
        else:
            source, budget = f"enough for the workload: {kv_tokens} tokens", kv_tokens * per_token
        sizing = {"source": source, "budget_bytes": budget, "bytes_per_token": per_token}
        if "kv_cache_memory_bytes" in fields:
            sizing.update(knob="kv_cache_memory_bytes", value=budget)
        elif "kv_cache_tokens" in fields:
            sizing.update(knob="kv_cache_tokens", value=budget // per_token)
        elif workload.kv_budget_gib is not None:
            raise WorkloadNotSupported(f"workload {workload.name} sets a K/V budget, but this engine's EngineConfig "
                                       f"has no K/V knob ({' or '.join(KV_KNOBS[:2])})")
        else:
            sizing.update(knob=None, note="no K/V pool knob: the engine allocates K/V as it needs it")
        return sizing

    def knobs(self) -> dict:
        """The engine's config, plus the K/V pool it resolved: ``kv_pool.capacity`` (token slots, m04 on) and, for a
        paged pool (m05 on), ``num_blocks`` x ``block_size``; none of these for engines without a pool."""
        pool = getattr(self.engine, "kv_pool", None)
        found = {"kv_pool_tokens": getattr(pool, "capacity", None), "kv_pool_blocks": getattr(pool, "num_blocks", None),
                 "kv_block_size": getattr(pool, "block_size", None)}
        return {**dataclasses.asdict(self.engine.config), **{k: v for k, v in found.items() if isinstance(v, int)}}

    def _params(self, requests: Sequence[RequestSpec]) -> list:
        return [self.SamplingParams(max_tokens=r.max_tokens, temperature=0.0, ignore_eos=True) for r in requests]

    def warmup(self) -> None:
        requests = warmup_requests()
        self.engine.generate([list(r.prompt_token_ids) for r in requests], self._params(requests), use_tqdm=False)
        sync(self.device)

    def run_phase(self, phase: Phase, use_tqdm: bool) -> PhaseResult:
        client = self.workload.client
        if client == "abort":  # cannot_run has refused engines without a step API
            self.mode = "step API: the client aborts each request when it has its real length (stop_after)"
            return self._run_steps(phase, None, use_tqdm)
        every = self.workload.params.get("inject_every_decode_steps")
        longs = any(r.group == "long_prompt" for r in phase.requests)
        if client == "inject" and self.inject and has_step_api(self.engine) and longs:
            self.mode = f"step API: long prompt k added after {every} * (k + 1) engine steps"
            return self._run_steps(phase, every, use_tqdm)
        self.mode = "generate: all requests submitted at once"
        sync(self.device)
        start = time.perf_counter()
        outputs = self.engine.generate([list(r.prompt_token_ids) for r in phase.requests],
                                       self._params(phase.requests), use_tqdm=use_tqdm)
        sync(self.device)
        return PhaseResult(outputs, time.perf_counter() - start, self.engine.stats.as_dict())

    def reset(self) -> bool:
        """vLLM's ``reset_prefix_cache()`` where the engine has it; without it, an engine whose prefix cache is
        on (m06 on) would find the previous run's prompts cached, so it must be built again."""
        reset_prefix_cache = getattr(self.engine, "reset_prefix_cache", None)
        if callable(reset_prefix_cache):
            reset_prefix_cache()
            return True
        return not getattr(self.engine.config, "enable_prefix_caching", False)

    @torch.inference_mode()
    def _run_steps(self, phase: Phase, inject_every: int | None, use_tqdm: bool) -> PhaseResult:
        """Drive the step API as a client would: long prompt ``k`` added after ``inject_every * (k + 1)`` steps (or
        when the engine runs dry), a request with ``stop_after`` aborted after the step that gave it that many."""
        from tqdm.auto import tqdm

        engine = self.engine
        engine.stats = engine.new_stats()  # generate() resets the counters; the step API leaves that to us
        specs = phase.requests
        later = [i for i, r in enumerate(specs) if inject_every and r.group == "long_prompt"]
        params = self._params(specs)
        index: dict[str, int] = {}  # request id -> position in the phase
        latest: dict[int, RequestOutput] = {}
        sync(self.device)
        start = time.perf_counter()
        for i, spec in enumerate(specs):
            if i not in later:
                index[engine.add_request(list(spec.prompt_token_ids), params[i])] = i
        steps = injected = 0
        with tqdm(total=len(specs), desc=f"{self.name} (step API)", unit="req", disable=not use_tqdm) as bar:
            while later or engine.has_unfinished():
                if later and (steps >= inject_every * (injected + 1) or not engine.has_unfinished()):
                    i = later.pop(0)
                    index[engine.add_request(list(specs[i].prompt_token_ids), params[i])] = i
                    injected += 1
                for output in engine.step():
                    i = index[output.request_id]
                    stop = specs[i].stop_after
                    if output.finish_reason is None and stop is not None and len(output.token_ids) >= stop:
                        engine.abort(output.request_id)  # the client has what it wanted
                        output = dataclasses.replace(output, finish_reason="abort")
                    latest[i] = output
                    if output.finish_reason is not None:
                        bar.update(1)
                steps += 1
        sync(self.device)
        wall = time.perf_counter() - start
        return PhaseResult([latest[i] for i in range(len(specs))], wall, engine.stats.as_dict())

    def close(self) -> None:
        close = getattr(self.engine, "close", None)
        if callable(close):  # m14: stop the worker processes now, not whenever the engine is collected
            close()
        del self.engine
