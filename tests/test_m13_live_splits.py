"""m13's decode over only the splits that hold keys, and the combine inside its last program (``live_splits.py``).

The checks, in Triton's interpreter on a CPU (and compiled in the GPU call): against m08's decode and m13's
combine over every split, the heads within float32 rounding, and exactly ``int16_x``'s words of the heads it
stores; sequences of no keys give zeros; every counter is back at zero; the decoder at one row gives the output of
the decoder with the combine launch (``LIVE_SPLITS_MAX_ROWS`` at 0), within bf16 rounding.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from milestones.m08_triton_kernel.paged_decode_kernel import paged_decode_attention  # noqa: E402
from milestones.m13_quantization import live_splits, matmul_kernels  # noqa: E402
from milestones.m13_quantization.integer_dots import int16_x  # noqa: E402
from milestones.m13_quantization.integer_heads import IntegerHeadsAttention  # noqa: E402

CUDA = torch.cuda.is_available()
DEVICE = torch.device("cuda" if CUDA else "cpu")


def paged_inputs(lengths: list[int], heads: int, kv_heads: int, head_dim: int = 128, block: int = 16,
                 dtype: torch.dtype = torch.bfloat16, seed: int = 0) -> tuple:
    """Random q and caches, each sequence's blocks in a shuffled order: ``paged_decode_attention``'s arguments."""
    gen = torch.Generator().manual_seed(seed)
    widths = [-(-n // block) for n in lengths]
    k_cache, v_cache = (torch.randn(max(1, sum(widths)), block, kv_heads, head_dim, generator=gen).to(dtype)
                        for _ in range(2))
    order = torch.randperm(max(1, sum(widths)), generator=gen).int()
    tables = torch.zeros(len(lengths), max(widths + [1]) + 2, dtype=torch.int32)
    first = 0
    for row, width in enumerate(widths):
        tables[row, :width] = order[first:first + width]
        first += width
    q = torch.randn(len(lengths), heads, head_dim, generator=gen).to(dtype)
    return (q.to(DEVICE), k_cache.to(DEVICE), v_cache.to(DEVICE), tables.to(DEVICE),
            torch.tensor(lengths, dtype=torch.int32, device=DEVICE), head_dim ** -0.5)


def decode(args: tuple, num_splits: int, live: bool) -> tuple:
    """The heads and o_proj's words through ``IntegerHeadsAttention``: the live splits' kernel, or m08's decode
    over every split then m13's combine launch."""
    attention = IntegerHeadsAttention(None, None, None, None, 0)
    options = dict(split_kernel=attention.decode_live_splits) if live else dict(combine=attention.combine)
    heads = paged_decode_attention(*args, num_splits=num_splits, **options)
    return heads, attention.take_words()


@pytest.mark.parametrize("lengths, heads, kv_heads, num_splits", [
    ([5, 40, 70, 0], 8, 2, 6),  # 1, 1, 2 and no splits hold keys (tiles of 64); a padding row
    ([300], 4, 1, 40),  # 5 of 40 splits (more than SPLITS_CHUNK in all, fewer live)
    ([2000, 17], 6, 2, 33),  # 32 and 1 of 33 (two chunks); a group of 3 query heads (padded to 4)
], ids=["short", "long-tail", "two-chunks"])
def test_the_last_program_combines_the_splits_that_hold_keys(lengths, heads, kv_heads, num_splits):
    args = paged_inputs(lengths, heads, kv_heads, seed=num_splits)
    before, before_words = decode(args, num_splits, live=False)
    combined, combined_words = decode(args, num_splits, live=True)
    assert torch.allclose(combined.float(), before.float(), rtol=2 ** -7, atol=2 ** -9)
    assert torch.equal(combined_words, int16_x(combined.reshape(len(lengths), -1)))
    empty = [row for row, n in enumerate(lengths) if n == 0]
    assert not combined[empty].any()  # and its words are int16_x's of zeros (above)
    assert not matmul_kernels.zeroed_counters(DEVICE, 64).any(), "a last program left its counter set"


