"""``python -m milestones.m11_engine_core``: one burst of streaming requests, served by m10's server (engine in a
thread of the server's process) and by m11's (engine in a process of its own), interleaved, side by side.

Both serve the same prompts with the same engine settings; the table shows output tokens/s and time to first
token at the clients, and whether both returned the same text. ``serve`` starts m11's server (m09's flags).
On a CPU with the tiny model the engine's steps are cheap, so the server's own Python is a large share of the
time: the split shows there too, though the clients run in the demo's own process (beside both servers, which
run in threads of it) and two cores shared by everything blur it.
"""

from __future__ import annotations

import asyncio
import importlib
import sys

from milestones.common.demo import (demo_parser, exit_on_bad_input, interleaved_rounds, parse_args, positive_int,
                                    print_speedup, print_table, random_prompts)
from milestones.common.server_thread import ServerThread
from milestones.common.stream_client import stream_all, table_row
from milestones.m09_server.__main__ import main as serve_or_demo
from milestones.m09_server.app import build_app

MILESTONE = "milestones.m11_engine_core"
COLUMNS = ["label", "requests", "output tokens", "wall s", "output tok/s", "TTFT p50 (ms)", "TTFT p99 (ms)"]


def main(argv: list[str] | None = None):
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["serve"]:
        return serve_or_demo(argv, milestone=MILESTONE)
    return demo(argv)


def demo(argv: list[str]) -> list[dict]:
    parser = demo_parser("The same burst of streaming requests served by m10's server (engine thread) and by "
                         "m11's (engine core process), interleaved. `serve --help` for the server itself.",
                         prog=f"python -m {MILESTONE}")
    parser.add_argument("--num-requests", type=positive_int, default=32, help="streams sent all at once")
    parser.add_argument("--prompt-len", type=positive_int, default=16, help="tokens per prompt")
    parser.add_argument("--max-tokens", type=positive_int, default=32, help="tokens per answer")
    parser.add_argument("--max-num-seqs", type=positive_int, default=32, help="requests in the running batch")
    args = parse_args(parser, argv)

    knobs = dict(model=args.model, device=args.device, dtype=args.dtype, seed=args.seed,
                 max_num_seqs=args.max_num_seqs, max_model_len=args.prompt_len + args.max_tokens + 8,
                 enable_prefix_caching=False)  # every round sends the same prompts: no cache hits across rounds
    m10, m11 = importlib.import_module("milestones.m10_cuda_graphs"), importlib.import_module(MILESTONE)
    with exit_on_bad_input(parser):
        thread_client = m10.LLMEngine.make_engine_client(m10.EngineConfig(**knobs))
        core_client = m11.LLMEngine.make_engine_client(m11.EngineConfig(**knobs))
    for line in core_client.describe():
        print(line)
    prompts = random_prompts(thread_client.engine.vocab_size, args.num_requests, args.prompt_len,
                             args.prompt_len, args.seed)
    with ServerThread(build_app(thread_client, served_model_name="demo")) as m10_server, \
            ServerThread(build_app(core_client, served_model_name="demo")) as m11_server:
        servers = {"m10 server (engine thread)": m10_server, "m11 server (engine core process)": m11_server}
        for server in servers.values():  # warm-up: first steps, first requests
            asyncio.run(stream_all(server.url, "demo", prompts[:2], args.max_tokens))
        texts: dict[str, list[str]] = {}

        def burst(label: str):
            def run() -> dict:
                streams, wall = asyncio.run(stream_all(servers[label].url, "demo", prompts, args.max_tokens))
                texts.setdefault(label, [s.text for s in streams])
                return table_row(label, streams, wall)
            return run

        rows = interleaved_rounds([burst(label) for label in servers], args.repeats)
    print_table(rows, f"{args.num_requests} streams at once, {args.prompt_len} prompt tokens, {args.max_tokens} "
                      f"output tokens each; medians of {args.repeats} interleaved rounds", COLUMNS)
    print_speedup(rows, "m10 server (engine thread)", "output tok/s")
    same = len(set(map(tuple, texts.values()))) == 1
    print(f"same text from both servers (greedy): {'yes' if same else 'NO'}")
    print(f"\nStart m11's server yourself:  python -m {MILESTONE} serve --model {args.model} --port 8000")
    return rows


if __name__ == "__main__":
    main()
