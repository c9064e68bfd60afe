"""Where a batch-1 decode step of qwen3-8b-random goes, kernel by kernel (one GPU call): bf16 and int4 engines
(quant_step's), each captured step replayed under torch.profiler; GPU time per kernel name, per step, and the
step's span. Also the step's event-timed median beside it. (Call 41 ran it at cccabdc, call 44 at cdd3df0; call 83
at 1 and 2 rows, with the norms writing the GEMVs' integers and the GEMV in programs of 64 rows; call 84 at e0c6860;
call 87 after the integer norm went to 16 warps, multiplying.)

    python3 scratch/step_kernels.py OUT.json [BATCHES] [MODES]

MODES: quant_step's (default bf16,int4). Calls 99-101 also profiled variants a scratch A/B set up
(``rope_kv_ab.py`` at b01dcb8, ``live_splits_tiles_ab.py`` at 8e5fda6).
"""

from __future__ import annotations

import argparse
import collections
import json
import sys

import torch
from torch.profiler import ProfilerActivity, profile

import benchmarks.quant_step as quant_step
from benchmarks.env import environment
from milestones.common.demo import cuda_median_ms

REPLAYS = 20


def kernels_of(engine, size: int = 1, context: int = 512) -> dict:
    quant_step.step_ms(engine, size, context, 5)  # fills the graph's inputs as quant_step does, and warms up
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
    busy = sum(r[2] for r in rows)
    return {"event_median_ms": median, "busy_us_per_step": busy, "span_us_per_step": (max(ends) - min(starts)) / REPLAYS,
            "kernels_per_step": sum(r[1] for r in rows),
            "kernels": [{"name": n[:160], "per_step": c, "us_per_step": t} for n, c, t in rows]}


def main(out: str, batches: list[int], modes: list[str]) -> None:
    args = argparse.Namespace(model="qwen3-8b-random", seed=0, kv_cache_memory_gib=4.0, batches=batches)
    result = {"name": "step_kernels", "env": environment("cuda"), "model": args.model, "batches": batches,
              "context": 512, "replays": REPLAYS, "modes": {}}
    for mode in modes:
        engine = quant_step.build(mode, args)
        for size in batches:
            result["modes"][f"{mode} b{size}"] = r = kernels_of(engine, size)
            print(f"[{mode} b{size}] step {r['event_median_ms']:.3f} ms (events); GPU busy {r['busy_us_per_step']:.0f} "
                  f"us, span {r['span_us_per_step']:.0f} us, {r['kernels_per_step']:.0f} kernels a step", flush=True)
            for k in r["kernels"][:25]:
                print(f"   {k['us_per_step']:8.1f} us  x{k['per_step']:5.0f}  {k['name'][:110]}", flush=True)
        del engine
        torch.cuda.empty_cache()
    with open(out, "w") as f:
        json.dump(result, f, indent=1)
    print(f"-> {out}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "step_kernels.json",
         [int(b) for b in (sys.argv[2] if len(sys.argv) > 2 else "1").split(",")],
         (sys.argv[3] if len(sys.argv) > 3 else "bf16,int4").split(","))
