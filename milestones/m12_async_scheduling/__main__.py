"""``python -m milestones.m12_async_scheduling``: where a decode step's time goes, with and without overlap.

1. **One step's timeline.** The same decode-heavy batch through m12 with ``async_scheduling`` off (m11's turn
   taking) and on: per step, the host's own work (plan, pack, launch, read back, outputs), the time it sat
   waiting for the GPU, and the wall time. Off, a step costs host work + GPU work; on, the larger of the two.
2. **End to end**, interleaved: output tokens/s of both on the same requests, and whether their tokens agree.

On a CPU the "GPU" is the same cores that run the host's Python: there is nothing to overlap with, so both rows
cost about the same; the timeline says so. On a GPU the waiting column is where m12's gain comes from.
``serve`` starts m09's server over m12's engine in m11's engine core process.
"""

from __future__ import annotations

import statistics
import sys
import time

import torch

from milestones.common.demo import (Case, demo_parser, engine_config, exit_on_bad_input, measure,
                                    parse_args, positive_int, print_speedup, print_table, random_prompts, same_tokens)

from . import EngineConfig, LLMEngine, SamplingParams
from .in_flight import InFlightStep

MILESTONE = "milestones.m12_async_scheduling"
TIMELINE_COLUMNS = ["label", "running", "host work (ms/step)", "waiting for the GPU (ms/step)", "wall (ms/step)"]
E2E_COLUMNS = ["label", "requests", "output tokens", "wall s", "output tok/s"]


class WaitClock:
    """Time spent blocked on the GPU: the sampled ids' read-back (m11's ``.tolist()``, m12's ``token_ids``)."""

    def __init__(self, engine: LLMEngine) -> None:
        self.engine, self.waited = engine, 0.0
        sampler_call, token_ids = type(engine.sampler).__call__, InFlightStep.token_ids

        def timed(function):
            def wrapper(*args, **kwargs):
                began = time.perf_counter()
                try:
                    return function(*args, **kwargs)
                finally:
                    self.waited += time.perf_counter() - began
            return wrapper

        self.patches = [(type(engine.sampler), "__call__", sampler_call, timed(sampler_call)),
                        (InFlightStep, "token_ids", token_ids, timed(token_ids))]

    def __enter__(self) -> WaitClock:
        for owner, name, _, patched in self.patches:
            setattr(owner, name, patched)
        return self

    def __exit__(self, *exc) -> None:
        for owner, name, original, _ in self.patches:
            setattr(owner, name, original)


def timeline_row(label: str, engine: LLMEngine, prompts: list, params: SamplingParams, steps: int) -> dict:
    """Admit every prompt, let the prefills pass, then time ``steps`` decode steps."""
    for prompt in prompts:
        engine.add_request(prompt, params)
    with torch.inference_mode():
        while engine.scheduler.waiting or any(s.num_uncomputed_tokens > 1 for s in engine.scheduler.running):
            engine.engine_step()
        running = len(engine.scheduler.running)
        if engine.device.type == "cuda":
            torch.cuda.synchronize(engine.device)
        with WaitClock(engine) as clock:
            began = time.perf_counter()
            for _ in range(steps):
                engine.engine_step()
            if engine.device.type == "cuda":
                torch.cuda.synchronize(engine.device)
            wall = time.perf_counter() - began
        for seq in [*engine.scheduler.running, *engine.scheduler.waiting]:
            engine.abort(seq.request_id)
        while engine.has_unfinished():
            engine.engine_step()
    waited = clock.waited if engine.device.type == "cuda" else 0.0  # on a CPU the read-back computes, not waits
    return {"label": label, "running": running, "host work (ms/step)": (wall - waited) / steps * 1e3,
            "waiting for the GPU (ms/step)": waited / steps * 1e3 if engine.device.type == "cuda" else None,
            "wall (ms/step)": wall / steps * 1e3}


def main(argv: list[str] | None = None):
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["serve"]:
        from milestones.m09_server.__main__ import main as server_main

        return server_main(argv, milestone=MILESTONE)
    parser = demo_parser("m12: the host plans step N+1 while the GPU runs step N. A decode step's timeline with "
                         "and without overlap, then end to end. `serve --help` for the server.",
                         prog=f"python -m {MILESTONE}")
    parser.add_argument("--num-requests", type=positive_int, default=32, help="requests decoding together")
    parser.add_argument("--prompt-len", type=positive_int, default=16, help="tokens per prompt")
    parser.add_argument("--max-tokens", type=positive_int, default=48, help="tokens per answer")
    parser.add_argument("--timeline-steps", type=positive_int, default=16, help="decode steps timed in part 1")
    args = parse_args(parser, argv)
    if args.timeline_steps >= args.max_tokens:
        parser.error(f"--timeline-steps ({args.timeline_steps}) must be below --max-tokens ({args.max_tokens})")
    knobs = dict(max_num_seqs=args.num_requests, max_model_len=args.prompt_len + args.max_tokens + 8,
                 enable_prefix_caching=False)
    with exit_on_bad_input(parser):
        engines = {"m11's turns (async_scheduling off)": LLMEngine(engine_config(EngineConfig, args,
                                                                                 async_scheduling=False, **knobs)),
                   "m12 (async_scheduling on)": LLMEngine(engine_config(EngineConfig, args, **knobs))}
        prompts = random_prompts(next(iter(engines.values())).vocab_size, args.num_requests, args.prompt_len,
                                 args.prompt_len, args.seed)
        params = SamplingParams(max_tokens=args.max_tokens, ignore_eos=True)
        cases = [Case(label, engine, prompts, params) for label, engine in engines.items()]
    device = cases[0].engine.device
    print(f"model {args.model!r} on {device} in {cases[0].engine.dtype}; {args.num_requests} requests decoding")
    rows = [timeline_row(label, engine, prompts, params, args.timeline_steps) for label, engine in engines.items()]
    rows = [{**row, **{k: statistics.median([row[k], again[k]]) for k in TIMELINE_COLUMNS[2:] if row[k] is not None}}
            for row, again in zip(rows, [timeline_row(label, engine, prompts, params, args.timeline_steps)
                                         for label, engine in engines.items()])]
    print_table(rows, f"1. One decode step, {args.timeline_steps} steps timed (median of 2 runs each)",
                TIMELINE_COLUMNS)
    if device.type != "cuda":
        print("On a CPU the model runs on the host's own cores while the host 'launches' it: nothing waits, so "
              "nothing can overlap. On a GPU, m11's waiting column is what m12 hides behind the next step.")
    e2e = measure(cases, args.repeats)
    print_table(e2e, f"2. End to end: {args.num_requests} requests, {args.prompt_len} prompt tokens, "
                     f"{args.max_tokens} output tokens each", E2E_COLUMNS)
    print_speedup(e2e, cases[0].label, "output tok/s")
    print(f"same tokens: {'yes' if same_tokens(e2e) else 'NO'}")
    return rows + e2e


if __name__ == "__main__":
    main()
