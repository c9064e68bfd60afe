"""The named sets of the GPU suite: what ``benchmarks/gpu_suite.sh --set NAME`` runs, named by what they measure
(which sets a past call ran is in its record, ``results/h200/calls/``). Entries: ``Run`` (one timed run),
``Compare`` (interleaved repeats: every ratio the docs quote) and ``Gate`` (gate checks only). Times are rough
H200 seconds (qwen3-0.6b-random, bf16): a run's ``est_s`` includes build and warm-up; a comparison's estimate is
each engine's ``build_s`` plus ``repeats`` x its ``run_s``. What does not fit the budget is skipped, not cut.
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
    overrides: tuple[tuple[str, object], ...] = ()  # engine config fields, e.g. (("max_num_seqs", 16),)
    tag: str | None = None  # appended to the result name so variants do not overwrite the documented run

    def gate_items(self) -> list[GateItem]:
        return [GateItem(self.milestone, self.workload, self.overrides, self.tag)]


# The ratios each workload's comparisons report (member / reference), unless a Compare names its own.
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
    ratio_metrics: tuple[str, ...] | None = None
    max_requests: int | None = None

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
        return self.ratio_metrics or RATIO_METRICS.get(self.workload, DEFAULT_RATIO_METRICS)

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
    "smoke": [  # every engine on a few requests: does it all run here? (~80 s)
        Run("m01", "single-sweep", 6, max_requests=2),
        Run("m02", "offline", 12, max_requests=4),
        Run("m03", "offline", 10, max_requests=8),
        Run("m04", "offline", 10, max_requests=8),
        Run("m04", "memory-bound", 10, max_requests=8),
        Run("hf-static", "offline", 15, max_requests=8),
        Run("hf-cb", "offline", 15, max_requests=8),
    ],
    # ---- single runs: figures that are not ratios (latency along a sweep, memory peaks)
    "m01-m02": [
        Run("m01", "single", 8),
        Run("m02", "single", 8),
        Run("m01", "single-sweep", 10),
        Run("m02", "single-sweep", 10),
        Run("m02", "prefix", 8),        # default slice: 8 requests
        Run("m01", "offline", 25),      # default slice: 8 requests
        Run("m02", "nanovllm", 70),     # default slice: 8 requests
        Run("m02", "offline", 80),      # default slice: 32 requests
    ],
    "m03-m04-small-workloads": [Run(m, w, est) for w, est in (("single", 8), ("prefix", 8), ("chunked", 15),
                                                              ("offline", 12)) for m in ("m03", "m04")],
    "m03-batch-sweep": [  # static batches of 8 ... 64 on the first 64 `offline` requests
        Run("m03", "offline", est, max_requests=64, overrides=(("max_num_seqs", size),), tag=f"bs{size}")
        for size, est in ((8, 35), (16, 20), (32, 14), (64, 10))
    ],
    "offline-single-runs": [
        Run("hf-static", "offline", 35),
        Run("m03", "offline", 12),
        Run("m04", "offline", 12),
        Run("hf-cb", "offline", 25),
        Run("m01", "single", 8),
        Run("m02", "single", 8),
        Run("m01", "single-sweep", 10),
        Run("m02", "single-sweep", 10),
        Run("m02", "offline", 35, max_requests=16),
    ],
    "nanovllm-first-64": [  # the baselines take ~4 min each on all 256
        Run(name, "nanovllm", est, max_requests=64)
        for name, est in (("hf-static", 110), ("hf-cb", 110), ("m03", 40), ("m04", 40))
    ],
    "long-sweep": [Run("m01", "long-sweep", 30), Run("m02", "long-sweep", 20)],
    "baselines": [
        Run("hf-static", "offline", 30),
        Run("hf-cb", "offline", 40),
        Run("hf-cb", "nanovllm", 150),
        Run("hf-static", "nanovllm", 190),
    ],
    "transformers-nanovllm": [  # hf-compiled compiles per batch shape: the first 64 requests are one batch
        Run("hf-compiled", "nanovllm", 150, max_requests=64),
        Run("hf-static", "nanovllm", 200),  # one static batch of 256, as long as its longest request
    ],
    # ---- interleaved comparisons, one milestone step each (two of them fill one ~560 s call)
    "gate-m01-m04": [
        Gate(("m01", "m02"), ("single", "offline")),
        Gate(("m03", "m04"), ("offline", "skewed", "nanovllm")),
    ],
    "m03-m04-offline-skewed": [
        Compare(("m03", "m04"), "offline", run_s=(7, 7)),
        Compare(("m03", "m04"), "skewed", run_s=(45, 26)),
    ],
    "m03-m04-nanovllm": [Compare(("m03", "m04"), "nanovllm", run_s=(52, 44))],
    "m03-m06-offline": [Compare(("m03", "m04", "m05", "m06"), "offline", run_s=(13, 13, 13, 13))],
    "m04-m05-memory-bound": [Compare(("m04", "m05"), "memory-bound", run_s=(22, 12))],
    "m04-m06-nanovllm": [Compare(("m04", "m05", "m06"), "nanovllm", run_s=(45, 38, 38))],
    "m05-m06-prefix": [
        Compare(("m05", "m06"), "prefix", run_s=(3, 2)),
        Compare(("m05", "m06"), "prefix-large", run_s=(9, 3)),
    ],
    "m06-m08-offline": [Compare(("m06", "m07", "m08"), "offline", run_s=(10, 10, 9))],
    "m06-m08-nanovllm": [Compare(("m06", "m07", "m08"), "nanovllm", run_s=(32, 30, 20))],
    "m06-m07-chunked": [  # m07 at its default budget (8,192 tokens a step) against m06's whole prefills
        Compare(("m06", "m07"), "chunked", run_s=10),
        Compare(("m06", "m07"), "chunked-long", run_s=15),
    ],
    "m07-budgets": [
        Compare(budgets("m07", (None, 2048, 512, 256)), "chunked", run_s=3),
        Compare(budgets("m07", (None, 2048, 512, 256)), "chunked-long", run_s=(6, 7, 8, 10)),
    ],
    "m07-m10-nanovllm": [Compare(("m07", "m08", "m10"), "nanovllm", run_s=(40, 30, 11), build_s=8)],
    # m10 captures its CUDA graphs when built (build_s); the gate checks it with graphs and without.
    "m09-m10": [
        Gate((Member("m10", (("enforce_eager", True),), "eager"),), ("offline", "nanovllm")),
        Compare(("m09", "m10"), "offline", run_s=(12, 5), build_s=20),
        Compare(("m09", "m10"), "nanovllm", run_s=(22, 8), build_s=20),
        Compare(("m09", "m10"), "memory-bound", run_s=(25, 12), build_s=20),
    ],
    # m10 against the strongest transformers peer, hf-compiled (static cache, compiled decoding steps: it
    # compiles while it warms up, one batch shape on offline), with m09 in the same rounds.
    "m10-peers": [
        Gate(("m10", Member("m10", (("enforce_eager", True),), "eager")), ("offline",)),
        Compare(("m09", "hf-compiled", "m10"), "offline", run_s=(13, 9, 5), build_s=(5, 130, 10)),
        Run("hf-static", "offline", 35),
        Run("hf-cb", "offline", 25),
    ],
    # The host hidden behind the GPU (m12) against m10 and m11 (whose offline generate is m10's, in-process),
    # and transformers' compiled generate beside them on `offline`.
    "m10-m12-nanovllm": [Compare(("m10", "m11", "m12"), "nanovllm", run_s=(11, 11, 8), build_s=12)],
    "m10-m12-nanovllm-pair": [Compare(("m10", "m12"), "nanovllm", run_s=(10, 7), build_s=(12, 18))],
    "m10-m12-offline-peers": [Compare(("hf-compiled", "m10", "m12"), "offline", run_s=(8, 3, 2), build_s=(110, 12, 18))],
    "m12-mixed-step-graphs": [Compare(("hf-compiled", "m10", PIECEWISE, "m12"), "offline", run_s=(8, 3, 2, 2),
                                      build_s=(110, 12, 18, 18))],  # mixed steps whole against in pieces
    "m10-m12-memory-bound": [Compare(("m10", "m12"), "memory-bound", run_s=(5, 4), build_s=12)],
    # ---- m13: FP8 K/V against the bf16 K/V cache, on Qwen3-0.6B's shape; the gate checks m13 unquantized
    # (gpu_suite.LOSSY_KNOBS). The 8B decode step is quant_step.py's, the logit errors quant_accuracy.py's.
    "m13-fp8-kv-nanovllm": [Compare(("m13", FP8_KV), "nanovllm", run_s=(15, 13), build_s=20)],
    "m13-fp8-kv": [
        Compare(("m13", FP8_KV), "nanovllm", run_s=(15, 13), build_s=20),
        Compare(("m13", FP8_KV), "memory-bound", run_s=(12, 10), build_s=20),
    ],
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
