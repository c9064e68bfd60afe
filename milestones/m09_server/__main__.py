"""``python -m milestones.m09_server``: the engine offline, then the same engine behind its HTTP server.

The demo runs one engine twice on the same prompts: ``generate`` (offline: every request handed over at
once) and then served on a loopback port, driven by concurrent streaming clients (the load client in
``load_client.py``). The table shows what the server adds: HTTP, JSON, SSE and the hop between the engine
thread and the event loop. It ends with a ``curl`` line for a server you start yourself.

``python -m milestones.m09_server serve --model ... --port ...`` starts that server (see ``cli.py``).
A later milestone reuses both: its ``__main__`` calls ``main(argv, milestone="milestones.mNN_...")``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import importlib
import math
import statistics
import sys

from milestones.m01_naive_loop.demo import (Case, check_cases, demo_parser, exit_on_bad_input, measure, parse_args,
                                            positive_int, positive_rate, print_table, random_prompts)
from milestones.m01_naive_loop.metrics import percentile

from .cli import curl_example, serve

COLUMNS = ["label", "requests", "output tokens", "wall s", "output tok/s", "TTFT p50 (ms)", "TTFT p99 (ms)",
           "ITL p50 (ms)", "ITL p99 (ms)", "E2E p50 (ms)", "E2E p99 (ms)"]


def main(argv: list[str] | None = None, milestone: str = "milestones.m09_server"):
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["serve"]:
        return serve(argv[1:], milestone)
    return demo(argv, milestone)


def demo(argv: list[str], milestone: str) -> list[dict]:
    from .app import build_app
    from .load_client import run_load, summarize
    from .server_thread import ServerThread

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
        engine = package.LLMEngine(package.EngineConfig(model=args.model, device=args.device, dtype=args.dtype,
                                                        seed=args.seed, **knobs))
        prompts = random_prompts(engine.vocab_size, args.num_requests, args.prompt_len, args.prompt_len, args.seed)
        params = package.SamplingParams(max_tokens=args.max_tokens, ignore_eos=True)
        case = Case("offline generate", engine, prompts, params)
        check_cases([case])
    print(f"model {args.model!r} on {engine.device} in {engine.dtype}; engine {engine.milestone}")
    if "enable_prefix_caching" in knobs:
        print("prefix caching off: the server gets the same prompts as the offline run and would find them cached")

    (offline,) = measure([case], args.repeats)
    with ServerThread(build_app(engine, served_model_name="demo")) as server:
        print(f"serving on {server.url}")
        asyncio.run(run_load(server.url, "demo", [(prompts[0], 2)], math.inf, progress=False))  # warm-up
        results, wall = asyncio.run(run_load(server.url, "demo", [(p, args.max_tokens) for p in prompts], args.rate,
                                             seed=args.seed, collect_text=True, desc="streams"))
    summary = summarize(results, wall)
    online = {"label": f"server, {args.num_requests} streams", "requests": summary["completed"],
              "output tokens": summary["output_tokens"], "wall s": wall,
              "output tok/s": summary["output_tokens_per_s"], "_results": results}
    for name, key in (("TTFT", "ttft"), ("ITL", "itl"), ("E2E", "e2e")):
        for q in (50, 99):
            value = summary[f"{key}_p{q}_s"]
            online[f"{name} p{q} (ms)"] = None if value is None else value * 1000
    rows = [with_percentiles(offline), online]
    rate = "all at once" if math.isinf(args.rate) else f"Poisson arrivals at {args.rate:g}/s"
    print_table(rows, f"{args.num_requests} requests of {args.prompt_len} prompt tokens, {args.max_tokens} output "
                      f"tokens each, {args.max_num_seqs} in the batch; clients {rate}", COLUMNS)
    print("(served, a request also waits for a seat in the batch and for the step in flight)")
    if summary["errors"]:
        print(f"errors: {summary['errors']}: {summary['error_samples']}")
    same = [r.text for r in results] == [o.text for o in offline["_outputs"]]
    print(f"server text identical to offline generate (greedy): {'yes' if same else 'NO'}")
    print(f"\nStart a server yourself:  python -m {milestone} serve --model {args.model} --port 8000")
    print(f"then:  {curl_example('http://127.0.0.1:8000', args.model)}")
    return rows


def with_percentiles(row: dict) -> dict:
    """An offline ``measure`` row with the same latency columns as the server's, from the engine's timestamps
    (each round's percentile, then the median over the rounds, as ``measure`` does for its own columns)."""
    per_round: dict[str, list[float]] = {}
    for run in row.get("_runs", [row]):
        metrics = [o.metrics for o in run["_outputs"]]
        columns = {"TTFT": [m.ttft for m in metrics if m.ttft is not None],
                   "ITL": [gap for m in metrics for gap in m.inter_token_latencies],
                   "E2E": [m.finish_time - m.arrival_time for m in metrics if m.finish_time is not None]}
        for name, values in columns.items():
            for q in (50, 99):
                value = percentile(values, q)
                if value is not None:
                    per_round.setdefault(f"{name} p{q} (ms)", []).append(value * 1000)
    for column in ("TTFT p50 (ms)", "TTFT p99 (ms)", "ITL p50 (ms)", "ITL p99 (ms)", "E2E p50 (ms)", "E2E p99 (ms)"):
        values = per_round.get(column)
        row[column] = statistics.median(values) if values else None
    return row


if __name__ == "__main__":
    main()
