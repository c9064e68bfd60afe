"""``python -m milestones.m02_kv_cache``: m01 and m02 on the same prompts, side by side.

Both engines load the same seeded weights and decode greedily, so they must produce the same tokens; the
difference is the work. m01 pushes the whole sequence through the model for every token, m02 pushes the
prompt once (prefill) and then one token per step (decode), reading earlier keys and values from its cache.
"""

from __future__ import annotations

import torch

from milestones.m01_naive_loop import LLMEngine as NaiveLoopEngine
from milestones.common.demo import (Case, check_cases, demo_parser, engine_config, exit_on_bad_input, measure,
                                    parse_args, positive_int, print_speedup, print_table, random_prompts, same_tokens)
from milestones.m02_kv_cache import EngineConfig, LLMEngine, SamplingParams

COLUMNS = ["label", "requests", "prompt tokens", "output tokens", "wall s", "output tok/s", "TTFT p50 (ms)",
           "ms/token (mean ITL)", "tokens computed", "KV reserved peak (MiB)"]


def main(argv: list[str] | None = None) -> list[dict]:
    parser = demo_parser("m02: prefill once, decode against a K/V cache; compared with m01 on the same prompts.",
                         prog="python -m milestones.m02_kv_cache")
    parser.add_argument("--num-prompts", type=positive_int, default=2,
                        help="requests (they run one after another)")
    parser.add_argument("--prompt-len", type=positive_int, default=1024, help="tokens per prompt (random token ids)")
    parser.add_argument("--max-tokens", type=positive_int, default=16, help="tokens to generate per request")
    args = parse_args(parser, argv)

    with exit_on_bad_input(parser):
        config = engine_config(EngineConfig, args)
        engines = {"m01_naive_loop": NaiveLoopEngine(config), "m02_kv_cache": LLMEngine(config)}
        prompts = random_prompts(engines["m02_kv_cache"].vocab_size, args.num_prompts, args.prompt_len,
                                 args.prompt_len, args.seed)
        params = SamplingParams(max_tokens=args.max_tokens, ignore_eos=True)  # greedy, fixed length
        cases = [Case(label, engine, prompts, params) for label, engine in engines.items()]
        check_cases(cases)
    print(f"model {args.model!r} on {engines['m02_kv_cache'].device} in {engines['m02_kv_cache'].dtype}")

    rows = measure(cases, args.repeats)
    print_table(rows, f"{args.num_prompts} requests x {args.prompt_len}-token prompt -> {args.max_tokens} "
                      "tokens each (greedy)", COLUMNS)
    print()
    print_speedup(rows, "m01_naive_loop", "ms/token (mean ITL)", lower_is_better=True)
    print_speedup(rows, "m01_naive_loop", "output tok/s")
    print_speedup(rows, "m01_naive_loop", "tokens computed", lower_is_better=True)
    identical = same_tokens(rows)
    print(f"identical tokens (greedy): {'yes' if identical else 'NO'}")
    if not identical and engines["m02_kv_cache"].dtype != torch.float32:
        print("  in reduced precision the engines round differently (m01 multiplies whole sequences, m02 one "
              "token at a time), so a near-tie can flip a greedy token; in float32 they must match")
    return rows


if __name__ == "__main__":
    main()
