"""``python -m milestones.m09_server``: the engine offline, then the same engine behind its HTTP server.

The demo runs one engine twice on the same prompts: ``generate`` (offline: every request handed over at
once), then served on a loopback port to concurrent streaming clients (the official ``openai`` client, as
your code would use it). The table shows what the server adds: HTTP, JSON, SSE and the hop between the
engine thread and the event loop. It ends with a ``curl`` line for a server you start yourself.

``python -m milestones.m09_server serve --model ... --port ...`` starts that server (``milestones/common/
serve_cli.py``); a later milestone reuses both: its ``__main__`` calls ``main(argv, milestone="milestones.mNN_...")``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import importlib
import math
import secrets
import sys

from milestones.common.demo import (Case, check_cases, demo_parser, engine_config, exit_on_bad_input, measure,
                                    merge_rounds, parse_args, positive_int, positive_rate, print_table, random_prompts)
from milestones.common.latency import percentile_columns, request_latencies
from milestones.common.serve_cli import curl_example, serve
from milestones.common.stream_client import stream_all, table_row

COLUMNS = ["label", "requests", "output tokens", "wall s", "output tok/s", "TTFT p50 (ms)", "TTFT p99 (ms)",
           "ITL p50 (ms)", "ITL p99 (ms)", "E2E p50 (ms)", "E2E p99 (ms)"]


def main(argv: list[str] | None = None, milestone: str = "milestones.m09_server"):
    from .app import build_app

    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["serve"]:
        return serve(argv[1:], milestone, build_app)
    return demo(argv, milestone, build_app)


def demo(argv: list[str], milestone: str, build_app) -> list[dict]:
    import httpx

    from milestones.common.http_guards import ServerGuards
    from milestones.common.server_thread import ServerThread

    parser = demo_parser("The engine offline, then behind its OpenAI-compatible server with concurrent streaming "
                         "clients. `serve --help` for the server itself.", prog=f"python -m {milestone}")
    parser.add_argument("--num-requests", type=positive_int, default=16, help="requests, the same offline and served")
    parser.add_argument("--prompt-len", type=positive_int, default=32, help="tokens per prompt")
    parser.add_argument("--max-tokens", type=positive_int, default=16, help="tokens per answer")
    parser.add_argument("--max-num-seqs", type=positive_int, default=8, help="requests in the running batch")
    parser.add_argument("--max-model-len", type=positive_int, default=512, help="sizes the K/V cache")
    parser.add_argument("--rate", type=positive_rate, default=math.inf,
                        help="requests/s, Poisson arrivals (inf: all at once)")
    args = parse_args(parser, argv)

    package = importlib.import_module(milestone)
    fields = {f.name for f in dataclasses.fields(package.EngineConfig)}
    # Prefix caching off (where the engine has it): the server would find the offline run's prompts in the cache.
    knobs = {k: v for k, v in {"max_num_seqs": args.max_num_seqs, "max_model_len": args.max_model_len,
                               "enable_prefix_caching": False}.items() if k in fields}
    with exit_on_bad_input(parser):
        engine = package.LLMEngine(engine_config(package.EngineConfig, args, **knobs))
        prompts = random_prompts(engine.vocab_size, args.num_requests, args.prompt_len, args.prompt_len, args.seed)
        case = Case("offline generate", engine, prompts, package.SamplingParams(max_tokens=args.max_tokens,
                                                                                 ignore_eos=True))
        check_cases([case])
    print(f"model {args.model!r} on {engine.device} in {engine.dtype}; engine {engine.milestone}")
    if "enable_prefix_caching" in knobs:
        print("prefix caching off: the server gets the same prompts as the offline run and would find them cached")

    (offline,) = measure([case], args.repeats)
    for run in offline["_runs"]:  # each round's latency percentiles, then their medians, as measure does
        run.update(percentile_columns(request_latencies(run["_outputs"])))
    key = secrets.token_urlsafe(12)  # the server asks for one, as a server shared with a room should (--api-key)
    with ServerThread(build_app(engine, served_model_name="demo", guards=ServerGuards(api_keys=(key,)))) as server:
        refused = httpx.get(f"{server.url}/v1/models").status_code
        print(f"serving on {server.url}; /v1 asks for an API key: the clients pass it (OpenAI(api_key=...)), a "
              f"request without it gets {refused}")
        asyncio.run(stream_all(server.url, "demo", prompts[:1], 2, api_key=key))  # warm-up
        streams, wall = asyncio.run(stream_all(server.url, "demo", prompts, args.max_tokens, args.rate, args.seed,
                                               api_key=key))
    rows = [merge_rounds(offline["_runs"]), table_row(f"server, {args.num_requests} streams", streams, wall)]
    rate = "all at once" if math.isinf(args.rate) else f"Poisson arrivals at {args.rate:g}/s"
    print_table(rows, f"{args.num_requests} requests of {args.prompt_len} prompt tokens, {args.max_tokens} output "
                      f"tokens each, {args.max_num_seqs} in the batch; clients {rate}", COLUMNS)
    print("(served, a request also waits for a seat in the batch and for the step in flight)")
    same = [s.text for s in streams] == [o.text for o in offline["_outputs"]]
    print(f"server text identical to offline generate (greedy): {'yes' if same else 'NO'}")
    print(f"\nStart a server yourself:  python -m {milestone} serve --model {args.model} --port 8000")
    print(f"then:  {curl_example('http://127.0.0.1:8000', args.model)}")
    print("(shared with a room, --host 0.0.0.0: add --api-key KEY, or set VLLM_API_KEY, and send the key)")
    return rows


if __name__ == "__main__":
    main()