def test_the_last_program_combines_an_fp8_cache_as_m08_reads_it():
    """An FP8 cache with its scales: the live splits' heads within float32 rounding of m08's over every split."""
    q, k_cache, v_cache, tables, lengths, scale = paged_inputs([130, 1], 8, 2, seed=7)
    k_scale, v_scale = (torch.tensor([s], device=DEVICE) for s in (0.05, 0.03))
    args = (q, (k_cache.float() / 0.05).to(torch.float8_e4m3fn), (v_cache.float() / 0.03).to(torch.float8_e4m3fn),
            tables, lengths, scale)
    attention = IntegerHeadsAttention(None, None, None, None, 0)
    heads = paged_decode_attention(*args, num_splits=9, k_scale=k_scale, v_scale=v_scale,
                                   split_kernel=attention.decode_live_splits)
    expected = paged_decode_attention(*args, num_splits=9, k_scale=k_scale, v_scale=v_scale)
    assert torch.allclose(heads.float(), expected.float(), rtol=2 ** -7, atol=2 ** -9)
    assert torch.equal(attention.take_words(), int16_x(heads.reshape(2, -1)))


@pytest.mark.parametrize("rows", [1, 2])
def test_decode_graphs_with_the_live_splits_keep_the_decoders_output(rows, monkeypatch):
    """m13's int4 decoder over a paged cache, K split by m08's heuristic (a graph's bound of 4,096 keys; 41 and
    17 of them cached): the live splits' kernel (``LIVE_SPLITS_MAX_ROWS``) gives the output of m08's decode and
    the combine launch within bf16 rounding of the logits' scale, and launches no combine."""
    from milestones.m01_naive_loop.loader import build_model, init_random_, preset_config
    from milestones.m05_paged_blocks.paged_attention import PagedKVCache
    from milestones.m10_cuda_graphs.graph_runner import GraphDecodeAttention
    from milestones.m13_quantization import integer_heads
    from milestones.m13_quantization.epilogue_layers import EpilogueCausalLM
    from milestones.m13_quantization.quantized_loader import quantize_model_

    config = preset_config("tiny")
    config.num_hidden_layers, config.num_attention_heads, config.num_key_value_heads = 2, 4, 2
    config.hidden_size, config.head_dim = 256, 128  # a head: one group of o_proj's input
    model = build_model(config, DEVICE, torch.bfloat16)
    init_random_(model, 0, std=config.initializer_range)
    decoder = EpilogueCausalLM(quantize_model_(model, "int4", "triton"))
    cache = PagedKVCache(2, 8, 16, 2, 128, torch.bfloat16, DEVICE)
    gen = torch.Generator().manual_seed(3)
    for layer in range(2):
        cache.k[layer].copy_(torch.randn(cache.k[layer].shape, generator=gen))
        cache.v[layer].copy_(torch.randn(cache.v[layer].shape, generator=gen))
    combines, real_combine = [], integer_heads.IntegerHeadsAttention.combine
    monkeypatch.setattr(integer_heads.IntegerHeadsAttention, "combine",
                        lambda self, *args: combines.append(1) or real_combine(self, *args))
    outputs = {}
    for max_rows in (0, rows):
        monkeypatch.setattr(live_splits, "LIVE_SPLITS_MAX_ROWS", max_rows)
        combines.clear()
        graph = GraphDecodeAttention(cache, torch.tensor([40, 100][:rows], device=DEVICE),
                                     torch.tensor([[2, 0, 3, 1], [4, 5, 6, 7]][:rows], dtype=torch.int32,
                                                  device=DEVICE),
                                     torch.tensor([41, 17][:rows], dtype=torch.int32, device=DEVICE), 4096)
        with torch.no_grad():
            outputs[max_rows] = decoder(torch.tensor([5, 9][:rows], device=DEVICE),
                                        torch.tensor([40, 16][:rows], device=DEVICE), graph), len(combines)
    (before, launched), (after, none) = outputs[0], outputs[rows]
    assert launched == 2 and none == 0  # a combine launch a layer, then none
    assert torch.allclose(after.float(), before.float(), rtol=0, atol=2 ** -6 * before.float().abs().max())
