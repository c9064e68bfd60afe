"""Every benchmark workload: seeded random token-id prompts, greedy decoding, EOS ignored (so the work done does
not depend on what a random model emits). ``get_workload(name)`` builds one; the same name and seed always give
the same token ids. The table of workloads, their clients and slices: docs/benchmarks.md, "The workloads".
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field, replace
from functools import partial

# Ids 0..151642 are Qwen's BPE tokens; 151643 and above are added/special tokens (see tokenizer.py).
PROMPT_VOCAB = 151_643
DEFAULT_SEED = 0
MAX_IN_FLIGHT = 64  # engines with a max_num_seqs knob get this on the multi-request workloads
CLIENTS = ("generate", "inject", "abort")  # how a workload's requests reach the engine (see Workload.client)


@dataclass(frozen=True)
class RequestSpec:
    """One request: prompt ids, ``max_tokens``, a group label, and ``stop_after``: where the client stops it
    (``abort``), its real length that the engine cannot foresee. It is credited ``output_len`` tokens."""

    prompt_token_ids: tuple[int, ...]
    max_tokens: int
    group: str = "all"
    stop_after: int | None = None

    def __post_init__(self) -> None:
        if self.stop_after is not None and not 1 <= self.stop_after <= self.max_tokens:
            raise ValueError(f"stop_after must be in [1, max_tokens={self.max_tokens}], got {self.stop_after}")

    @property
    def prompt_len(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def output_len(self) -> int:
        return self.max_tokens if self.stop_after is None else self.stop_after


@dataclass(frozen=True)
class Phase:
    """One ``generate`` call: all its requests are submitted together."""

    label: str
    requests: tuple[RequestSpec, ...]


@dataclass(frozen=True)
class Slice:
    """A workload cut down to its first ``num_requests`` requests, and why."""

    num_requests: int
    reason: str


@dataclass(frozen=True)
class Workload:
    """A named, seeded list of phases and how to drive them: ``max_num_seqs`` (the in-flight cap, None: the
    engine's default), ``client`` (``CLIENTS``: ``generate``, ``inject`` or ``abort``) and ``kv_budget_gib`` (the
    K/V memory every engine gets; None: enough for the whole workload)."""

    name: str
    description: str
    params: dict
    phases: tuple[Phase, ...]
    max_num_seqs: int | None = None  # None: leave the engine's own default
    slice: Slice | None = None
    num_requests_total: int = field(default=0)
    client: str = "generate"
    kv_budget_gib: float | None = None

    def __post_init__(self) -> None:
        if self.client not in CLIENTS:
            raise ValueError(f"unknown client {self.client!r}: choose from {', '.join(CLIENTS)}")
        if not self.num_requests_total:
            object.__setattr__(self, "num_requests_total", self.num_requests)

    @property
    def requests(self) -> list[RequestSpec]:
        return [r for phase in self.phases for r in phase.requests]

    @property
    def num_requests(self) -> int:
        return sum(len(phase.requests) for phase in self.phases)

    @property
    def output_tokens(self) -> int:
        """Output tokens the requests are credited with (``stop_after`` where the client stops them)."""
        return sum(r.output_len for r in self.requests)

    @property
    def prompt_tokens(self) -> int:
        return sum(r.prompt_len for r in self.requests)

    @property
    def max_seq_len(self) -> int:
        """The longest prompt + ``max_tokens``: the model (and ``max_model_len``) must allow this many positions."""
        return max(r.prompt_len + r.max_tokens for r in self.requests)

    @property
    def needs_step_api(self) -> bool:
        return self.client == "abort"

    def sliced(self, num_requests: int, reason: str) -> Workload:
        """The first ``num_requests`` requests (whole phases kept in order, the last one cut)."""
        if num_requests < 1:
            raise ValueError(f"a slice needs at least one request, got {num_requests}")
        if num_requests >= self.num_requests:
            return self
        phases, left = [], num_requests
        for phase in self.phases:
            if left <= 0:
                break
            phases.append(Phase(phase.label, phase.requests[:left]))
            left -= len(phase.requests)
        return replace(self, phases=tuple(phases), slice=Slice(num_requests, reason),
                       num_requests_total=self.num_requests_total)

    def describe(self) -> dict:
        """What a result JSON records about the workload."""
        facts = ("max_num_seqs", "num_requests", "num_requests_total", "prompt_tokens", "output_tokens", "max_seq_len",
                 "client", "kv_budget_gib")
        return {"name": self.name, "description": self.description, "params": dict(self.params),
                **{key: getattr(self, key) for key in facts},
                "phases": [{"label": p.label, "num_requests": len(p.requests)} for p in self.phases],
                "slice": None if self.slice is None else {"num_requests_run": self.slice.num_requests,
                                                          "num_requests_total": self.num_requests_total,
                                                          "reason": self.slice.reason}}


def _rng(name: str, seed: int) -> random.Random:
    # Seeding with a string is deterministic across runs and platforms (it is hashed with SHA-512).
    return random.Random(f"nanoserve-bench:{name}:{seed}")


def _tokens(rng: random.Random, n: int) -> tuple[int, ...]:
    return tuple(rng.randrange(PROMPT_VOCAB) for _ in range(n))


# Each builder takes the seed first, so that ``_BUILDERS`` can hold it with every other argument bound.
def _single(seed: int) -> Workload:
    params = {"prompt_len": 512, "output_len": 128, "seed": seed}
    request = RequestSpec(_tokens(_rng("single", seed), 512), 128)
    return Workload("single", "one request: 512-token prompt, 128 output tokens (latency of one stream)",
                    params, (Phase("single", (request,)),), max_num_seqs=None)


SWEEP_PROMPT_LENS = (64, 128, 256, 512, 1024, 2048)
SWEEP_OUTPUT_LEN = 32
LONG_SWEEP_PROMPT_LENS = (4096, 8192, 16384, 32768)
LONG_SWEEP_OUTPUT_LEN = 16


def _sweep(seed: int, name: str, description: str, prompt_lens: tuple[int, ...], output_len: int) -> Workload:
    """One request per prompt length, each its own phase (its own ``generate`` call)."""
    rng = _rng(name, seed)
    params = {"prompt_lens": list(prompt_lens), "output_len": output_len, "seed": seed}
    phases = tuple(Phase(f"prompt_len={n}", (RequestSpec(_tokens(rng, n), output_len, group=f"prompt_len={n}"),))
                   for n in prompt_lens)
    return Workload(name, description, params, phases, max_num_seqs=None)


def _uniform_batch(seed: int, name: str, description: str, num: int, prompt: tuple[int, int],
                   output: tuple[int, int]) -> Workload:
    rng = _rng(name, seed)
    requests = []
    for _ in range(num):
        prompt_len, output_len = rng.randint(*prompt), rng.randint(*output)  # in this order: the seed's sequence
        requests.append(RequestSpec(_tokens(rng, prompt_len), output_len))
    params = {"num_requests": num, "prompt_len_range": list(prompt), "output_len_range": list(output),
              "max_in_flight": MAX_IN_FLIGHT, "seed": seed}
    return Workload(name, description, params, (Phase(name, tuple(requests)),), max_num_seqs=MAX_IN_FLIGHT)


NANOVLLM = {"num_requests": 256, "prompt_len_range": [100, 1024], "token_id_range": [0, 10000],
            "output_len_range": [100, 1024], "max_in_flight": 256}


def _nanovllm(seed: int) -> Workload:
    """Exactly nano-vllm's ``bench.py``: ``random.seed(0)``, all 256 prompts first, then the output lengths."""
    rng = random.Random(seed)  # a private generator with the same sequence as random.seed(seed)
    prompts = [tuple(rng.randint(0, 10000) for _ in range(rng.randint(100, 1024)))
               for _ in range(NANOVLLM["num_requests"])]
    requests = tuple(RequestSpec(prompt, rng.randint(100, 1024)) for prompt in prompts)
    params = {**NANOVLLM, "seed": seed, "sampling": "greedy (nano-vllm's bench.py samples at temperature 0.6)"}
    return Workload("nanovllm", "nano-vllm's bench.py exactly: random.seed(0), 256 requests, prompt 100..1024 ids "
                    "in [0, 10000], output 100..1024 (133,966 tokens), all 256 in flight; greedy decoding here "
                    "where nano-vllm samples at temperature 0.6", params, (Phase("nanovllm", requests),),
                    max_num_seqs=NANOVLLM["max_in_flight"])


