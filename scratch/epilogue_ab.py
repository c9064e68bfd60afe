"""One GPU call: m13's decode graphs with the GEMV epilogues (gemv_epilogues.py) against m12's fused layers.

The batch-1 step of qwen3-8b-random runs 400 kernels; three per layer (add + norm after o_proj and down_proj,
SiLU * up after gate_up) now run in the GEMV's finishing programs. Modes (quant_step, batch 1 and 2, 5
interleaved rounds, 512 keys):
    bf16          m13's bf16 engine (m12's fused layers: unchanged)
    int4, int8    m13 at this commit: the epilogues in the decode graphs
    int4-plain, int8-plain   the same engines with m12's fused layers in their graphs (no epilogues)
Before timing, each int4/int8 pair generates greedily at batch 1 and 2 through its captured graphs (tokens
compared: the norm's sum of squares is added in another order, so a tie may break the other way). Then each
int4 engine's captured step is replayed under torch.profiler: GPU time per kernel name.

    python3 scratch/epilogue_ab.py OUT_DIR
"""

from __future__ import annotations

import collections
import json
import sys

import torch
from torch.profiler import ProfilerActivity, profile

import benchmarks.quant_step as quant_step
from benchmarks.env import environment
from milestones.common.demo import cuda_median_ms
from milestones.m12_async_scheduling.fused_layers import FusedCausalLM
from milestones.m13_quantization import SamplingParams
from milestones.m13_quantization import engine as m13_engine

MODES = ("bf16", "int4", "int4-plain", "int8", "int8-plain")
TOKENS: dict = {}
ENGINES: dict = {}
REPLAYS = 20


def kernels_of(engine, size: int = 1, context: int = 512) -> dict:
    quant_step.step_ms(engine, size, context, 5)
    runner = engine.graph_runner
    median = cuda_median_ms(lambda: runner.run(size), 20)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(REPLAYS):
            runner.run(size)
        torch.cuda.synchronize()
    per_name = collections.defaultdict(lambda: [0, 0.0])
    starts, ends = [], []
    for event in prof.events():
        if event.device_type != torch.autograd.DeviceType.CUDA:
            continue
        per_name[event.name][0] += 1
        per_name[event.name][1] += event.time_range.elapsed_us()
        starts.append(event.time_range.start)
        ends.append(event.time_range.end)
    rows = sorted(((n, c / REPLAYS, t / REPLAYS) for n, (c, t) in per_name.items()), key=lambda r: -r[2])
    return {"event_median_ms": median, "busy_us_per_step": sum(r[2] for r in rows),
            "span_us_per_step": (max(ends) - min(starts)) / REPLAYS, "kernels_per_step": sum(r[1] for r in rows),
            "kernels": [{"name": n[:160], "per_step": c, "us_per_step": t} for n, c, t in rows]}


def main(out_dir: str) -> None:
    plain_build = quant_step.build

    def build(mode, args):
        saved = m13_engine.LLMEngine.model_for_graphs
        try:
            if mode.endswith("-plain"):
                m13_engine.LLMEngine.model_for_graphs = lambda self: FusedCausalLM(self.model)
            engine = plain_build(mode, args)
        finally:
            m13_engine.LLMEngine.model_for_graphs = saved
        print(f"[{mode}] graphs record {type(engine.graph_runner.model.model).__name__}", flush=True)
        if mode != "bf16":
            TOKENS[mode] = {}
            for size in (1, 2):
                prompts = [[(7 * i + 13 * j) % 1000 + 5 for j in range(24 + 5 * i)] for i in range(size)]
                outs = engine.generate(prompts, SamplingParams(max_tokens=32, ignore_eos=True), use_tqdm=False)
                TOKENS[mode][size] = [list(o.token_ids) for o in outs]
        ENGINES[mode] = engine
        return engine

    for mode in MODES:
        quant_step.MODES.setdefault(mode, {"quantization": mode.split("-")[0]})
    quant_step.build = build
    quant_step.main(["--modes", ",".join(MODES), "--batches", "1,2", "--rounds", "5",
                     "--out", f"{out_dir}/m13_step_times_epilogue_ab.json"])
    check = {}
    for method in ("int4", "int8"):
        a, b = TOKENS.get(method), TOKENS.get(f"{method}-plain")
        same = a == b and a is not None
        first = None
        if not same and a and b:
            first = [next((i for i, (x, y) in enumerate(zip(s, t)) if x != y), None)
                     for size in a for s, t in zip(a[size], b[size])]
        check[method] = {"same_tokens": same, "first_difference": first}
        print(f"{method}: greedy tokens the same with and without the epilogues: {same} {first or ''}", flush=True)
    profiles = {"name": "step_kernels", "env": environment("cuda"), "model": "qwen3-8b-random", "batch": 1,
                "context": 512, "replays": REPLAYS, "modes": {}}
    for mode in ("int4", "int4-plain"):
        profiles["modes"][mode] = r = kernels_of(ENGINES[mode])
        print(f"[{mode}] step {r['event_median_ms']:.3f} ms (events); GPU busy {r['busy_us_per_step']:.0f} us, "
              f"span {r['span_us_per_step']:.0f} us, {r['kernels_per_step']:.0f} kernels a step", flush=True)
        for k in r["kernels"][:12]:
            print(f"   {k['us_per_step']:8.1f} us  x{k['per_step']:5.0f}  {k['name'][:90]}", flush=True)
    with open(f"{out_dir}/m13_step_kernels_epilogues.json", "w") as f:
        json.dump(profiles, f, indent=1)
    with open(f"{out_dir}/m13_epilogue_tokens.json", "w") as f:
        json.dump({"env": environment("cuda"), "check": check, "tokens": TOKENS}, f)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else ".")
