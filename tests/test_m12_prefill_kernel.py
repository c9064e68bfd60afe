"""m12's paged prefill kernel against a float32 reference, in Triton's interpreter (and compiled where CUDA is).

Every prompt chunk of a step is attended in one launch: chunks of different lengths, cached prefixes before them
(prefix hits, earlier chunks), grouped-query heads (a group that is not a power of two too), block tables that
scatter a sequence's pages over the pool, FP8 caches with their scales, and decode rows beside the chunks that the
kernel must leave alone.
"""

from __future__ import annotations

import pytest
import torch

from milestones.m08_triton_kernel.device_kernel import interpreter_problem
from milestones.m12_async_scheduling.paged_prefill_kernel import (paged_prefill_attention, prefill_tiles,
                                                                  queries_per_tile)

pytestmark = pytest.mark.skipif(interpreter_problem() is not None and not torch.cuda.is_available(),
                                reason=str(interpreter_problem()))
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def make_step(query_lens, context_lens, heads, kv_heads, head_dim, block_size, dtype, device, seed=0):
    """A pool with every sequence's pages at random places, and the step's packed queries."""
    gen = torch.Generator().manual_seed(seed)
    blocks_needed = [-(-c // block_size) for c in context_lens]
    num_blocks = sum(blocks_needed) + 3
    order = torch.randperm(num_blocks, generator=gen).tolist()
    tables = torch.zeros((len(context_lens), max(blocks_needed)), dtype=torch.int32)
    taken = 0
    for s, n in enumerate(blocks_needed):
        tables[s, :n] = torch.tensor(order[taken:taken + n])
        taken += n
    k = torch.randn((num_blocks, block_size, kv_heads, head_dim), generator=gen)
    v = torch.randn((num_blocks, block_size, kv_heads, head_dim), generator=gen)
    q = torch.randn((sum(query_lens), heads, head_dim), generator=gen)
    starts = [0]
    for n in query_lens:
        starts.append(starts[-1] + n)
    to = dict(device=device)
    return (q.to(dtype).to(**to), k.to(dtype).to(**to), v.to(dtype).to(**to), tables.to(**to),
            torch.tensor(context_lens, **to), torch.tensor(starts, **to))


def reference(q, k, v, tables, context_lens, starts, query_lens, k_scale=1.0, v_scale=1.0):
    """Each chunk's queries, one at a time, over the keys 0 .. its position, in float32."""
    heads, kv_heads = q.shape[1], k.shape[2]
    block_size = k.shape[1]
    out = torch.full(q.shape, float("nan"))
    for s, q_len in enumerate(query_lens):
        if q_len == 1:
            continue
        ctx = int(context_lens[s])
        slots = torch.arange(ctx)
        blocks = tables[s].long().cpu()[slots // block_size]
        keys = k.cpu().float()[blocks, slots % block_size] * k_scale  # [ctx, kv_heads, dim]
        values = v.cpu().float()[blocks, slots % block_size] * v_scale
        keys = keys.repeat_interleave(heads // kv_heads, dim=1)
        values = values.repeat_interleave(heads // kv_heads, dim=1)
        for i in range(q_len):
            row, position = int(starts[s]) + i, ctx - q_len + i
            scores = torch.einsum("hd,khd->hk", q[row].cpu().float(), keys[:position + 1]) * q.shape[-1] ** -0.5
            out[row] = torch.einsum("hk,khd->hd", scores.softmax(-1), values[:position + 1])
    return out


def run_kernel(q, k, v, tables, context_lens, starts, query_lens, **scales):
    block_q = queries_per_tile(q.shape[1], k.shape[2])
    chunks = [s for s, n in enumerate(query_lens) if n > 1]
    seqs, firsts = prefill_tiles(query_lens, chunks, block_q)
    out = torch.full_like(q, 7.0)  # decode rows must keep this
    seqs, firsts = [-1] + seqs + [-1, -1], [-1] + firsts + [-1, -1]  # unused tiles (a captured grid's) do nothing
    tiles = torch.tensor([seqs, firsts], dtype=torch.int32, device=q.device)
    paged_prefill_attention(q, k, v, out, tables, context_lens, starts, tiles[0], tiles[1], q.shape[-1] ** -0.5,
                            **scales)
    return out


CASES = {  # query_lens, context_lens (a context longer than its chunk: a cached prefix or earlier chunks)
    "whole prompts": ([5, 9, 3], [5, 9, 3]),
    "chunks after prefixes, decodes beside": ([4, 1, 70, 1, 2], [11, 30, 75, 6, 2]),
    "one long chunk": ([130], [161]),
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("heads,kv_heads,head_dim,block_size", [(4, 2, 16, 4), (6, 2, 32, 16), (4, 4, 16, 8)],
                         ids=["group-2", "group-3", "group-1"])
@pytest.mark.parametrize("case", list(CASES))
def test_prefill_kernel_matches_the_reference(device, heads, kv_heads, head_dim, block_size, case):
    query_lens, context_lens = CASES[case]
    step = make_step(query_lens, context_lens, heads, kv_heads, head_dim, block_size, torch.float32, device)
    out = run_kernel(*step, query_lens).cpu()
    expected = reference(*step, query_lens)
    rows = ~torch.isnan(expected[:, 0, 0])
    assert torch.allclose(out[rows], expected[rows], atol=2e-5, rtol=1e-4)
    assert (out[~rows] == 7.0).all()  # the decode rows: not the kernel's


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fp8", [False, True], ids=["bf16-cache", "fp8-cache"])
def test_bf16_queries_and_an_fp8_cache_with_its_scales(device, fp8):
    query_lens, context_lens = CASES["chunks after prefixes, decodes beside"]
    q, k, v, tables, context_lens_t, starts = make_step(query_lens, context_lens, 4, 2, 32, 16, torch.bfloat16,
                                                        device, seed=3)
    scales = {}
    if fp8:
        k_scale, v_scale = torch.tensor([0.02], device=device), torch.tensor([0.03], device=device)
        k = (k.float() / k_scale).to(torch.float8_e4m3fn)
        v = (v.float() / v_scale).to(torch.float8_e4m3fn)
        scales = dict(k_scale=k_scale, v_scale=v_scale)
    out = run_kernel(q, k, v, tables, context_lens_t, starts, query_lens, **scales).cpu().float()
    expected = reference(q, k, v, tables, context_lens_t, starts, query_lens,
                         **({"k_scale": 0.02, "v_scale": 0.03} if fp8 else {}))
    rows = ~torch.isnan(expected[:, 0, 0])
    assert torch.allclose(out[rows], expected[rows], atol=3e-2, rtol=3e-2)


def test_tiles_cover_every_query_of_every_chunk_once():
    query_lens = [1, 70, 2, 1, 33]
    seqs, firsts = prefill_tiles(query_lens, [1, 2, 4], 32)
    assert list(zip(seqs, firsts)) == [(1, 0), (1, 32), (1, 64), (2, 0), (4, 0), (4, 32)]
    assert queries_per_tile(16, 8) == 32 and queries_per_tile(6, 2) == 16 and queries_per_tile(128, 1) == 1


def test_mismatched_inputs_are_refused_in_one_line():
    q, k, v, tables, context_lens, starts = make_step([3], [3], 4, 2, 16, 4, torch.float32, "cpu")
    none = torch.zeros(0, dtype=torch.int32)
    with pytest.raises(ValueError, match="same dtype"):
        paged_prefill_attention(q, k.half(), v.half(), torch.empty_like(q), tables, context_lens, starts, none, none,
                                0.25)
    with pytest.raises(ValueError, match="multiple of K/V heads"):
        paged_prefill_attention(q[:, :3], k, v, torch.empty_like(q[:, :3]), tables, context_lens, starts, none,
                                none, 0.25)


def test_a_mixed_step_gives_m05s_attention(tied_checkpoint, tokenizer_cache):
    """Through the attention object an engine builds: decodes in m08's kernel, chunks in the prefill kernel, the
    same outputs as m05's gather-and-SDPA path on the same step."""
    from milestones.m05_paged_blocks.paged_attention import AttentionMetadata, PagedAttention, PagedKVCache
    from milestones.m12_async_scheduling.attention import TritonMixedAttention

    block_size, heads, kv_heads, dim = 4, 4, 2, 16
    query_lens, context_lens = [1, 6, 1, 3], [9, 10, 4, 3]
    tables = [[0, 1, 2], [3, 4, 5], [6, 0, 0], [7, 0, 0]]
    positions, slots = [], []
    for s, (n, c) in enumerate(zip(query_lens, context_lens)):
        for p in range(c - n, c):
            positions.append(p)
            slots.append(tables[s][p // block_size] * block_size + p % block_size)
    import numpy as np

    metadata = AttentionMetadata.build(query_lens, context_lens, positions, slots,
                                       np.array(tables, dtype=np.int32), block_size, torch.device("cpu"))
    gen = torch.Generator().manual_seed(5)
    cache = PagedKVCache(1, 8, block_size, kv_heads, dim, torch.float32, torch.device("cpu"))
    cache.k.normal_(generator=gen)
    cache.v.normal_(generator=gen)
    q = torch.randn((sum(query_lens), heads, dim), generator=gen)
    k, v = torch.randn((len(q), kv_heads, dim), generator=gen), torch.randn((len(q), kv_heads, dim), generator=gen)
    got = TritonMixedAttention(cache, metadata)(0, q, k, v)
    expected = PagedAttention(cache, metadata)(0, q, k, v)
    assert torch.allclose(got, expected, atol=1e-5, rtol=1e-4)