SKEWED_LONG_EVERY = 8  # request i is long when i % 8 == 0


def _skewed(seed: int) -> Workload:
    """Mostly short answers, a few long ones: where a static batch idles most (m04's case)."""
    rng = _rng("skewed", seed)
    requests = []
    for i in range(128):
        prompt_len = rng.randint(32, 512)
        output_len = rng.randint(512, 1024) if i % SKEWED_LONG_EVERY == 0 else rng.randint(16, 64)
        requests.append(RequestSpec(_tokens(rng, prompt_len), output_len))
    params = {"num_requests": 128, "prompt_len_range": [32, 512], "long_every": SKEWED_LONG_EVERY,
              "long_output_len_range": [512, 1024], "short_output_len_range": [16, 64],
              "max_in_flight": MAX_IN_FLIGHT, "seed": seed}
    return Workload("skewed", "128 requests, prompt 32..512; one in 8 wants 512..1024 tokens, the rest 16..64; "
                    "at most 64 in flight", params, (Phase("skewed", tuple(requests)),), max_num_seqs=MAX_IN_FLIGHT)


# 96 requests and a 4 GiB budget: m04 holds ~24 of them (prompt + 1,024 reserved each), so three rounds fit one GPU
# call and the budget binds for both engines. Real lengths are clipped at 512: a few requests near 1,024 would
# decode nearly alone for half of every run, a tail no memory scheme shortens, hiding the phase measured here.
MEMORY_BOUND = {"num_requests": 96, "prompt_len_range": [100, 1024], "max_tokens": 1024,
                "output_len_median": 150, "output_len_sigma": 0.8, "output_len_clip": [8, 512],
                "max_in_flight": 256, "kv_budget_gib": 4.0}


