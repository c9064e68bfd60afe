"""``python -m milestones.m08_triton_kernel``: the paged decode kernel against m05's gather path, then end to end.

1. One attention layer of a decode step at the model's shape, for a few batch sizes and context lengths: the
   gather path (copy every sequence's K/V out of the blocks, then SDPA) against the Triton kernel (read the
   blocks in place), with the largest difference between their outputs.
2. m07 (torch attention) against m08 (``--attention-backend``, auto by default) on the same decode-heavy
   requests: output tokens/s and whether the greedy tokens are identical.

On a GPU both parts show the kernel's gain. On a CPU the kernel runs in Triton's interpreter: exact but very
slow, so part 1 then checks the outputs agree and part 2 runs m08 on its torch path (what ``auto`` picks on a
CPU; ``--attention-backend triton`` runs the kernel there too).
"""

from __future__ import annotations

import argparse

import numpy as np
import torch

from milestones.common.demo import (Case, check_cases, cuda_median_ms, demo_parser, engine_config, exit_on_bad_input,
                                    measure, parse_args, positive_int, print_speedup, print_table, random_prompts,
                                    same_tokens)
from milestones.m05_paged_blocks.paged_attention import AttentionMetadata, GatherIndices, PagedKVCache
from milestones.m07_chunked_prefill import LLMEngine as ChunkedPrefillEngine
from milestones.m08_triton_kernel import EngineConfig, LLMEngine, SamplingParams
from milestones.m08_triton_kernel.engine import triton_unavailable_reason

KERNEL_COLUMNS = ["batch x context", "gather + SDPA (ms)", "Triton kernel (ms)", "speed-up", "max abs diff"]
E2E_COLUMNS = ["label", "requests", "output tokens", "wall s", "output tok/s", "ms/token (mean ITL)"]


def batch_x_context_list(text: str) -> list[tuple[int, int]]:
    """argparse ``type=`` for ``"1x512,16x512"``: (batch, context) pairs of positive integers."""
    try:
        shapes = [tuple(positive_int(x) for x in shape.split("x")) for shape in text.split(",")]
    except argparse.ArgumentTypeError:
        shapes = []
    if not shapes or any(len(shape) != 2 for shape in shapes):
        raise argparse.ArgumentTypeError(f"expected BATCHxCONTEXT pairs such as 1x512,16x512, got {text!r}")
    return shapes


def kernel_row(engine, batch: int, context: int, repeats: int, seed: int) -> dict:
    """One decode layer on random paged K/V: the gather path against the kernel."""
    from .paged_decode_kernel import paged_decode_attention

    config, device, dtype, block_size = engine.model_config, engine.device, engine.dtype, engine.config.block_size
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    blocks_per_seq = -(-context // block_size)
    generator = torch.Generator().manual_seed(seed)
    cache = PagedKVCache(1, batch * blocks_per_seq, block_size, kv_heads, dim, dtype, device)
    cache.k.copy_(torch.randn(cache.k.shape, generator=generator))
    cache.v.copy_(torch.randn(cache.v.shape, generator=generator))
    order = torch.randperm(batch * blocks_per_seq, generator=generator).view(batch, blocks_per_seq)  # scattered
    tables = order.numpy().astype(np.int32)
    q = torch.randn((batch, heads, dim), generator=generator).to(device, dtype)
    metadata = AttentionMetadata.build([1] * batch, [context] * batch, [context - 1] * batch,
                                       [0] * batch, tables, block_size, device)
    gather = GatherIndices(metadata)
    k_blocks, v_blocks = cache.block_view(0)

    def torch_path() -> torch.Tensor:
        return gather.attend(0, q, cache)

    def kernel() -> torch.Tensor:
        return paged_decode_attention(q, k_blocks, v_blocks, metadata.block_tables, metadata.context_lens,
                                      dim ** -0.5, max_context_len=context)

    diff = (torch_path().float() - kernel().float()).abs().max().item()
    row = {"batch x context": f"{batch} x {context}", "max abs diff": diff}
    if device.type == "cuda":
        row["gather + SDPA (ms)"] = cuda_median_ms(torch_path, repeats)
        row["Triton kernel (ms)"] = cuda_median_ms(kernel, repeats)
        row["speed-up"] = f"{row['gather + SDPA (ms)'] / row['Triton kernel (ms)']:.1f}x"
    return row


def main(argv: list[str] | None = None) -> list[dict]:
    parser = demo_parser("m08: the Triton paged decode kernel against m05's gather path, then m07 against m08.",
                         prog="python -m milestones.m08_triton_kernel")
    parser.add_argument("--attention-backend", default="auto", choices=("auto", "torch", "triton"),
                        help="m08's decode attention: auto (Triton on a GPU, torch elsewhere), torch, triton")
    parser.add_argument("--shapes", type=batch_x_context_list, default="1x512,16x512,64x512",
                        help="comma-separated BATCHxCONTEXT cases for the one-layer comparison")
    parser.add_argument("--kernel-repeats", type=positive_int, default=20,
                        help="timed calls per kernel case (GPU only)")
    parser.add_argument("--num-prompts", type=positive_int, default=16, help="requests for the end-to-end comparison")
    parser.add_argument("--prompt-len", type=positive_int, default=256, help="tokens per prompt")
    parser.add_argument("--max-tokens", type=positive_int, default=32, help="tokens to generate per request")
    args = parse_args(parser, argv)

    with exit_on_bad_input(parser):
        m08 = LLMEngine(engine_config(EngineConfig, args, attention_backend=args.attention_backend,
                                      max_num_seqs=args.num_prompts))
        m07 = ChunkedPrefillEngine(engine_config(EngineConfig, args, max_num_seqs=args.num_prompts))
        prompts = random_prompts(m08.vocab_size, args.num_prompts, args.prompt_len, args.prompt_len, args.seed)
        params = SamplingParams(max_tokens=args.max_tokens, ignore_eos=True)
        cases = [Case("m07_chunked_prefill (torch attention)", m07, prompts, params),
                 Case(f"m08_triton_kernel ({m08.attention_backend} attention)", m08, prompts, params)]
        check_cases(cases)
    print(f"model {args.model!r} on {m08.device} in {m08.dtype}; attention backend: {m08.attention_backend}")

    reason = triton_unavailable_reason(m08.device.type)
    if reason is None:
        rows = [kernel_row(m08, batch, context, args.kernel_repeats, args.seed + i)
                for i, (batch, context) in enumerate(args.shapes)]
        note = "" if m08.device.type == "cuda" else " (Triton's interpreter: outputs compared, not timed)"
        print_table(rows, f"one decode attention layer at the model's shape, random paged K/V{note}",
                    KERNEL_COLUMNS)
    else:
        print(f"\nThe kernel cannot run here: {reason}.")

    e2e = measure(cases, args.repeats)
    print_table(e2e, f"{args.num_prompts} requests x {args.prompt_len}-token prompts -> {args.max_tokens} tokens",
                E2E_COLUMNS)
    print()
    print_speedup(e2e, e2e[0]["label"], "output tok/s")
    print(f"identical tokens (greedy): {'yes' if same_tokens(e2e) else 'NO'}")
    if m08.attention_backend == "torch":
        print("(m08 ran its torch path here, so it does what m07 does; on a GPU it runs the kernel)")
    return e2e


if __name__ == "__main__":
    main()
