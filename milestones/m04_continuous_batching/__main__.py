"""``python -m milestones.m04_continuous_batching``: m03 (static batches) against m04 on a skewed workload.

Most requests want a few tokens and one in ``--long-every`` wants many. A static batch holding one long
request decodes for all of its rows until that one is done; continuous batching lets the short requests
leave and new ones take their seats. The K/V columns show m04's other cost: each request reserves room for
its *maximum* length, far more than it uses while it runs (what m05's paged blocks fix).
"""

from __future__ import annotations

from milestones.common.demo import (Case, check_cases, demo_parser, engine_config, exit_on_bad_input, measure,
                                    parse_args, positive_int, print_speedup, print_table, random_prompts, same_tokens)
from milestones.m03_static_batching import LLMEngine as StaticBatchingEngine
from milestones.m04_continuous_batching import EngineConfig, LLMEngine, SamplingParams

COLUMNS = ["label", "requests", "output tokens", "wall s", "output tok/s", "TTFT p50 (ms)", "tokens computed",
           "useful fraction", "KV reserved peak (MiB)", "KV used peak (MiB)"]


def main(argv: list[str] | None = None) -> list[dict]:
    parser = demo_parser("m04: continuous batching against m03's static batches on a skewed workload.",
                         prog="python -m milestones.m04_continuous_batching")
    parser.add_argument("--num-prompts", type=positive_int, default=32, help="requests (the same for both engines)")
    parser.add_argument("--max-num-seqs", type=positive_int, default=8, help="requests in flight (m03: batch size)")
    parser.add_argument("--prompt-len", type=positive_int, default=32, help="tokens per prompt")
    parser.add_argument("--short-tokens", type=positive_int, default=4, help="output of most requests")
    parser.add_argument("--long-tokens", type=positive_int, default=96, help="output of every --long-every-th request")
    parser.add_argument("--long-every", type=positive_int, default=8,
                        help="request 0, N, 2N, ... want --long-tokens (1: every request)")
    args = parse_args(parser, argv)

    knobs = dict(max_num_seqs=args.max_num_seqs)
    with exit_on_bad_input(parser):
        engines = {"m03_static_batching": StaticBatchingEngine(engine_config(EngineConfig, args, **knobs)),
                   "m04_continuous_batching": LLMEngine(engine_config(EngineConfig, args, **knobs))}
        m04 = engines["m04_continuous_batching"]
        prompts = random_prompts(m04.vocab_size, args.num_prompts, args.prompt_len, args.prompt_len, args.seed)
        params = [SamplingParams(max_tokens=args.long_tokens if i % args.long_every == 0 else args.short_tokens,
                                 ignore_eos=True) for i in range(args.num_prompts)]
        cases = [Case(label, engine, prompts, params) for label, engine in engines.items()]
        check_cases(cases)
    print(f"model {args.model!r} on {m04.device} in {m04.dtype}")

    rows = measure(cases, args.repeats)
    print_table(rows, f"{args.num_prompts} requests: one in {args.long_every} wants {args.long_tokens} tokens, "
                      f"the rest {args.short_tokens}; {args.max_num_seqs} in flight", COLUMNS)
    print()
    print_speedup(rows, "m03_static_batching", "output tok/s")
    print_speedup(rows, "m03_static_batching", "tokens computed", lower_is_better=True)
    stats = rows[1]["_stats"]
    print(f"m04 K/V: peak reserved {stats.kv_reserved_peak_bytes / 2**20:,.1f} MiB, peak used "
          f"{stats.kv_used_peak_bytes / 2**20:,.1f} MiB: regions are sized for the longest a request may get")
    print(f"identical tokens (greedy): {'yes' if same_tokens(rows) else 'NO'}")
    return rows


if __name__ == "__main__":
    main()