def _memory_bound(seed: int) -> Workload:
    """Over-reservation as real traffic has it: every request may run to 1024 tokens, few do; the client
    aborts each at its real length (lognormal), and the K/V budget binds."""
    c = MEMORY_BOUND
    rng = _rng("memory-bound", seed)
    low, high = c["output_len_clip"]
    requests = []
    for _ in range(c["num_requests"]):
        prompt_len = rng.randint(*c["prompt_len_range"])
        real = round(rng.lognormvariate(math.log(c["output_len_median"]), c["output_len_sigma"]))
        requests.append(RequestSpec(_tokens(rng, prompt_len), c["max_tokens"], stop_after=min(high, max(low, real))))
    return Workload("memory-bound", "96 requests, prompt 100..1024, max_tokens 1024 each but the client aborts "
                    "each at its real length (lognormal, median ~150, sigma 0.8, clipped to 8..512); K/V budget "
                    "4 GiB; up to 256 in flight; needs a step API", {**c, "seed": seed},
                    (Phase("memory-bound", tuple(requests)),), max_num_seqs=c["max_in_flight"], client="abort",
                    kv_budget_gib=c["kv_budget_gib"])


def _shared_prefix(seed: int, name: str, num: int, prefix_len: int, suffix_len: int, output_len: int) -> Workload:
    rng = _rng(name, seed)
    system = _tokens(rng, prefix_len)
    requests = tuple(RequestSpec(system + _tokens(rng, suffix_len), output_len) for _ in range(num))
    params = {"num_requests": num, "shared_prefix_len": prefix_len, "suffix_len": suffix_len,
              "output_len": output_len, "max_in_flight": MAX_IN_FLIGHT, "seed": seed}
    return Workload(name, f"{num} requests sharing one {prefix_len}-token system prompt, each with its own "
                    f"{suffix_len}-token suffix, {output_len} output tokens", params, (Phase(name, requests),),
                    max_num_seqs=MAX_IN_FLIGHT)


CHUNKED = {"num_decoders": 16, "decoder_prompt_len": 128, "decoder_output_len": 128,
           "num_long": 6, "long_prompt_len": 2048, "long_output_len": 16,
           # For engines with a step API: long prompt k arrives after
           # inject_every_decode_steps * (k + 1) decode steps of the decoders.
           "inject_every_decode_steps": 16}
CHUNKED_LONG = {**CHUNKED, "num_long": 4, "long_prompt_len_range": [16384, 32768]}
del CHUNKED_LONG["long_prompt_len"]


def _chunked(seed: int, name: str, params: dict, description: str) -> Workload:
    """Decoders first (``group: decoder``), then the long prompts (``group: long_prompt``), one phase; with a
    ``long_prompt_len_range`` (``chunked-long``), the long prompts' lengths are drawn first."""
    rng = _rng(name, seed)
    params = {**params, "seed": seed}
    if "long_prompt_len_range" in params:
        params["long_prompt_lens"] = [rng.randint(*params["long_prompt_len_range"]) for _ in range(params["num_long"])]
    decoders = [RequestSpec(_tokens(rng, params["decoder_prompt_len"]), params["decoder_output_len"], group="decoder")
                for _ in range(params["num_decoders"])]
    longs = [RequestSpec(_tokens(rng, n), params["long_output_len"], group="long_prompt")
             for n in params.get("long_prompt_lens") or [params["long_prompt_len"]] * params["num_long"]]
    params.update(max_in_flight=MAX_IN_FLIGHT,
                  offline_definition=f"all {len(decoders) + len(longs)} requests submitted at once (decoders first); "
                                     f"the metric is the inter-token latency of the {len(decoders)} decoders")
    return Workload(name, description, params, (Phase(name, tuple(decoders + longs)),), max_num_seqs=MAX_IN_FLIGHT,
                    client="inject")


