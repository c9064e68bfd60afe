"""``python -m milestones.m13_quantization``: weights and K/V in fewer bytes; what it saves and what it costs.

For the unquantized engine (m12, the previous milestone, in the model's dtype) and for m13 with int8 weights,
int4 weights and an FP8 K/V cache, on the same prompts:

1. bytes: per weight (scales included), of the linear layers in all, per cached token of K/V;
2. the batch-1 decode step: one request generating ``--step-tokens`` tokens, ms per token (interleaved runs);
3. the logit error against the unquantized engine, teacher-forced along its greedy tokens (``accuracy.py``):
   relative RMS error, KL divergence, top-1 agreement.

On a GPU the matmuls run in m13's Triton kernels and the step times show the bytes saved. On a CPU the quantized
matmuls take the torch reference path (dequantize the weight, then ``F.linear``: more work, not less), so the
CPU step times show what the extra unpacking costs there, not a gain; the bytes and the logit errors are the
same on either device.

``python -m milestones.m13_quantization serve --quantization int4 --kv-cache-dtype fp8 ...`` starts m09's
OpenAI-compatible server over m13's engine (vLLM's flag names).
"""

from __future__ import annotations

import argparse
import sys

from milestones.common.demo import (Case, byte_size, check_cases, demo_parser, engine_config, exit_on_bad_input,
                                    measure, parse_args, positive_int, print_speedup, print_table, random_prompts)
from milestones.m12_async_scheduling import EngineConfig as PreviousConfig, LLMEngine as PreviousEngine
from milestones.m13_quantization import EngineConfig, LLMEngine, SamplingParams

from .accuracy import compare_logits
from .quantize import bytes_per_weight
from .quantized_loader import weight_bytes

MODES = {  # label -> m13's knobs
    "int8": {"quantization": "int8"},
    "int4": {"quantization": "int4"},
    "fp8-kv": {"kv_cache_dtype": "fp8"},
    "int4+fp8-kv": {"quantization": "int4", "kv_cache_dtype": "fp8"},
}
BYTES_COLUMNS = ["label", "bytes per weight", "linear layers (MiB)", "K/V bytes per token", "K/V tokens in budget"]
ERROR_COLUMNS = ["label", "ms/token (mean ITL)", "rel. RMS error", "KL mean (nats)", "KL max", "top-1 agreement"]
MiB = 2**20


def mode_list(text: str) -> list[str]:
    """argparse ``type=`` for ``"int8,int4"``: names from ``MODES``."""
    modes = [m.strip() for m in text.split(",") if m.strip()]
    unknown = [m for m in modes if m not in MODES]
    if not modes or unknown:
        raise argparse.ArgumentTypeError(f"expected modes from {', '.join(MODES)}, got {text!r}")
    return modes


def bytes_row(label: str, engine, quantization: str | None) -> dict:
    pool = engine.kv_pool
    return {"label": label, "bytes per weight": f"{bytes_per_weight(quantization, engine.dtype):.3g}",
            "linear layers (MiB)": weight_bytes(engine.model)["linear"] / MiB,
            "K/V bytes per token": engine.kv_bytes_per_token,
            "K/V tokens in budget": pool.num_blocks * pool.block_size}


