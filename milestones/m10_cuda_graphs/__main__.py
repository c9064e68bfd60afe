"""``python -m milestones.m10_cuda_graphs``: a decode step launched eagerly against replayed from a CUDA graph.

1. Per batch size of the ladder: the same decode forward pass (contexts of ``--context`` tokens), launched from
   Python kernel by kernel, and replayed from the graph captured at start. On a GPU the eager step costs about
   the same at every batch size (launches), the replayed one what its work costs.
2. End to end: m09 (eager) against m10 on the same decode-heavy requests, greedy tokens compared.

``python -m milestones.m10_cuda_graphs serve ...`` starts m09's OpenAI-compatible server over m10's engine.
Without a GPU there are no graphs: the demo says so and compares the engines eagerly (m10's packed layers).
"""

from __future__ import annotations

import sys

import torch

from milestones.common.demo import (Case, check_cases, cuda_median_ms, demo_parser, engine_config, exit_on_bad_input,
                                    measure, parse_args, positive_int, print_speedup, print_table, random_prompts,
                                    same_tokens)
from milestones.m09_server import LLMEngine as ServerEngine
from milestones.m10_cuda_graphs import EngineConfig, LLMEngine, SamplingParams

from .graph_runner import CUDAGraphRunner

STEP_COLUMNS = ["batch", "eager step (ms)", "graph replay (ms)", "speed-up"]
E2E_COLUMNS = ["label", "requests", "output tokens", "wall s", "output tok/s", "ms/token (mean ITL)"]


def step_rows(engine: LLMEngine, context: int, repeats: int) -> list[dict]:
    """Eager against replayed decode steps at every captured batch size, on blocks 0.. of the cache."""
    runner: CUDAGraphRunner = engine.graph_runner
    block_size = engine.config.block_size
    blocks = -(-context // block_size)
    rows = []
    for size in runner.ladder:
        if size * blocks > engine.kv_pool.num_blocks:
            break
        runner.context_lens[:size] = context
        runner.slot_mapping[:size] = -1  # timing only: write nothing
        runner.block_tables[:size, :blocks] = torch.arange(size * blocks, device=engine.device,
                                                           dtype=torch.int32).view(size, blocks)
        with torch.inference_mode():
            eager = cuda_median_ms(lambda: runner.forward(size), repeats)
        replayed = cuda_median_ms(lambda: runner.run(size), repeats)
        rows.append({"batch": size, "eager step (ms)": eager, "graph replay (ms)": replayed,
                     "speed-up": f"{eager / replayed:.1f}x"})
    return rows


def main(argv: list[str] | None = None):
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["serve"]:
        from milestones.m09_server.__main__ import main as server_main

        return server_main(argv, milestone="milestones.m10_cuda_graphs")
    parser = demo_parser("m10: decode steps replayed from CUDA graphs; eager against replayed per batch size, "
                         "then m09 against m10 end to end. `serve --help` for the server.",
                         prog="python -m milestones.m10_cuda_graphs")
    parser.add_argument("--max-num-seqs", type=positive_int, default=64, help="largest batch (and graph) size")
    parser.add_argument("--context", type=positive_int, default=512, help="keys per sequence in the step-time table")
    parser.add_argument("--step-repeats", type=positive_int, default=20, help="timed steps per batch size")
    parser.add_argument("--num-prompts", type=positive_int, default=16, help="requests for the end-to-end comparison")
    parser.add_argument("--prompt-len", type=positive_int, default=128, help="tokens per prompt")
    parser.add_argument("--max-tokens", type=positive_int, default=32, help="tokens to generate per request")
    args = parse_args(parser, argv)

    with exit_on_bad_input(parser):
        m10 = LLMEngine(engine_config(EngineConfig, args, max_num_seqs=args.max_num_seqs))
        m09 = ServerEngine(engine_config(EngineConfig, args, max_num_seqs=args.max_num_seqs))
        prompts = random_prompts(m10.vocab_size, args.num_prompts, args.prompt_len, args.prompt_len, args.seed)
        params = SamplingParams(max_tokens=args.max_tokens, ignore_eos=True)
        cases = [Case("m09_server (eager)", m09, prompts, params), Case("m10_cuda_graphs", m10, prompts, params)]
        check_cases(cases)
    print(f"model {args.model!r} on {m10.device} in {m10.dtype}")
    print(m10.describe_kv_cache())
    print(m10.describe_cuda_graphs())
    if m10.graph_runner is not None:
        print_table(step_rows(m10, args.context, args.step_repeats),
                    f"one decode step, {args.context} keys per sequence: launched eagerly vs replayed", STEP_COLUMNS)

    rows = measure(cases, args.repeats)
    print_table(rows, f"{args.num_prompts} requests x {args.prompt_len}-token prompts -> {args.max_tokens} tokens",
                E2E_COLUMNS)
    print()
    print_speedup(rows, "m09_server (eager)", "output tok/s")
    print(f"graph steps {rows[1]['_stats'].graph_steps}, eager steps {rows[1]['_stats'].eager_steps} (one run)")
    identical = same_tokens(rows)
    print(f"identical tokens (greedy): {'yes' if identical else 'NO'}")
    if not identical and m10.dtype != torch.float32:
        print("  (in bf16 m10's packed matmuls round differently from m09's separate ones, so a near-tie can flip; "
              "in float32 they must match)")
    return rows


if __name__ == "__main__":
    main()
