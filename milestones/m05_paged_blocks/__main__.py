"""``python -m milestones.m05_paged_blocks``: m04 (contiguous regions) against m05 (paged blocks) at one K/V budget.

Real traffic over-reserves: every request asks for up to ``--max-tokens`` tokens (a user's cap), but most stop
far earlier, at a point no scheduler can foresee (a stop string, or a client that has what it needs). Here the
client aborts each request at its real length, drawn from a lognormal around ``--median-tokens``.

m04 must reserve prompt + cap for every request before admitting it, so the budget admits few at a time.
m05 hands out blocks as tokens arrive, so the same budget holds many more requests, and on a device where a
bigger batch costs little more per step (any GPU) that becomes throughput. The table shows requests in flight,
K/V reserved against used, and output tokens/s; greedy tokens must be identical.
"""

from __future__ import annotations

import math
import random
import time

from milestones.common.demo import (Case, byte_size, check_cases, demo_parser, engine_config, exit_on_bad_input,
                                    interleaved_rounds, parse_args, positive_float, positive_int, print_speedup,
                                    print_table, random_prompts)
from milestones.common.latency import summarize
from milestones.m04_continuous_batching import LLMEngine as ContinuousBatchingEngine
from milestones.m05_paged_blocks import EngineConfig, LLMEngine, SamplingParams

MiB = 2**20
COLUMNS = ["label", "requests", "output tokens", "wall s", "output tok/s", "mean running", "peak running",
           "KV reserved mean (MiB)", "KV used mean (MiB)", "used / reserved", "preemptions"]


def real_lengths(num: int, median: int, cap: int, seed: int) -> list[int]:
    """Lognormal output lengths (sigma 0.8) around ``median``, clipped to [1, cap]."""
    rng = random.Random(seed + 1)
    return [max(1, min(cap, round(rng.lognormvariate(math.log(median), 0.8)))) for _ in range(num)]


def run_with_client_stops(engine, prompts: list[list[int]], cap: int, lengths: list[int], label: str) -> dict:
    """Submit every request with ``max_tokens=cap``; abort each one when it has its real length."""
    warm_up = SamplingParams(max_tokens=min(2, cap), ignore_eos=True)  # fits wherever the real requests fit
    engine.generate([prompts[0][:16]], warm_up, use_tqdm=False)
    engine.stats = engine.new_stats()
    wanted = {}
    start = time.perf_counter()
    for prompt, length in zip(prompts, lengths):
        wanted[engine.add_request(prompt, SamplingParams(max_tokens=cap, ignore_eos=True))] = length
    latest = {}
    while engine.has_unfinished():
        for out in engine.step():
            latest[out.request_id] = out
            if out.finish_reason is None and len(out.token_ids) >= wanted[out.request_id]:
                engine.abort(out.request_id)  # the client has what it needs
    outputs = [latest[request_id] for request_id in wanted]
    summary = summarize(outputs, time.perf_counter() - start)
    stats = engine.stats
    return {
        "label": label,
        "requests": summary["num_requests"],
        "output tokens": summary["output_tokens"],
        "wall s": summary["wall_time_s"],
        "output tok/s": summary["output_tokens_per_s"],
        "mean running": stats.mean_running,
        "peak running": max(stats.running_per_step),
        "KV reserved mean (MiB)": stats.kv_reserved_mean_bytes / MiB,
        "KV used mean (MiB)": stats.kv_used_mean_bytes / MiB,
        "used / reserved": stats.kv_used_mean_bytes / stats.kv_reserved_mean_bytes,
        "preemptions": getattr(stats, "num_preemptions", 0),
        "_outputs": outputs,
    }


