"""Where a steady-state step's time goes: the exact ``nanovllm`` workload, driven step by step, measured twice.

Steps ``[start, start + n)`` with nothing watching give the wall time; the next ``n`` under the torch profiler
give the GPU-busy time (the union of every kernel and copy), the biggest kernels and the host's blocked time.
Each step's K/V bytes over the copy bandwidth (``kernel_bench``'s) is the floor the paged kernel works against;
``wall / GPU-busy`` says how much of a step the host costs.

    python -m benchmarks.step_probe --milestone m10,m11,m12 --out-dir $OUT
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from .env import REPO_ROOT, environment, write_json
from .harness import free_memory
from .kernel_bench import Timing
from .runners import kv_tokens_needed, make_runner, sync
from .workloads import get_workload

BLOCKING_CALLS = ("cudaEventSynchronize", "cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaMemcpy ")


def busy_time_us(events) -> tuple[float, dict[str, float]]:
    """The union of device intervals (µs) and the total time of each kernel name."""
    spans, per_kernel = [], {}
    for e in events:
        if e.device_type == torch.autograd.DeviceType.CUDA and e.time_range.elapsed_us() > 0:
            spans.append((e.time_range.start, e.time_range.end))
            per_kernel[e.name] = per_kernel.get(e.name, 0.0) + e.time_range.elapsed_us()
    busy, end = 0.0, float("-inf")
    for start, stop in sorted(spans):
        busy, end = busy + max(0.0, stop - max(start, end)), max(end, stop)
    return busy, per_kernel


def probe(milestone: str, start: int, num_steps: int, model: str, overrides: dict, device: str = "cuda",
          max_requests: int | None = None) -> dict:
    """``milestone`` on the workload (its first ``max_requests``): from step ``start``, ``num_steps`` timed, then
    as many profiled."""
    workload = get_workload("nanovllm", 0)
    runner = make_runner(milestone, workload, model=model, device=device, dtype="auto", seed=0,
                         overrides=overrides, kv_tokens=kv_tokens_needed(workload))
    runner.warmup()
    engine = runner.engine
    for request, sp in zip(workload.requests[:max_requests], runner._params(workload.requests)):
        engine.add_request(list(request.prompt_token_ids), sp)
    with torch.inference_mode():
        for _ in range(start):
            engine.engine_step()
        window = {"running": [], "kv_bytes": []}

        def steps() -> None:
            for _ in range(num_steps):
                running = engine.scheduler.running
                window["running"].append(len(running))
                window["kv_bytes"].append(sum(s.num_tokens for s in running) * engine.kv_bytes_per_token)
                engine.engine_step()

        sync(engine.device)
        began = time.perf_counter()
        steps()
        sync(engine.device)
        wall = time.perf_counter() - began
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            steps()
            sync(engine.device)
        for seq in [*engine.scheduler.running, *engine.scheduler.waiting]:  # the rest is not measured
            engine.abort(seq.request_id)
        while engine.has_unfinished():
            engine.engine_step()
    events = prof.events()
    busy_us, per_kernel = busy_time_us(events)
    blocked_us = sum(e.cpu_time_total for e in events if e.name.startswith(BLOCKING_CALLS))
    profiled_wall_us = max(e.time_range.end for e in events) - min(e.time_range.start for e in events)
    copy_gbs = Timing(engine.device).copy_bandwidth_gbs() if engine.device.type == "cuda" else float("nan")
    step_ms = wall / num_steps * 1e3
    busy_ms = busy_us / num_steps / 1e3
    kv_gb = statistics.fmean(window["kv_bytes"]) / 1e9  # both windows: the timed one and the profiled one
    running = statistics.fmean(window["running"])
    host_ms = (profiled_wall_us - blocked_us) / num_steps / 1e3
    top = sorted(per_kernel.items(), key=lambda kv: -kv[1])[:12]
    result = {
        "milestone": engine.milestone, "workload": "nanovllm", "steps": [start, start + num_steps],
        "mean_running": running, "step_wall_ms": step_ms, "gpu_busy_ms": busy_ms,
        "wall_over_gpu_busy": step_ms / busy_ms if busy_ms else float("nan"),
        "kv_gb_per_step": kv_gb, "copy_bandwidth_gb_s": copy_gbs, "kv_read_floor_ms": kv_gb / copy_gbs * 1e3,
        "kv_bandwidth_fraction_of_wall": kv_gb / (step_ms / 1e3) / copy_gbs,
        "host_ms_per_step_profiled": host_ms, "host_us_per_running_request": host_ms * 1e3 / running,
        "top_kernels_ms_per_step": {name: us / num_steps / 1e3 for name, us in top},
        "graph_steps": getattr(engine.stats, "graph_steps", None), "engine_config": runner.knobs(),
        "env": environment(engine.device),
    }
    print(f"{engine.milestone}: steps {start}-{start + num_steps} ({running:.0f} running): {step_ms:.2f} ms/step "
          f"wall, GPU busy {busy_ms:.2f} ms ({result['wall_over_gpu_busy']:.2f}x), K/V {kv_gb:.1f} GB/step = "
          f"{result['kv_read_floor_ms']:.2f} ms at {copy_gbs:,.0f} GB/s; host {host_ms:.2f} ms/step "
          f"({result['host_us_per_running_request']:.1f} us per running request, under the profiler)", flush=True)
    for name, ms in result["top_kernels_ms_per_step"].items():
        print(f"    {ms:7.3f} ms  {name[:110]}")
    runner.close()  # m14: its worker processes go now
    del runner, engine
    free_memory()
    return result


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.step_probe", description=__doc__.split("\n\n")[0])
    parser.add_argument("--milestone", default="m10,m11,m12", help="comma-separated milestones")
    parser.add_argument("--start", type=int, default=300, help="first step of the window (after the admissions)")
    parser.add_argument("--steps", type=int, default=80, help="steps per window")
    parser.add_argument("--model", default="qwen3-0.6b-random")
    parser.add_argument("--device", default="cuda", help="cuda (what it is for), or cpu to try it out")
    parser.add_argument("--max-requests", type=int, help="only the workload's first N requests (a CPU try-out)")
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                        help="an EngineConfig override (JSON value), e.g. --set async_scheduling=false")
    parser.add_argument("--out-dir", type=Path, default=REPO_ROOT / "benchmarks" / "results")
    args = parser.parse_args(argv)
    overrides = {k: json.loads(v) for k, v in (item.split("=", 1) for item in args.set)}
    results = []
    for milestone in args.milestone.split(","):
        result = probe(milestone, args.start, args.steps, args.model, overrides, args.device, args.max_requests)
        write_json(result, args.out_dir / result["env"]["gpu_slug"] / f"step_probe_{milestone}.json")
        results.append(result)
    return results


if __name__ == "__main__":
    main()
