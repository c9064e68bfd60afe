"""``python -m milestones.m01_naive_loop``: generate some text, then watch per-token latency grow with length.

m01 re-runs the whole sequence for every new token, so a token costs more the longer the sequence already
is. The table runs one request at several prompt lengths and shows the mean time per output token rising
with the prompt, and the tokens computed growing like ``max_tokens * (prompt + max_tokens)``.
"""

from __future__ import annotations

from milestones.m01_naive_loop import EngineConfig, LLMEngine, SamplingParams
from milestones.m01_naive_loop.demo import demo_parser, engine_config, measure, print_table, random_prompts
from milestones.m01_naive_loop.loader import PRESETS

TEXT_PROMPTS = ["The capital of France is", "A KV cache makes decoding faster because"]
COLUMNS = ["label", "prompt tokens", "output tokens", "wall s", "TTFT p50 (ms)", "ms/token (mean ITL)",
           "tokens computed"]


def main(argv: list[str] | None = None) -> list[dict]:
    parser = demo_parser("m01: the naive loop. Text generation, then per-token latency at growing prompt lengths.",
                         prog="python -m milestones.m01_naive_loop")
    parser.add_argument("--max-tokens", type=int, default=32, help="tokens to generate per request")
    parser.add_argument("--prompt-lens", default="32,256,1024",
                        help="comma-separated prompt lengths (random token ids) for the latency table")
    args = parser.parse_args(argv)
    prompt_lens = [int(n) for n in args.prompt_lens.split(",")]

    engine = LLMEngine(engine_config(EngineConfig, args))
    print(f"m01_naive_loop: model {args.model!r} on {engine.device} in {engine.dtype}")

    # 1. Text in, text out, through the real Qwen3 tokenizer.
    outputs = engine.generate(TEXT_PROMPTS, SamplingParams(max_tokens=args.max_tokens))
    if args.model in PRESETS:
        print(f"(the {args.model!r} preset has random weights, so the text below is noise; "
              "pass --model Qwen/Qwen3-0.6B for real text)")
    for output in outputs:
        print(f"\nprompt:    {output.prompt!r}\ngenerated: {output.text!r}  "
              f"[{len(output.token_ids)} tokens, finish: {output.finish_reason}]")

    # 2. The same-shaped request at growing prompt lengths: every token re-reads the whole sequence.
    params = SamplingParams(max_tokens=args.max_tokens, ignore_eos=True)
    rows = [measure(engine, random_prompts(engine.vocab_size, 1, n, n, args.seed), params, f"prompt {n}")
            for n in prompt_lens]
    print_table(rows, f"m01: one request, {args.max_tokens} output tokens, at {len(rows)} prompt lengths",
                COLUMNS)
    first, last = rows[0], rows[-1]
    if len(rows) > 1 and first["ms/token (mean ITL)"] and last["ms/token (mean ITL)"]:  # None at max_tokens 1
        print(f"\nfrom prompt {prompt_lens[0]} to prompt {prompt_lens[-1]}: tokens computed "
              f"{last['tokens computed'] / first['tokens computed']:.1f}x, per-token latency "
              f"{last['ms/token (mean ITL)'] / first['ms/token (mean ITL)']:.1f}x.")
        print("m01 pushes the whole sequence through the model for every new token; m02 caches K/V instead.")
    return rows


if __name__ == "__main__":
    main()
