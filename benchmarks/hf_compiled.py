"""``hf-compiled``: ``hf-static`` with a static cache and the decoding step compiled by ``generate`` itself
(``CompileConfig(mode="reduce-overhead", fullgraph=True, dynamic=False)``), warmed up on every batch shape it will
meet: the transformers peer m10's CUDA graphs must beat. Why each choice: docs/benchmarks.md, "The engines".
"""

from __future__ import annotations

import time

import torch

from .baselines import HFStaticRunner
from .runners import register_runner
from .workloads import Phase, RequestSpec, Workload

WARMUP_NEW_TOKENS = 8  # a prefill and 7 decoding steps: compile, record the graphs, replay them
DEFAULT_COMPILE = {"compile_backend": "inductor", "compile_mode": "reduce-overhead"}


def torch_compilations() -> int:
    """Graphs torch.compile has built in this process so far (dynamo's own counter)."""
    return int(torch._dynamo.utils.counters["stats"]["unique_graphs"])


def cudagraph_skips() -> int:
    """Compiled graphs inductor chose not to replay as CUDA graphs so far (it also logs why). On a CPU every
    inductor graph counts; on the GPU, 0 is what ``mode="reduce-overhead"`` should give."""
    return int(torch._dynamo.utils.counters["inductor"]["cudagraph_skips"])


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
        self.max_cache_len = max(self._cache_len(batch) for phase in self.phases for batch in self.batches(phase))

    @staticmethod
    def _cache_len(batch: list[RequestSpec]) -> int:
        """Positions a batch fills: its padded prompt length plus its longest output."""
        return max(r.prompt_len for r in batch) + max(r.max_tokens for r in batch)

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
            before, skips_before = torch_compilations(), cudagraph_skips()
            calls = []
            for _ in range(2):
                began = time.perf_counter()
                self._generate(batch, max_new_tokens=WARMUP_NEW_TOKENS)
                calls.append(time.perf_counter() - began)
            shapes.append({"rows": rows, "prompt_len": max(r.prompt_len for r in batch),
                           "max_cache_len": self.max_cache_len, "new_tokens": min(WARMUP_NEW_TOKENS,
                                                                                  max(r.max_tokens for r in batch)),
                           "first_call_s": calls[0], "second_call_s": calls[1],
                           "torch_compilations": torch_compilations() - before,
                           "cudagraph_skips": cudagraph_skips() - skips_before})
        compiled = sum(s["torch_compilations"] for s in shapes)
        # transformers sets _compiled_call when it compiles the decoding forward (get_compiled_call): without it,
        # every step ran eagerly. (A count of compilations cannot tell: a graph cached earlier may be reused.)
        if not hasattr(self.model, "_compiled_call") and any(s["new_tokens"] > 1 for s in shapes):
            raise RuntimeError("generate did not compile its decoding step (transformers' auto-compile criteria "
                               "were not met): this run would measure an eager static cache, not hf-compiled")
        return {"what": f"the first batch of each distinct row count, twice, outputs capped at "
                        f"{WARMUP_NEW_TOKENS} tokens",
                "num_requests": 2 * sum(len(b) for b in first_of_each.values()), "shapes": shapes,
                "torch_compilations": compiled, "cudagraph_skips": sum(s["cudagraph_skips"] for s in shapes),
                "compile_s_estimate": sum(s["first_call_s"] - s["second_call_s"] for s in shapes)}

    def run_phase(self, phase: Phase, use_tqdm: bool):
        before = torch_compilations()
        result = super().run_phase(phase, use_tqdm)
        result.stats["torch_compilations"] = torch_compilations() - before  # 0: the warm-up covered every shape
        return result

    def close(self) -> None:
        super().close()
        torch._dynamo.reset()  # the compiled graphs and CUDA graph pools hold memory (and the weights) otherwise
