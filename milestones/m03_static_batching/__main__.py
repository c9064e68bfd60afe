"""``python -m milestones.m03_static_batching``: m02 (one request at a time) against m03 (padded batches).

Both produce the same tokens. m03 runs ``--max-num-seqs`` requests per forward pass, so each step's fixed
cost (reading the weights, launching the kernels) is shared by the whole batch. The table also shows what
the static batch wastes: left padding, and rows that finished but keep computing until the longest is done.
"""

from __future__ import annotations

import random

from milestones.common.demo import (Case, check_cases, check_min_max, demo_parser, engine_config, exit_on_bad_input,
                                    measure, parse_args, positive_int, print_speedup, print_table, random_prompts,
                                    same_tokens)
from milestones.m02_kv_cache import LLMEngine as KVCacheEngine
from milestones.m03_static_batching import EngineConfig, LLMEngine, SamplingParams

COLUMNS = ["label", "requests", "output tokens", "wall s", "output tok/s", "TTFT p50 (ms)", "tokens computed",
           "useful fraction"]


def main(argv: list[str] | None = None) -> list[dict]:
    parser = demo_parser("m03: static batching against m02 on the same prompts.",
                         prog="python -m milestones.m03_static_batching")
    parser.add_argument("--num-prompts", type=positive_int, default=16, help="requests (the same for both engines)")
    parser.add_argument("--max-num-seqs", type=positive_int, default=16, help="requests per static batch")
    parser.add_argument("--min-prompt-len", type=positive_int, default=16, help="shortest prompt (random token ids)")
    parser.add_argument("--max-prompt-len", type=positive_int, default=128, help="longest prompt")
    parser.add_argument("--min-tokens", type=positive_int, default=8,
                        help="shortest output (uniform between min and max)")
    parser.add_argument("--max-tokens", type=positive_int, default=48, help="longest output")
    args = parse_args(parser, argv)
    check_min_max(parser, args, "min_prompt_len", "max_prompt_len")
    check_min_max(parser, args, "min_tokens", "max_tokens")

    with exit_on_bad_input(parser):
        engines = {"m02_kv_cache": KVCacheEngine(engine_config(EngineConfig, args)),
                   "m03_static_batching": LLMEngine(engine_config(EngineConfig, args,
                                                                  max_num_seqs=args.max_num_seqs))}
        m03 = engines["m03_static_batching"]
        prompts = random_prompts(m03.vocab_size, args.num_prompts, args.min_prompt_len, args.max_prompt_len,
                                 args.seed)
        rng = random.Random(args.seed)
        params = [SamplingParams(max_tokens=rng.randint(args.min_tokens, args.max_tokens), ignore_eos=True)
                  for _ in prompts]
        cases = [Case(label, engine, prompts, params) for label, engine in engines.items()]
        check_cases(cases)
    print(f"model {args.model!r} on {m03.device} in {m03.dtype}")

    rows = measure(cases, args.repeats)
    print_table(rows, f"{args.num_prompts} requests, prompts {args.min_prompt_len}-{args.max_prompt_len} tokens, "
                      f"outputs {args.min_tokens}-{args.max_tokens} tokens, batches of {args.max_num_seqs}", COLUMNS)
    print()
    print_speedup(rows, "m02_kv_cache", "output tok/s")
    stats = rows[1]["_stats"]
    print(f"m03 computed {stats.padding_tokens:,} of {stats.tokens_computed:,} token positions for nothing "
          "(left padding + finished rows waiting for the longest one)")
    print(f"identical tokens (greedy): {'yes' if same_tokens(rows) else 'NO'}")
    return rows


if __name__ == "__main__":
    main()