def main(argv: list[str] | None = None) -> list[dict]:
    parser = demo_parser("m05: paged K/V blocks against m04's contiguous regions, at the same K/V budget.",
                         prog="python -m milestones.m05_paged_blocks")
    parser.add_argument("--num-prompts", type=positive_int, default=48, help="requests, all submitted at once")
    parser.add_argument("--prompt-len", type=positive_int, default=48, help="tokens per prompt (random token ids)")
    parser.add_argument("--max-tokens", type=positive_int, default=256,
                        help="every request's cap (what m04 must reserve)")
    parser.add_argument("--median-tokens", type=positive_int, default=24,
                        help="median real output length; the client aborts each request there")
    parser.add_argument("--kv-cache-memory-bytes", type=byte_size, default=None,
                        help="K/V budget for both engines, in bytes: 1G is 1 GiB, 1g 10**9 "
                             "(default: room for 6 capped requests)")
    parser.add_argument("--gpu-memory-utilization", type=positive_float, default=None,
                        help="vLLM's alternative on a GPU: the fraction of GPU memory m05 may use; K/V gets what the "
                             "weights and a profiled forward pass leave, and m04 gets the same number of slots "
                             "(default: not used)")
    parser.add_argument("--max-num-batched-tokens", type=positive_int, default=8192,
                        help="m05: new tokens one step may feed")
    parser.add_argument("--block-size", type=positive_int, default=16, help="token slots per K/V block (m05)")
    parser.add_argument("--max-num-seqs", type=positive_int, default=64, help="most requests in flight (both engines)")
    args = parse_args(parser, argv)

    if args.kv_cache_memory_bytes and args.gpu_memory_utilization:
        parser.error("give --kv-cache-memory-bytes or --gpu-memory-utilization, not both")
    if args.kv_cache_memory_bytes:
        sizing = dict(kv_cache_memory_bytes=args.kv_cache_memory_bytes)
    elif args.gpu_memory_utilization:
        sizing = dict(gpu_memory_utilization=args.gpu_memory_utilization)
    else:
        sizing = dict(kv_cache_tokens=6 * (args.prompt_len + args.max_tokens))
    with exit_on_bad_input(parser):
        m05 = LLMEngine(engine_config(EngineConfig, args, max_num_seqs=args.max_num_seqs, block_size=args.block_size,
                                      max_num_batched_tokens=args.max_num_batched_tokens, **sizing))
        budget_tokens = m05.kv_pool.capacity
        m04 = ContinuousBatchingEngine(engine_config(EngineConfig, args, max_num_seqs=args.max_num_seqs,
                                                     kv_cache_tokens=budget_tokens))
        prompts = random_prompts(m05.vocab_size, args.num_prompts, args.prompt_len, args.prompt_len, args.seed)
        capped = SamplingParams(max_tokens=args.max_tokens, ignore_eos=True)
        check_cases([Case("m04_continuous_batching", m04, prompts, capped), Case("m05_paged_blocks", m05, prompts,
                                                                                  capped)])
    print(f"model {args.model!r} on {m05.device} in {m05.dtype}")
    print(f"m05 {m05.describe_kv_cache()}; m04 gets the same {budget_tokens:,} slots as one contiguous pool")
    lengths = real_lengths(args.num_prompts, args.median_tokens, args.max_tokens, args.seed)

    rows = interleaved_rounds(
        [lambda: run_with_client_stops(m04, prompts, args.max_tokens, lengths, "m04_continuous_batching"),
         lambda: run_with_client_stops(m05, prompts, args.max_tokens, lengths, "m05_paged_blocks")], args.repeats)
    print_table(rows, f"{args.num_prompts} requests x {args.prompt_len}-token prompts, capped at {args.max_tokens} "
                      f"tokens, stopped by the client at a median of {args.median_tokens}; K/V budget "
                      f"{budget_tokens:,} token slots", COLUMNS)
    print()
    print_speedup(rows, "m04_continuous_batching", "mean running")
    print_speedup(rows, "m04_continuous_batching", "output tok/s")
    same = all(a.token_ids == b.token_ids for a, b in zip(rows[0]["_outputs"], rows[1]["_outputs"]))
    print(f"identical tokens (greedy): {'yes' if same else 'NO'}")
    print("m04 reserves prompt + cap per request; m05 holds only the blocks its tokens fill.")
    return rows


if __name__ == "__main__":
    main()
