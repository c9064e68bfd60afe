"""A first look at a new engine on the GPU, in one short call: does it run, is it right, roughly how fast?

    python -m benchmarks.gpu_probe --out $OUT            # on the GPU machine

Not a measurement to quote (one run each, no interleaving: that is ``gpu_suite``'s job). It checks, in order:

1. float32 greedy tokens of m08 and m10 (CUDA graphs on) against transformers' on a few prompts;
2. m10's graph capture (time, memory) and its decode step eager against replayed per batch size;
3. one run each of m08 and m10 on ``offline`` and ``nanovllm`` (bf16), output tokens/s and graph/eager steps.

Everything printed also goes to ``<out>/probe.json``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from .env import environment


def fp32_check(milestones: list[str], num_prompts: int, max_tokens: int) -> dict:
    import importlib

    from .baselines import build_hf_model
    from .workloads import get_workload

    device = torch.device("cuda")
    hf = build_hf_model("qwen3-0.6b-random", device, torch.float32, 0)
    prompts = [list(r.prompt_token_ids)[:200] for r in get_workload("offline").requests[:num_prompts]]
    reference = []
    with torch.inference_mode():
        for p in prompts:
            out = hf.generate(torch.tensor([p], device=device), attention_mask=torch.ones(1, len(p), dtype=torch.long,
                              device=device), max_new_tokens=max_tokens, do_sample=False, eos_token_id=None)
            reference.append(out[0, len(p):].tolist())
    del hf
    report = {}
    for name in milestones:
        module = importlib.import_module(f"milestones.{name}")
        engine = module.LLMEngine(module.EngineConfig(model="qwen3-0.6b-random", device="cuda", dtype="float32",
                                                      max_num_seqs=8, kv_cache_memory_bytes=4 * 2**30))
        outputs = engine.generate(prompts, module.SamplingParams(max_tokens=max_tokens, ignore_eos=True),
                                  use_tqdm=False)
        same = [o.token_ids == r for o, r in zip(outputs, reference)]
        report[name] = {"identical": same, "graph_steps": getattr(engine.stats, "graph_steps", None)}
        print(f"fp32 {name}: identical to transformers {sum(same)}/{len(same)}", flush=True)
        del engine
        torch.cuda.empty_cache()
    return report


def throughput(milestone: str, workload: str, overrides: dict) -> dict:
    from .harness import run_benchmark

    result = run_benchmark(milestone, workload, device="cuda", overrides=overrides, use_tqdm=False, log=None,
                           catch_errors=True)
    m = result.get("metrics") or {}
    row = {"run": f"{milestone}:{workload}", "status": result["status"], "error": result.get("error"),
           "tok_s": m.get("output_tokens_per_s"), "wall_s": m.get("wall_time_s"), "steps": m.get("steps"),
           "graph_steps": m.get("graph_steps"), "eager_steps": m.get("eager_steps"),
           "ttft_p50_s": m.get("ttft_p50_s"), "itl_p50_s": m.get("itl_p50_s")}
    print(json.dumps(row), flush=True)
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gpu_probe", description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/probe"))
    parser.add_argument("--skip", default="", help="comma-separated parts to skip: fp32,steps,throughput")
    args = parser.parse_args(argv)
    skip = set(filter(None, args.skip.split(",")))
    report: dict = {"env": environment("cuda")}
    began = time.perf_counter()
    if "fp32" not in skip:
        report["fp32"] = fp32_check(["m08_triton_kernel", "m10_cuda_graphs"], num_prompts=4, max_tokens=24)
    if "steps" not in skip:
        from milestones.m10_cuda_graphs import EngineConfig, LLMEngine
        from milestones.m10_cuda_graphs.__main__ import step_rows

        engine = LLMEngine(EngineConfig(model="qwen3-0.6b-random", device="cuda", max_num_seqs=256,
                                        kv_cache_memory_bytes=16 * 2**30))
        print(engine.describe_cuda_graphs(), flush=True)
        rows = step_rows(engine, 512, 20)
        for row in rows:
            print(row, flush=True)
        report["steps"] = {"capture": engine.describe_cuda_graphs(), "rows": rows}
        del engine
        torch.cuda.empty_cache()
    if "throughput" not in skip:
        report["throughput"] = [
            throughput("m08", "offline", {"kv_cache_memory_bytes": 24 * 2**30}),
            throughput("m10", "offline", {"kv_cache_memory_bytes": 24 * 2**30}),
            throughput("m10", "nanovllm", {"kv_cache_memory_bytes": 48 * 2**30, "max_num_seqs": 256}),
            throughput("m08", "nanovllm", {"kv_cache_memory_bytes": 48 * 2**30, "max_num_seqs": 256}),
        ]
    report["total_s"] = time.perf_counter() - began
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "probe.json").write_text(json.dumps(report, indent=1, default=str) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
