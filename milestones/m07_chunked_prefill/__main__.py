"""``python -m milestones.m07_chunked_prefill``: running decoders while long prompts arrive, m06 against m07.

A few short requests are decoding when long prompts arrive one by one. m06 prefills each long prompt in one
step, and every decoder waits for that whole step: its inter-token latency (ITL) spikes. m07 feeds at most
``max_num_batched_tokens`` new tokens per step, decodes first, so a long prompt is spread over many steps that
each carry every decoder's next token. The table sweeps the budget: the decoders' worst ITL falls with it,
while their median barely moves; the long prompts' own first token comes a little later.
"""

from __future__ import annotations

import time
from functools import partial

from milestones.common.demo import (Case, check_cases, demo_parser, engine_config, exit_on_bad_input,
                                    interleaved_rounds, parse_args, positive_int, positive_int_list, print_speedup,
                                    print_table, random_prompts)
from milestones.common.latency import summarize
from milestones.m06_prefix_cache import LLMEngine as PrefixCacheEngine
from milestones.m07_chunked_prefill import EngineConfig, LLMEngine, SamplingParams

COLUMNS = ["label", "decoder ITL p50 (ms)", "decoder ITL p99 (ms)", "decoder ITL max (ms)",
           "long-prompt TTFT p50 (ms)", "steps", "wall s"]


def run_with_arrivals(engine, decoders: list[list[int]], longs: list[list[int]], decoder_tokens: int,
                      every: int, label: str) -> dict:
    """Start the decoders, then add long prompt ``k`` after ``every * (k + 1)`` steps; return one table row."""
    engine.generate([decoders[0][:16]], SamplingParams(max_tokens=2, ignore_eos=True), use_tqdm=False)  # warm-up
    engine.reset_prefix_cache()  # a repeat would otherwise find the long prompts cached by the run before
    engine.stats = engine.new_stats()
    decoder_params = SamplingParams(max_tokens=decoder_tokens, ignore_eos=True)
    long_params = SamplingParams(max_tokens=4, ignore_eos=True)
    start = time.perf_counter()
    decoder_ids = [engine.add_request(p, decoder_params) for p in decoders]
    long_ids, pending, latest, steps = [], list(longs), {}, 0
    while pending or engine.has_unfinished():
        if pending and (steps >= every * (len(long_ids) + 1) or not engine.has_unfinished()):
            long_ids.append(engine.add_request(pending.pop(0), long_params))
        for out in engine.step():
            latest[out.request_id] = out
        steps += 1
    wall = time.perf_counter() - start
    decoders_summary = summarize([latest[i] for i in decoder_ids], wall)
    longs_summary = summarize([latest[i] for i in long_ids], wall)
    return {"label": label,
            "decoder ITL p50 (ms)": decoders_summary["itl_p50_s"] * 1000,
            "decoder ITL p99 (ms)": decoders_summary["itl_p99_s"] * 1000,
            "decoder ITL max (ms)": decoders_summary["itl_max_s"] * 1000,
            "long-prompt TTFT p50 (ms)": longs_summary["ttft_p50_s"] * 1000,
            "steps": engine.stats.steps, "wall s": wall,
            "_outputs": [latest[i] for i in decoder_ids + long_ids]}


def main(argv: list[str] | None = None) -> list[dict]:
    parser = demo_parser("m07: chunked prefill; decoder latency while long prompts arrive, m06 against m07 "
                         "at several token budgets.", prog="python -m milestones.m07_chunked_prefill")
    parser.add_argument("--num-decoders", type=positive_int, default=8, help="short requests decoding throughout")
    parser.add_argument("--decoder-tokens", type=positive_int, default=48, help="tokens each decoder generates")
    parser.add_argument("--num-long", type=positive_int, default=3, help="long prompts arriving mid-decode")
    parser.add_argument("--long-len", type=positive_int, default=3072, help="tokens per long prompt")
    parser.add_argument("--every", type=positive_int, default=10, help="a long prompt arrives every this many steps")
    parser.add_argument("--budgets", type=positive_int_list, default="1024,256",
                        help="comma-separated max_num_batched_tokens values for m07")
    args = parse_args(parser, argv)

    config = dict(max_num_seqs=args.num_decoders + args.num_long)
    with exit_on_bad_input(parser):
        engines = {"m06 (whole prompts)": PrefixCacheEngine(engine_config(EngineConfig, args,
                                                                          max_num_batched_tokens=None, **config))}
        for budget in args.budgets:
            engines[f"m07 budget {budget}"] = LLMEngine(engine_config(EngineConfig, args,
                                                                      max_num_batched_tokens=budget, **config))
        first = next(iter(engines.values()))
        decoders = random_prompts(first.vocab_size, args.num_decoders, 32, 32, args.seed)
        longs = random_prompts(first.vocab_size, args.num_long, args.long_len, args.long_len, args.seed + 1)
        check_cases([Case(f"{label}, decoders", engine, decoders, SamplingParams(max_tokens=args.decoder_tokens))
                     for label, engine in engines.items()] +
                    [Case(f"{label}, long prompts", engine, longs, SamplingParams(max_tokens=4))
                     for label, engine in engines.items()])
    print(f"model {args.model!r} on {first.device} in {first.dtype}")

    rows = interleaved_rounds([partial(run_with_arrivals, engine, decoders, longs, args.decoder_tokens, args.every,
                                       label) for label, engine in engines.items()], args.repeats)
    print_table(rows, f"{args.num_decoders} decoders x {args.decoder_tokens} tokens while {args.num_long} prompts of "
                      f"{args.long_len} tokens arrive, one every {args.every} steps", COLUMNS)
    print()
    base = rows[0]["label"]
    print_speedup(rows, base, "decoder ITL max (ms)", lower_is_better=True)
    print_speedup(rows, base, "decoder ITL p50 (ms)")
    same = all([o.token_ids for o in row["_outputs"]] == [o.token_ids for o in rows[0]["_outputs"]] for row in rows)
    print(f"identical tokens (greedy): {'yes' if same else 'NO'}")
    return rows


if __name__ == "__main__":
    main()
