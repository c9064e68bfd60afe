"""``python -m milestones.m14_tensor_parallel``: one model split across ranks, what crosses between them, and
what that costs.

1. **The split**: what each rank holds (asked of every rank through ``collective_rpc``): one decoder layer's
   matrices, the embedding and LM head, the bytes of its weights and of its K/V per token.
2. **What crosses per token**: the all-reduce bytes computed (one hidden vector per all-reduce, two per layer)
   and measured: rank 0's time inside all-reduce calls and in the step broadcasts, from torch's profiler.
3. **TP=1 against TP=N** end to end, interleaved: output tokens/s and whether the tokens agree.

On a CPU every rank is a process on the same cores, and gloo's all-reduce goes through the loopback: TP=2 is
*slower* there, and the demo shows by how much. On GPUs the same code runs with NCCL between them.
``serve`` starts m09's server over this engine in m11's engine core process (``-tp 2`` to split it).
"""

from __future__ import annotations

import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile

from milestones.common.demo import (Case, check_cases, demo_parser, engine_config, exit_on_bad_input, measure,
                                    parse_args, positive_int, print_speedup, print_table, random_prompts, same_tokens)

from . import EngineConfig, LLMEngine, SamplingParams
from .parallel_layers import all_reduce_bytes_per_token
from .sharded_loader import describe_shard

MILESTONE = "milestones.m14_tensor_parallel"
E2E_COLUMNS = ["label", "requests", "output tokens", "wall s", "output tok/s", "ms/token (mean ITL)"]
COLLECTIVES = {"all-reduce": "c10d::allreduce_", "broadcast (step inputs, filled ids)": "c10d::broadcast_"}


def communication_rows(engine: LLMEngine, prompts: list, params: SamplingParams) -> tuple[list[dict], dict]:
    """One ``generate`` under torch's profiler: rank 0's calls and time per collective, and the run's numbers."""
    with profile(activities=[ProfilerActivity.CPU]) as profiler:
        began = time.perf_counter()
        outputs = engine.generate(prompts, params, use_tqdm=False)
        wall = time.perf_counter() - began
    events = {event.key: event for event in profiler.key_averages()}
    steps = engine.stats.steps
    rows = []
    for label, key in COLLECTIVES.items():
        event = events.get(key)
        calls, seconds = (event.count, event.cpu_time_total / 1e6) if event is not None else (0, 0.0)
        rows.append({"collective (rank 0)": label, "calls": calls, "calls per step": calls / steps,
                     "ms per step": seconds / steps * 1e3, "share of the wall time": f"{seconds / wall:.0%}"})
    tokens = sum(len(o.token_ids) for o in outputs)
    return rows, {"steps": steps, "wall": wall, "tokens": tokens}


def main(argv: list[str] | None = None):
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["serve"]:
        from milestones.m09_server.__main__ import main as server_main

        return server_main(argv, milestone=MILESTONE)
    parser = demo_parser("m14: one model split across ranks (tensor parallelism): what each rank holds, what "
                         "crosses between them per token, and TP=1 against TP=N. `serve --help` for the server.",
                         prog=f"python -m {MILESTONE}")
    parser.add_argument("-tp", "--tensor-parallel-size", type=positive_int, default=2,
                        help="ranks sharing every layer (gloo processes on a CPU, one GPU each with NCCL)")
    parser.add_argument("--num-prompts", type=positive_int, default=8, help="requests decoding together")
    parser.add_argument("--prompt-len", type=positive_int, default=16, help="tokens per prompt")
    parser.add_argument("--max-tokens", type=positive_int, default=8, help="tokens per answer")
    args = parse_args(parser, argv)
    tp = args.tensor_parallel_size
    if tp < 2:
        parser.error("--tensor-parallel-size must be at least 2: the demo compares it with 1")
    knobs = dict(max_num_seqs=args.num_prompts, max_model_len=args.prompt_len + args.max_tokens + 8,
                 enable_prefix_caching=False)
    with exit_on_bad_input(parser):
        single = LLMEngine(engine_config(EngineConfig, args, **knobs))
        split = LLMEngine(engine_config(EngineConfig, args, tensor_parallel_size=tp, **knobs))
        prompts = random_prompts(single.vocab_size, args.num_prompts, args.prompt_len, args.prompt_len, args.seed)
        params = SamplingParams(max_tokens=args.max_tokens, ignore_eos=True)
        cases = [Case("TP=1", single, prompts, params), Case(f"TP={tp}", split, prompts, params)]
        check_cases(cases)
    try:
        return run(args, single, split, cases)
    finally:
        split.close()


def run(args, single: LLMEngine, split: LLMEngine, cases: list[Case]) -> list[dict]:
    tp, config, dtype = args.tensor_parallel_size, split.full_model_config, split.dtype
    print(f"model {args.model!r} in {str(dtype).removeprefix('torch.')}: {config.num_hidden_layers} layers, "
          f"{config.num_attention_heads} heads / {config.num_key_value_heads} K/V heads, intermediate "
          f"{config.intermediate_size}, vocabulary {config.vocab_size:,}; {tp} ranks "
          f"({split.parallel.backend}, rank 0 in this process {split.device}, the others worker processes)")
    print(split.describe_kv_cache())
    shards = [describe_shard(single)] + split.collective_rpc(describe_shard)
    shards[0]["rank"] = "TP=1"
    print_table(shards, "1. What each rank holds (one decoder layer's matrices, [out x in]; every layer alike)")

    per_reduce, reduces = all_reduce_bytes_per_token(config, dtype)
    print(f"\n2. What crosses between ranks per token: {reduces} all-reduces (2 per layer: after o_proj and after "
          f"down_proj) of one hidden vector ({config.hidden_size} x {dtype.itemsize} bytes = {per_reduce:,} bytes) "
          f"= {per_reduce * reduces / 1024:,.1f} KiB per token, for any number of ranks (a ring all-reduce moves "
          f"2(N-1)/N of it in and out of each rank); a step of B tokens all-reduces B times that.")
    rows, run_info = communication_rows(split, cases[1].prompts, cases[1].params)
    print_table(rows, f"   measured: one TP={tp} run under torch's profiler ({run_info['steps']} steps, "
                      f"{run_info['tokens']} output tokens, {run_info['wall']:.2f} s)")
    print("   Rank 0's time *inside* the calls, waiting for the slower rank included. The step broadcasts are the "
          "step's packed inputs (2 per step) and, with async scheduling, the filled input ids (1 per step).")

    e2e = measure(cases, args.repeats)
    print_table(e2e, f"3. End to end: {args.num_prompts} requests, {args.prompt_len} prompt tokens, "
                     f"{args.max_tokens} output tokens each", E2E_COLUMNS)
    print_speedup(e2e, "TP=1", "output tok/s")
    print(f"same tokens: {'yes' if same_tokens(e2e) else 'NO'}")
    if split.device.type != "cuda":
        print(f"On a CPU the {tp} ranks share the same cores and every all-reduce is a round trip through the "
              "loopback: TP is slower here. It pays where one GPU's memory bandwidth is the limit and NVLink is "
              "fast (docs/m14-tensor-parallel.md has the arithmetic).")
    if dtype != torch.float32 and not same_tokens(e2e):
        print("  (outside float32 the split sums round differently, so a near-tie can flip; float32 must match)")
    return shards + rows + e2e


if __name__ == "__main__":
    main()
