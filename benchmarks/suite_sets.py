"""The named sets of the GPU suite: what ``benchmarks/gpu_suite.sh --set NAME`` runs, named by what they measure:
the sets behind the figures the docs quote, and what ``gpu_*.sh`` run (which sets a past call ran is in its record,
``results/h200/calls/``; the sets retired since are in ``git show 0c790fd:benchmarks/suite_sets.py``). Entries:
``Run`` (one timed run), ``Compare`` (interleaved repeats: every ratio the docs quote) and ``Gate`` (gate checks
only). Times are rough H200 seconds (qwen3-0.6b-random, bf16): a run's ``est_s`` includes build and warm-up; a
comparison's estimate is each engine's ``build_s`` plus ``repeats`` x its ``run_s``. What does not fit the budget
is skipped, not cut.
"""

from __future__ import annotations

from dataclasses import dataclass

from .compare import Member
from .gate import GateItem

GATE_ITEM_S = 6  # one engine on one workload in float32: build, a few requests, the reference answers
GATE_REFERENCE_S = 10  # building the float32 transformers model, once per call


@dataclass(frozen=True)
class Run:
    milestone: str
    workload: str
    est_s: float  # rough H200 time including build and warm-up
    max_requests: int | None = None

    def gate_items(self) -> list[GateItem]:
        return [GateItem(self.milestone, self.workload)]


# The ratios each workload's comparisons report (member / reference).
RATIO_METRICS: dict[str, tuple[str, ...]] = {
    "chunked": ("groups.decoder.itl_p50_s", "groups.decoder.itl_p99_s", "groups.decoder.itl_max_s"),
    "chunked-long": ("groups.decoder.itl_p50_s", "groups.decoder.itl_p99_s", "groups.decoder.itl_max_s"),
    "prefix": ("metrics.ttft_p50_s", "metrics.prompt_tokens_computed", "metrics.wall_time_s"),
    "prefix-large": ("metrics.wall_time_s", "metrics.ttft_p50_s", "metrics.prompt_tokens_computed"),
    "memory-bound": ("metrics.output_tokens_per_s", "metrics.running_mean_while_waiting", "metrics.running_mean",
                     "metrics.kv_reserved_peak_bytes"),
}
DEFAULT_RATIO_METRICS = ("metrics.output_tokens_per_s",)


def as_members(engines: tuple[str | Member, ...]) -> tuple[Member, ...]:
    return tuple(e if isinstance(e, Member) else Member(e) for e in engines)


@dataclass(frozen=True)
class Compare:
    engines: tuple[str | Member, ...]  # the first is the reference of every ratio
    workload: str
    repeats: int = 3
    run_s: float | tuple[float, ...] = 30  # one timed run: one figure for all engines, or one per engine
    build_s: float | tuple[float, ...] = 5  # build + warm-up of one engine: for all, or one per engine

    @property
    def members(self) -> tuple[Member, ...]:
        return as_members(self.engines)

    def est_s(self, members: tuple[Member, ...] | None = None) -> float:
        """Rough seconds for ``members`` (default: all), by their estimates."""
        def per_engine(value: float | tuple[float, ...]) -> dict[Member, float]:
            return dict(zip(self.members, value if isinstance(value, tuple) else (value,) * len(self.engines)))

        runs, builds = per_engine(self.run_s), per_engine(self.build_s)
        return sum(builds[m] + self.repeats * runs[m] for m in (self.members if members is None else members))

    def metrics(self) -> tuple[str, ...]:
        return RATIO_METRICS.get(self.workload, DEFAULT_RATIO_METRICS)

    def gate_items(self) -> list[GateItem]:
        return [GateItem(m.engine, self.workload, m.overrides, m.tag) for m in self.members]


@dataclass(frozen=True)
class Gate:
    engines: tuple[str | Member, ...]
    workloads: tuple[str, ...]

    def gate_items(self) -> list[GateItem]:
        return [GateItem(m.engine, w, m.overrides, m.tag) for m in as_members(self.engines) for w in self.workloads]


Entry = Run | Compare | Gate


FP8_KV = Member("m13", (("kv_cache_dtype", "fp8"),), "fp8kv")  # m13 with its K/V cache in float8 e4m3
FP8_KV_NANOVLLM = Compare(("m13", FP8_KV), "nanovllm", run_s=(15, 13), build_s=20)
KV_2GIB = ("kv_cache_memory_bytes", 2 * 2**30)
PIECEWISE = Member("m12", (("cudagraph_mode", "full_and_piecewise"),), "piecewise")  # mixed steps in pieces


def budgets(milestone: str, values: tuple[int | None, ...]) -> tuple[Member, ...]:
    """The same milestone at several ``max_num_batched_tokens`` (None: unlimited), one member each."""
    return tuple(Member(milestone, (("max_num_batched_tokens", v),), f"mnbt-{'none' if v is None else v}")
                 for v in values)


def tensor_parallel(milestone: str, size: int, *more: tuple[str, object], suffix: str = "") -> Member:
    """``milestone`` split across ``size`` GPUs (m14 on), tagged ``tp<size>`` (then what ``more`` sets, and
    ``suffix``: a result name must not collide with a run on another model)."""
    extra = "".join(f"-{k.split('_')[-1]}" for k, _ in more)
    return Member(milestone, (("tensor_parallel_size", size), *more), f"tp{size}{extra}{suffix}")


