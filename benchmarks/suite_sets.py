"""The named sets of the GPU suite: what one call of ``benchmarks/gpu_suite.sh --set NAME`` runs.

Three kinds of entry:

* ``Run(engine, workload, est_s)``: one timed run, as ``python -m benchmarks.run`` does it. Good for figures
  that are not ratios (per-token latency along a sweep, memory peaks).
* ``Compare(engines, workload, repeats=3)``: interleaved repeats (``compare.py``): build every engine once,
  warm each up, then A, B, A, B, A, B. Every ratio the docs quote comes from one of these.
* ``Gate(engines, workloads)``: the float32 correctness gate only (``gate.py``). Every engine a call measures
  is gated on its workloads anyway, first thing in the call; a ``Gate`` adds checks without measuring.

Times are rough H200 seconds (qwen3-0.6b-random, bf16): ``est_s`` of a run includes its build and warm-up; a
comparison's estimate is each engine's ``build_s`` plus ``repeats`` x its ``run_s``. Before each entry the
suite checks that the estimate fits in what is left of the budget; what does not fit is skipped, not cut.
Measured figures behind the estimates: ``benchmarks/results/h200/`` (``total_time_s`` and ``metrics.wall_time_s``).
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
        return tuple(e if isinstance(e, Member) else Member(e) for e in self.engines)

    def _per_engine(self, value: float | tuple[float, ...]) -> tuple[float, ...]:
        return value if isinstance(value, tuple) else (value,) * len(self.engines)

    def run_estimates(self) -> tuple[float, ...]:
        return self._per_engine(self.run_s)

    def est_s(self, members: tuple[Member, ...] | None = None) -> float:
        """Rough seconds for ``members`` (default: all), by their estimates."""
        chosen = self.members if members is None else members
        runs = dict(zip(self.members, self.run_estimates()))
        builds = dict(zip(self.members, self._per_engine(self.build_s)))
        return sum(builds[m] + self.repeats * runs[m] for m in chosen)

    def metrics(self) -> tuple[str, ...]:
        return self.ratio_metrics or RATIO_METRICS.get(self.workload, DEFAULT_RATIO_METRICS)

    def gate_items(self) -> list[GateItem]:
        return [GateItem(m.engine, self.workload, m.overrides, m.tag) for m in self.members]


@dataclass(frozen=True)
class Gate:
    engines: tuple[str | Member, ...]
    workloads: tuple[str, ...]

    def gate_items(self) -> list[GateItem]:
        members = [e if isinstance(e, Member) else Member(e) for e in self.engines]
        return [GateItem(m.engine, w, m.overrides, m.tag) for m in members for w in self.workloads]


Entry = Run | Compare | Gate


FP8_KV = Member("m13", (("kv_cache_dtype", "fp8"),), "fp8kv")  # m13 with its K/V cache in float8 e4m3


def budgets(milestone: str, values: tuple[int | None, ...]) -> tuple[Member, ...]:
    """The same milestone at several ``max_num_batched_tokens`` (None: unlimited), one member each."""
    return tuple(Member(milestone, (("max_num_batched_tokens", v),), f"mnbt-{'none' if v is None else v}")
                 for v in values)


SETS: dict[str, list[Entry]] = {
    "smoke": [  # every engine on a few requests: does it all run here? (~80 s)
        Run("m01", "single-sweep", 6, max_requests=2),
        Run("m02", "offline", 12, max_requests=4),
        Run("m03", "offline", 10, max_requests=8),
        Run("m04", "offline", 10, max_requests=8),
        Run("m04", "memory-bound", 10, max_requests=8),
        Run("hf-static", "offline", 15, max_requests=8),
        Run("hf-cb", "offline", 15, max_requests=8),
    ],
    "m01-m02": [  # measured: ~170 s
        Run("m01", "single", 8),
        Run("m02", "single", 8),
        Run("m01", "single-sweep", 10),
        Run("m02", "single-sweep", 10),
        Run("m02", "prefix", 8),        # default slice: 8 requests
        Run("m01", "offline", 25),      # default slice: 8 requests
        Run("m02", "nanovllm", 70),     # default slice: 8 requests
        Run("m02", "offline", 80),      # default slice: 32 requests
    ],
    "m03-m04": [  # single runs of both on the small workloads (~90 s); ratios: the comparison sets below
        Run("m03", "single", 8),
        Run("m04", "single", 8),
        Run("m03", "prefix", 8),
        Run("m04", "prefix", 8),
        Run("m03", "chunked", 15),
        Run("m04", "chunked", 15),
        Run("m03", "offline", 12),
        Run("m04", "offline", 12),
    ],
    # The batch-size sweep of m03 (static batches of 8 ... 64) on the first 64 `offline` requests.
    "m03-batch-sweep": [
        Run("m03", "offline", est, max_requests=64, overrides=(("max_num_seqs", size),), tag=f"bs{size}")
        for size, est in ((8, 35), (16, 20), (32, 14), (64, 10))
    ],
    "h200-offline": [
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
    # The first 64 nanovllm requests for the baselines (which take ~4 min each on all 256) and our engines.
    "h200-nanovllm-slice": [
        Run(name, "nanovllm", est, max_requests=64)
        for name, est in (("hf-static", 110), ("hf-cb", 110), ("m03", 40), ("m04", 40))
    ],
    "long-sweep": [Run("m01", "long-sweep", 30), Run("m02", "long-sweep", 20)],
    "skewed": [Run("m03", "skewed", 50), Run("m04", "skewed", 30)],  # single runs; ratios: m03-m04-offline-skewed
    "baselines": [  # estimated: ~410 s
        Run("hf-static", "offline", 30),
        Run("hf-cb", "offline", 40),
        Run("hf-cb", "nanovllm", 150),
        Run("hf-static", "nanovllm", 190),
    ],
    # ---- issue 7: the float32 gate for m01-m04, and m03 against m04 with interleaved repeats. From the
    # committed single runs: offline ~7 s a run each, skewed 46 s (m03) and 26 s (m04); the exact nanovllm
    # (all 256 in flight) ~50 s each. All of it is ~670 s, more than one ~560 s call holds: two calls,
    #   call 1: --set gate-m01-m04 --set m03-m04-offline-skewed   (gate ~70 s + 52 + 232 = ~355 s)
    #   call 2: --set m03-m04-nanovllm                           (gate ~22 s + 310 = ~330 s)
    "gate-m01-m04": [
        Gate(("m01", "m02"), ("single", "offline")),
        Gate(("m03", "m04"), ("offline", "skewed", "nanovllm")),
    ],
    "m03-m04-offline-skewed": [
        Compare(("m03", "m04"), "offline", run_s=(7, 7)),
        Compare(("m03", "m04"), "skewed", run_s=(47, 27)),
    ],
    "m03-m04-nanovllm": [Compare(("m03", "m04"), "nanovllm", run_s=(50, 50))],
    # ---- issues 8 and 9 (m05-m08): estimates until measured. m06 on cannot empty its prefix cache between
    # runs, so it is built again before each one: ~5 s more per run than the run itself.
    "m04-m05-memory-bound": [Compare(("m04", "m05"), "memory-bound", run_s=(40, 25))],
    "m05-m06-prefix": [
        Compare(("m05", "m06"), "prefix", run_s=(3, 7)),
        Compare(("m05", "m06"), "prefix-large", run_s=(15, 11)),
    ],
    "m06-m08-offline": [Compare(("m06", "m07", "m08"), "offline", run_s=(12, 12, 11))],
    "m06-m08-nanovllm": [Compare(("m06", "m07", "m08"), "nanovllm", run_s=(55, 55, 40))],
    "m06-m07-chunked": [  # m07 at its default budget (8,192 tokens a step) against m06's whole prefills
        Compare(("m06", "m07"), "chunked", run_s=10),
        Compare(("m06", "m07"), "chunked-long", run_s=15),
    ],
    # ---- issue 11 (m10): guesses until measured; m10 captures its CUDA graphs when built (build_s). The gate
    # checks m10 with graphs and, here, without (enforce_eager) too.
    "m09-m10": [
        Gate((Member("m10", (("enforce_eager", True),), "eager"),), ("offline", "nanovllm")),
        Compare(("m09", "m10"), "offline", run_s=(12, 5), build_s=20),
        Compare(("m09", "m10"), "nanovllm", run_s=(40, 15), build_s=20),
        Compare(("m09", "m10"), "memory-bound", run_s=(25, 12), build_s=20),
    ],
    # ---- issue 11: m10 against the strongest transformers peer, hf-compiled (static cache, compiled decoding
    # steps), in one call. hf-compiled compiles while it warms up (one batch shape on offline: 64 rows): a guess
    # of one to two minutes on the H200 until measured, so build_s 130; its runs ~7 s each at the ~2,700 output
    # tokens/s the issue reports (17,651 tokens). The eager peers run once each (committed: 29 s and 19 s).
    # Gate: m10 with and without CUDA graphs (the baselines are the reference, or equal hf-static on the CPU).
    "m10-peers": [
        Gate(("m10", Member("m10", (("enforce_eager", True),), "eager")), ("offline",)),
        Compare(("hf-compiled", "m10"), "offline", run_s=(8, 5), build_s=(130, 20)),
        Run("hf-static", "offline", 35),
        Run("hf-cb", "offline", 25),
    ],
    "m07-budgets": [
        Compare(budgets("m07", (None, 2048, 512, 256)), "chunked", run_s=10),
        Compare(budgets("m07", (None, 2048, 512, 256)), "chunked-long", run_s=15),
    ],
    # ---- the three calls of the m05-m10 session, each sized for one ~560 s call on a slow host (eager step
    # ~25 ms). Every engine is gated first. m03-m06 on offline in one interleaved comparison gives issue 7's
    # m04/m03 and issue 8's m05/m04 and m06/m04 from the same call.
    "call-a": [
        Compare(("m03", "m04", "m05", "m06"), "offline", run_s=(13, 13, 13, 13)),
        Compare(("m04", "m05"), "memory-bound", run_s=(20, 10)),
        Compare(("m05", "m06"), "prefix", run_s=(3, 2)),
        Compare(("m05", "m06"), "prefix-large", run_s=(9, 3)),
    ],
    "call-b": [  # most important first: what does not fit the budget is skipped
        Compare(("m07", "m08", "m10"), "nanovllm", run_s=(40, 30, 11), build_s=8),
        Compare(budgets("m07", (None, 2048, 512, 256)), "chunked-long", run_s=(6, 7, 8, 10)),
        Compare(budgets("m07", (None, 512)), "chunked", run_s=(4, 5)),
    ],
    "call-c": [
        Compare(("m09", "hf-compiled", "m10"), "offline", run_s=(13, 9, 5), build_s=(5, 130, 10)),
        Compare(("m04", "m05"), "memory-bound", run_s=(22, 12)),
        Run("hf-static", "offline", 40),
        Run("hf-cb", "offline", 30),
    ],
    # ---- two-GPU calls (nvidia-h200-x2): one suite process per GPU, side by side on one host, each with its
    # own gate and its own interleaved comparisons (a ratio never mixes the two GPUs). See docs/benchmarks.md.
    # Issue 7's call: the gate for m01-m04 and m03 against m04 on offline, skewed and the exact nanovllm; with
    # issue 8's m05 and m06 against m04 on nanovllm and the transformers baselines beside them.
    "pair-a-gpu0": [
        Gate(("m01", "m02"), ("single", "offline")),
        Compare(("m04", "m05", "m06"), "nanovllm", run_s=(45, 38, 38)),
        Compare(("m03", "m04"), "offline", run_s=(7, 7)),
        Run("hf-static", "offline", 25),
        Run("hf-cb", "offline", 20),
    ],
    "pair-a-gpu1": [
        Compare(("m03", "m04"), "skewed", run_s=(45, 26)),
        Compare(("m03", "m04"), "nanovllm", run_s=(52, 44)),
    ],
    # Issue 9 (GPU 0, after the kernel tests on CUDA and the kernel microbenchmark) and issue 11 (GPU 1).
    "pair-b-gpu0": [
        Compare(("m06", "m07", "m08"), "nanovllm", run_s=(32, 30, 20)),
        Compare(budgets("m07", (None, 2048, 512, 256)), "chunked", run_s=3),
    ],
    "pair-b-gpu1": [
        Gate((Member("m10", (("enforce_eager", True),), "eager"),), ("offline", "nanovllm")),
        Compare(("m09", "m10"), "nanovllm", run_s=(22, 8), build_s=20),
        Compare(("m09", "m10"), "memory-bound", run_s=(25, 12), build_s=20),
        Compare(("m06", "m07", "m08"), "offline", run_s=(10, 10, 9)),
        Run("hf-static", "offline", 25),
        Run("hf-static", "nanovllm", 55, max_requests=64),
        Run("hf-cb", "nanovllm", 70, max_requests=64),
    ],
    # The transformers peers on the exact nanovllm (issue 11): hf-static on all 256 requests (~190 s: one static
    # batch of 256, the workload's max_num_seqs, as long as its longest request); hf-compiled, which compiles
    # per batch shape, on the first 64 (one batch).
    "pair-c-gpu0": [Run("hf-compiled", "nanovllm", 150, max_requests=64)],
    "pair-c-gpu1": [Run("hf-static", "nanovllm", 200)],
    # ---- issue 20 (m13): FP8 K/V against the bf16 K/V cache, both m13, on Qwen3-0.6B's shape (guesses until
    # measured: m10's times). The gate checks m13 unquantized (gpu_suite.LOSSY_KNOBS). The batch-1 step on
    # qwen3-8b-random is benchmarks/quant_step.py's, the logit errors benchmarks/quant_accuracy.py's.
    "m13-fp8-kv": [
        Compare(("m13", FP8_KV), "nanovllm", run_s=(15, 13), build_s=20),
        Compare(("m13", FP8_KV), "memory-bound", run_s=(12, 10), build_s=20),
    ],
}
