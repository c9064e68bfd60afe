"""``python -m milestones.m06_prefix_cache``: the same engine with its prefix cache off (= m05) and on.

Every request starts with the same long system prompt and adds a short question of its own, the shape of a
chat service. With the cache off, every request computes the whole system prompt again. With it on, the
first request computes it once; every later request finds its full blocks by their chained hash, shares
them, and computes only its own question: far fewer prompt tokens computed, and a first token much sooner.
"""

from __future__ import annotations


from milestones.common.demo import (Case, check_cases, demo_parser, engine_config, exit_on_bad_input, measure,
                                    parse_args, positive_int, print_speedup, print_table, random_prompts, same_tokens)
from milestones.m06_prefix_cache import EngineConfig, LLMEngine, SamplingParams

COLUMNS = ["label", "requests", "prompt tokens", "prompt tokens computed", "cache hit rate", "TTFT p50 (ms)",
           "TTFT p99 (ms)", "wall s", "output tok/s"]


def main(argv: list[str] | None = None) -> list[dict]:
    parser = demo_parser("m06: prefix caching off (m05) and on, on requests that share a system prompt.",
                         prog="python -m milestones.m06_prefix_cache")
    parser.add_argument("--num-prompts", type=positive_int, default=16, help="requests, all submitted at once")
    parser.add_argument("--system-len", type=positive_int, default=512, help="tokens of the shared system prompt")
    parser.add_argument("--question-len", type=positive_int, default=32, help="each request's own tokens after it")
    parser.add_argument("--max-tokens", type=positive_int, default=8, help="tokens to generate per request")
    parser.add_argument("--max-num-batched-tokens", type=positive_int, default=2048,
                        help="new tokens per step at most")
    parser.add_argument("--block-size", type=positive_int, default=16, help="token slots per K/V block")
    parser.add_argument("--no-prefix-caching", action="store_true",
                        help="run only the engine with its prefix cache off (m05's behaviour), no comparison")
    args = parse_args(parser, argv)

    knobs = dict(max_num_seqs=args.num_prompts, max_num_batched_tokens=args.max_num_batched_tokens,
                 block_size=args.block_size)
    with exit_on_bad_input(parser):
        engines = {"prefix cache off (m05)": LLMEngine(engine_config(EngineConfig, args,
                                                                     enable_prefix_caching=False, **knobs))}
        if not args.no_prefix_caching:
            engines["prefix cache on (m06)"] = LLMEngine(engine_config(EngineConfig, args, **knobs))
        on = list(engines.values())[-1]
        (system,) = random_prompts(on.vocab_size, 1, args.system_len, args.system_len, args.seed)
        questions = random_prompts(on.vocab_size, args.num_prompts, args.question_len, args.question_len,
                                   args.seed + 1)
        prompts = [system + q for q in questions]
        params = SamplingParams(max_tokens=args.max_tokens, ignore_eos=True)
        # measure() empties the cache before every timed run: each round is the cold start this demo is about.
        cases = [Case(label, engine, prompts, params) for label, engine in engines.items()]
        check_cases(cases)
    print(f"model {args.model!r} on {on.device} in {on.dtype}; {on.describe_kv_cache()}")

    rows = measure(cases, args.repeats)
    for row in rows:
        row["prompt tokens computed"] = row["_stats"].prompt_tokens_computed
        row["cache hit rate"] = row["_stats"].prefix_cache_hit_rate or 0.0
    print_table(rows, f"{args.num_prompts} requests = one {args.system_len}-token system prompt + their own "
                      f"{args.question_len} tokens, {args.max_tokens} output tokens each", COLUMNS)
    print()
    if args.no_prefix_caching:
        print("prefix caching off (--no-prefix-caching): every request computed its whole prompt")
        return rows
    print_speedup(rows, "prefix cache off (m05)", "prompt tokens computed", lower_is_better=True)
    print_speedup(rows, "prefix cache off (m05)", "TTFT p50 (ms)", lower_is_better=True)
    print(f"outputs report num_cached_tokens, e.g. {[o.num_cached_tokens for o in rows[1]['_outputs'][:4]]} ...")
    print(f"identical tokens (greedy): {'yes' if same_tokens(rows) else 'NO'}")
    return rows


if __name__ == "__main__":
    main()