SETS: dict[str, list[Entry]] = {  # named by what they measure; calls/*.json record which sets each call ran
    "smoke": [  # every engine on a few requests: does it all run here? (~65 s)
        Run("m01", "single-sweep", 6, max_requests=2), Run("m02", "offline", 12, max_requests=4),
        Run("m03", "offline", 10, max_requests=8), Run("m04", "offline", 10, max_requests=8),
        Run("m04", "memory-bound", 10, max_requests=8), Run("hf-static", "offline", 15, max_requests=8),
    ],
    # ---- interleaved comparisons, one milestone step each (two of them fill one ~560 s call)
    "m03-m06-offline": [Compare(("m03", "m04", "m05", "m06"), "offline", run_s=(13, 13, 13, 13))],
    "m04-m05-memory-bound": [Compare(("m04", "m05"), "memory-bound", run_s=(22, 12))],
    "m04-m06-nanovllm": [Compare(("m04", "m05", "m06"), "nanovllm", run_s=(45, 38, 38))],
    "m05-m06-prefix": [
        Compare(("m05", "m06"), "prefix", run_s=(3, 2)),
        Compare(("m05", "m06"), "prefix-large", run_s=(9, 3)),
    ],
    "m06-m08-offline": [Compare(("m06", "m07", "m08"), "offline", run_s=(10, 10, 9))],
    "m06-m08-nanovllm": [Compare(("m06", "m07", "m08"), "nanovllm", run_s=(32, 30, 20))],
    "m07-budgets": [
        Compare(budgets("m07", (None, 2048, 512, 256)), "chunked", run_s=3),
        Compare(budgets("m07", (None, 2048, 512, 256)), "chunked-long", run_s=(6, 7, 8, 10)),
    ],
    # m10 captures its CUDA graphs when built (build_s); the gate checks it with graphs and without.
    "m09-m10": [
        Gate((Member("m10", (("enforce_eager", True),), "eager"),), ("offline", "nanovllm")),
        Compare(("m09", "m10"), "offline", run_s=(12, 5), build_s=20),
        Compare(("m09", "m10"), "nanovllm", run_s=(22, 8), build_s=20),
        Compare(("m09", "m10"), "memory-bound", run_s=(25, 12), build_s=20),
    ],
    # The host hidden behind the GPU (m12) against m10 and m11 (whose offline generate is m10's, in-process).
    "m10-m12-nanovllm": [Compare(("m10", "m11", "m12"), "nanovllm", run_s=(11, 11, 8), build_s=12)],
    "m10-m12-nanovllm-pair": [Compare(("m10", "m12"), "nanovllm", run_s=(10, 7), build_s=(12, 18))],
    "m12-mixed-step-graphs": [Compare(("m10", PIECEWISE, "m12"), "offline", run_s=(3, 2, 2),
                                      build_s=(12, 18, 18))],  # mixed steps whole against in pieces
    "m10-m12-memory-bound": [Compare(("m10", "m12"), "memory-bound", run_s=(5, 4), build_s=12)],
    # ---- m13: FP8 K/V against the bf16 K/V cache, on Qwen3-0.6B's shape; the gate checks m13 unquantized
    # (gpu_suite.LOSSY_KNOBS). The 8B decode step is quant_step.py's, the logit errors quant_accuracy.py's.
    "m13-fp8-kv-nanovllm": [FP8_KV_NANOVLLM],
    "m13-fp8-kv": [FP8_KV_NANOVLLM, Compare(("m13", FP8_KV), "memory-bound", run_s=(12, 10), build_s=20)],
    # memory-bound's requests at a 2 GiB K/V budget, which binds for both caches (4 GiB does not bind for FP8)
    "m13-fp8-kv-memory-bound-2gib": [Compare((Member("m13", (KV_2GIB,), "kv-2gib"),
                                              Member("m13", (("kv_cache_dtype", "fp8"), KV_2GIB), "fp8kv-kv-2gib")),
                                             "memory-bound", run_s=(14, 12), build_s=20)],
    # ---- m14, tensor parallelism. One GPU: tensor_parallel_size=1 must be the milestone before it (gated with
    # graphs on and off, then interleaved against it).
    "m14-tp1": [
        Gate(("m14", Member("m14", (("enforce_eager", True),), "eager")), ("offline", "nanovllm")),
        Compare((Member("m13", (), "beside-m14"), "m14"), "nanovllm", run_s=(8, 8), build_s=20),
    ],
    # Two GPUs: TP=1 against TP=2 on Qwen3-0.6B's shape (batch 1 and the exact nanovllm); TP=2 gated with its
    # graphs (NCCL inside them) and without.
    "m14-tp2": [
        Gate((tensor_parallel("m14", 2, ("enforce_eager", True)),), ("offline", "nanovllm")),
        Compare((tensor_parallel("m14", 1), tensor_parallel("m14", 2)), "single", run_s=(2, 3), build_s=30),
        Compare((tensor_parallel("m14", 1), tensor_parallel("m14", 2)), "nanovllm", run_s=(8, 10), build_s=30),
    ],
    # The same on Qwen3-8B's shape (run with --model qwen3-8b-random): where a step reads 16 GB of weights.
    "m14-tp2-8b": [
        Compare((tensor_parallel("m14", 1, suffix="-8b"), tensor_parallel("m14", 2, suffix="-8b")), "single",
                run_s=(6, 5), build_s=60),
        Compare((tensor_parallel("m14", 1, suffix="-8b"), tensor_parallel("m14", 2, suffix="-8b")), "nanovllm",
                run_s=(40, 30), build_s=60),
    ],
}