_BUILDERS = {
    "single": _single,
    "single-sweep": partial(_sweep, name="single-sweep", prompt_lens=SWEEP_PROMPT_LENS, output_len=SWEEP_OUTPUT_LEN,
                            description="one request per prompt length (each its own generate call), "
                            f"{SWEEP_OUTPUT_LEN} output tokens: per-token latency vs sequence length"),
    "long-sweep": partial(_sweep, name="long-sweep", prompt_lens=LONG_SWEEP_PROMPT_LENS,
                          output_len=LONG_SWEEP_OUTPUT_LEN, description="single-sweep continued to long prompts "
                          "(needs a model with >= 33k positions, e.g. qwen3-0.6b-random): where recomputation "
                          "finally outweighs per-step overhead"),
    "offline": partial(_uniform_batch, name="offline", num=128, prompt=(32, 512), output=(16, 256),
                       description="128 requests, prompt 32..512, output 16..256 (uniform), at most 64 in flight"),
    "nanovllm": _nanovllm, "skewed": _skewed, "memory-bound": _memory_bound,
    "prefix": partial(_shared_prefix, name="prefix", num=32, prefix_len=1024, suffix_len=32, output_len=32),
    # prefix-large is sized so that prefill is most of the work: what a prefix cache saves end to end
    "prefix-large": partial(_shared_prefix, name="prefix-large", num=256, prefix_len=4096, suffix_len=64,
                            output_len=16),
    "chunked": partial(_chunked, name="chunked", params=CHUNKED,
                       description="16 short requests decoding while six 2048-token prompts arrive; metric: the "
                       "decoders' inter-token latency (offline engines: all 22 submitted at once, decoders first)"),
    # chunked with prompts long enough that one unchunked prefill costs many decode steps on an H200
    "chunked-long": partial(_chunked, name="chunked-long", params=CHUNKED_LONG,
                            description="16 short requests decoding while four prompts of 16k..32k tokens arrive; "
                            "metric: the decoders' inter-token latency; needs a model with up to 32,784 positions "
                            "(qwen3-0.6b-random, not tiny)"),
}
WORKLOADS: tuple[str, ...] = tuple(_BUILDERS)

# Milestones that run requests one at a time are too slow for the big workloads: they run the first N
# requests. Keys are milestone short names ("m01") or baselines; absent means "the whole workload".
# Rough H200 times for the full workloads are in the reasons.
_M01, _M02 = "m01 recomputes the whole sequence every step and serves one request at a time", \
    "m02 serves one request at a time"
DEFAULT_SLICES: dict[str, dict[str, Slice]] = {
    "m01": {
        "offline": Slice(8, f"{_M01}; the full 128 requests (~17k output tokens) would take minutes"),
        "nanovllm": Slice(2, f"{_M01}; the full 256 requests (133,966 output tokens) would take hours"),
        "prefix": Slice(4, "m01 serves one request at a time and recomputes the 1056-token sequence every step"),
        "prefix-large": Slice(8, "m01 serves one request at a time and recomputes the 4160-token sequence every "
                                 "step; the full 256 requests would take minutes"),
    },
    "m02": {
        "offline": Slice(32, f"{_M02}; the full 128 requests (~17k output tokens) would take minutes"),
        "nanovllm": Slice(8, f"{_M02}; the full 256 requests (133,966 output tokens) would take about half an hour"),
        "prefix": Slice(8, _M02),
        "prefix-large": Slice(32, f"{_M02}; the full 256 requests would take minutes"),
    },
}


def milestone_key(milestone: str) -> str:
    """``m02_kv_cache`` / ``m02`` -> ``m02``; baselines unchanged."""
    return milestone.split("_", 1)[0] if milestone[:1] == "m" and milestone[1:3].isdigit() else milestone


def get_workload(name: str, seed: int = DEFAULT_SEED) -> Workload:
    """Build the named workload (deterministic for a given seed)."""
    if name not in _BUILDERS:
        raise ValueError(f"unknown workload {name!r}: choose from {', '.join(WORKLOADS)}")
    return _BUILDERS[name](seed)


def workload_for(milestone: str, name: str, seed: int = DEFAULT_SEED, max_requests: int | None = None,
                 full: bool = False) -> Workload:
    """The workload a milestone actually runs: ``max_requests`` if given, else the default slice unless ``full``."""
    workload = get_workload(name, seed)
    if max_requests is not None:
        return workload.sliced(max_requests, f"--max-requests {max_requests} (asked for on the command line)")
    if not full and (cut := DEFAULT_SLICES.get(milestone_key(milestone), {}).get(name)) is not None:
        return workload.sliced(cut.num_requests, cut.reason)
    return workload
