"""``python -m milestones.m01_naive_loop``: generate some text, then watch per-token latency grow with length.

m01 re-runs the whole sequence for every new token, so a token costs more the longer the sequence already
is. The table runs one request at several prompt lengths and shows the mean time per output token rising
with the prompt, and the tokens computed growing like ``max_tokens * (prompt + max_tokens)``.
"""

from __future__ import annotations

from milestones.m01_naive_loop import EngineConfig, LLMEngine, SamplingParams
from milestones.common.demo import (Case, check_cases, demo_parser, engine_config, exit_on_bad_input, measure,
                                    parse_args, positive_int, positive_int_list, print_speedup, print_table,
                                    random_prompts)
from milestones.m01_naive_loop.loader import PRESETS

TEXT_PROMPTS = ["The capital of France is", "A KV cache makes decoding faster because"]
COLUMNS = ["label", "prompt tokens", "output tokens", "wall s", "TTFT p50 (ms)", "ms/token (mean ITL)",
           "tokens computed"]


def main(argv: list[str] | None = None) -> list[dict]:
    parser = demo_parser("m01: the naive loop. Text generation, then per-token latency at growing prompt lengths.",
                         prog="python -m milestones.m01_naive_loop")
    parser.add_argument("--max-tokens", type=positive_int, default=16, help="tokens to generate per request")
    parser.add_argument("--prompt-lens", type=positive_int_list, default="32,256,1024",
                        help="comma-separated prompt lengths (random token ids) for the latency table")
    args = parse_args(parser, argv)
    text_params = SamplingParams(max_tokens=args.max_tokens)
    params = SamplingParams(max_tokens=args.max_tokens, ignore_eos=True)

    with exit_on_bad_input(parser):
        engine = LLMEngine(engine_config(EngineConfig, args))
        cases = [Case(f"prompt {n}", engine, random_prompts(engine.vocab_size, 1, n, n, args.seed), params)
                 for n in args.prompt_lens]
        check_cases([Case("text prompts", engine, TEXT_PROMPTS, text_params), *cases])
    print(f"m01_naive_loop: model {args.model!r} on {engine.device} in {engine.dtype}")

    # 1. Text in, text out, through the real Qwen3 tokenizer.
    outputs = engine.generate(TEXT_PROMPTS, text_params)
    if args.model in PRESETS:
        print(f"(the {args.model!r} preset has random weights, so the text below is noise; "
              "pass --model Qwen/Qwen3-0.6B for real text)")
    for output in outputs:
        print(f"\nprompt:    {output.prompt!r}\ngenerated: {output.text!r}  "
              f"[{len(output.token_ids)} tokens, finish: {output.finish_reason}]")

    # 2. The same-shaped request at growing prompt lengths: every token re-reads the whole sequence.
    rows = measure(cases, args.repeats)
    print_table(rows, f"m01: one request, {args.max_tokens} output tokens, at {len(rows)} prompt lengths", COLUMNS)
    if len(rows) > 1:
        first, last = rows[0], rows[-1]
        print(f"\nfrom {first['label']} to {last['label']}: tokens computed "
              f"{last['tokens computed'] / first['tokens computed']:.1f}x")
        # Ratios of the later rows' ms/token to the first row's, within each round (None at max_tokens 1).
        print_speedup([last, first], first["label"], "ms/token (mean ITL)")
        print("m01 pushes the whole sequence through the model for every new token; m02 caches K/V instead.")
    return rows


if __name__ == "__main__":
    main()