def main(argv: list[str] | None = None):
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["serve"]:  # m09's server over this engine: --quantization, --kv-cache-dtype (vLLM's flags)
        from milestones.m09_server.__main__ import main as server_main

        return server_main(argv, milestone="milestones.m13_quantization")
    parser = demo_parser("m13: weights in int8/int4 and K/V in FP8 against the unquantized engine: bytes, the "
                         "batch-1 step, the logit error. `serve --help` for the server.",
                         prog="python -m milestones.m13_quantization")
    parser.add_argument("--modes", type=mode_list, default="int8,int4,fp8-kv",
                        help=f"comma-separated modes to compare with the unquantized engine ({', '.join(MODES)})")
    parser.add_argument("--num-prompts", type=positive_int, default=4, help="prompts for the logit comparison")
    parser.add_argument("--prompt-len", type=positive_int, default=16, help="tokens per prompt")
    parser.add_argument("--max-tokens", type=positive_int, default=8,
                        help="teacher-forced positions per prompt in the logit comparison")
    parser.add_argument("--step-tokens", type=positive_int, default=8,
                        help="tokens the single request generates for the batch-1 step time")
    parser.add_argument("--kv-cache-memory-bytes", type=byte_size, default="64M",
                        help="K/V bytes per engine (64M: 64 MiB), the same for all: FP8 fits twice the tokens in it")
    args = parse_args(parser, argv)
    modes = args.modes if isinstance(args.modes, list) else mode_list(args.modes)

    with exit_on_bad_input(parser):
        knobs = {"max_num_seqs": max(args.num_prompts, 1), "kv_cache_memory_bytes": args.kv_cache_memory_bytes}
        previous = PreviousEngine(engine_config(PreviousConfig, args, **knobs))
        engines = {mode: LLMEngine(engine_config(EngineConfig, args, **knobs, **MODES[mode])) for mode in modes}
        prompts = random_prompts(previous.vocab_size, args.num_prompts, args.prompt_len, args.prompt_len, args.seed)
        single = prompts[:1]
        params = SamplingParams(max_tokens=args.step_tokens, ignore_eos=True)
        base_label = f"{previous.milestone} ({str(previous.dtype).removeprefix('torch.')})"
        cases = [Case(base_label, previous, single, params)]
        cases += [Case(f"m13 {mode}", engines[mode], single, params) for mode in modes]
        check_cases(cases)
        check_cases([Case(c.label, c.engine, prompts, SamplingParams(max_tokens=args.max_tokens)) for c in cases])
    print(f"model {args.model!r} on {previous.device} in {previous.dtype}")
    for mode, engine in engines.items():
        print(f"m13 {mode}: {engine.describe_weights()}")
    if previous.device.type != "cuda":
        print("(on a CPU the quantized matmuls take the torch reference path: dequantize, then F.linear)")

    rows = [bytes_row(base_label, previous, None)]
    rows += [bytes_row(f"m13 {mode}", engines[mode], MODES[mode].get("quantization")) for mode in modes]
    print_table(rows, f"bytes: weights and K/V ({args.kv_cache_memory_bytes / 2**20:g} MiB of K/V per engine)",
                BYTES_COLUMNS)

    timed = measure(cases, args.repeats)
    errors = compare_logits(previous, {f"m13 {mode}": engines[mode] for mode in modes}, prompts, args.max_tokens)
    for row in timed:
        error = errors.get(row["label"])
        if error is not None:
            row.update({"rel. RMS error": f"{error.rel_rms:.3g}", "KL mean (nats)": f"{error.kl_mean:.2e}",
                        "KL max": f"{error.kl_max:.2e}", "top-1 agreement": f"{error.top1_agreement:.0%}"})
    print_table(timed, f"batch-1 decode ({args.step_tokens} tokens) and the logit error over "
                       f"{next(iter(errors.values())).positions} teacher-forced positions", ERROR_COLUMNS)
    print()
    print_speedup(timed, base_label, "ms/token (mean ITL)", lower_is_better=True)
    base_tokens = [o.token_ids for o in timed[0]["_outputs"]]
    same = {row["label"]: [o.token_ids for o in row["_outputs"]] == base_tokens for row in timed[1:]}
    print("greedy tokens identical to the unquantized engine's: "
          + ", ".join(f"{label.removeprefix('m13 ')} {'yes' if ok else 'no'}" for label, ok in same.items())
          + " (a lossy engine may flip a near-tie; the logit error says by how much it moved)")
    if previous.device.type != "cuda":
        print("(CPU: a quantized step does more work here, not less; on a GPU it reads fewer bytes)")
    return timed


if __name__ == "__main__":
    main()
