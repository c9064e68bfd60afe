"""m02: prefill once, decode against a K/V cache. Same tokens as transformers and m01, far less computation,
cache memory accounted exactly, and chunked prefill through ``CachedAttention`` equal to one prefill.
"""

from __future__ import annotations

import pytest
import torch
from conftest import GREEDY_MAX_TOKENS, mixed_length_prompts

from milestones.m01_naive_loop.attention import CausalAttention
from milestones.m01_naive_loop.loader import load_model
from milestones.m02_kv_cache import SamplingParams
from milestones.m02_kv_cache.kv_cache import CachedAttention, KVCache

GREEDY = SamplingParams(max_tokens=GREEDY_MAX_TOKENS, ignore_eos=True)


def kv_bytes_per_token(config, element_size: int = 4) -> int:
    """K and V, every layer, one token, from the checkpoint's config (fp32 on CPU: 4 bytes)."""
    return 2 * config.num_hidden_layers * config.num_key_value_heads * config.head_dim * element_size


def test_greedy_matches_transformers_and_m01(m02_engine, m01_engine, hf_reference):
    prompts = mixed_length_prompts()
    outputs = m02_engine.generate(prompts, GREEDY, use_tqdm=False)
    m01_outputs = m01_engine.generate(prompts, GREEDY, use_tqdm=False)
    for prompt, output, m01_output, expected in zip(prompts, outputs, m01_outputs, hf_reference):
        assert output.prompt_token_ids == prompt
        assert output.token_ids == expected, f"prompt of {len(prompt)} tokens"
        assert output.token_ids == m01_output.token_ids
        assert output.finish_reason == "length"


def test_greedy_matches_transformers_second_tied_model(wide_tied_checkpoint, wide_tied_reference, engine_factory):
    outputs = engine_factory("m02_kv_cache", wide_tied_checkpoint[0]).generate(
        mixed_length_prompts(), GREEDY, use_tqdm=False)
    assert [o.token_ids for o in outputs] == wide_tied_reference


def test_per_prompt_lengths_including_one_token(m02_engine, hf_reference):
    """max_tokens=1 means prefill only (a cache of exactly the prompt); other lengths give greedy prefixes."""
    prompts = mixed_length_prompts()
    lengths = [1, 2, GREEDY_MAX_TOKENS, 1, 5, 3, 1, 7, GREEDY_MAX_TOKENS][: len(prompts)]
    params = [SamplingParams(max_tokens=n, ignore_eos=True) for n in lengths]
    outputs = m02_engine.generate(prompts, params, use_tqdm=False)
    assert [o.token_ids for o in outputs] == [ref[:n] for ref, n in zip(hf_reference, lengths)]


def test_stop_token_ends_request(m02_engine, hf_reference):
    prompt, full = mixed_length_prompts()[5], hf_reference[5]
    stop = full[-3]
    end = full.index(stop) + 1
    params = SamplingParams(max_tokens=GREEDY_MAX_TOKENS, ignore_eos=True, stop_token_ids=[stop])
    output = m02_engine.generate([prompt], params, use_tqdm=False)[0]
    assert output.token_ids == full[:end] and output.finish_reason == "stop"


def test_seeded_sampling_matches_m01(m02_engine, m01_engine):
    """Same logits (up to float rounding) and the same per-request RNG: the same samples as m01."""
    prompts = mixed_length_prompts()[2:5]
    params = [SamplingParams(max_tokens=8, temperature=0.8, top_k=50, seed=s, ignore_eos=True) for s in (1, 2, 3)]
    ours = [o.token_ids for o in m02_engine.generate(prompts, params, use_tqdm=False)]
    theirs = [o.token_ids for o in m01_engine.generate(prompts, params, use_tqdm=False)]
    assert ours == theirs


# --------------------------------------------------------------------------- counters


def test_kv_memory_of_one_request(m02_engine, tiny_checkpoint):
    config = tiny_checkpoint[1].config
    prompt, max_tokens = mixed_length_prompts()[6], 9
    m02_engine.generate([prompt], SamplingParams(max_tokens=max_tokens, ignore_eos=True), use_tqdm=False)
    stats = m02_engine.stats
    expected = kv_bytes_per_token(config) * (len(prompt) + max_tokens - 1)  # the last token is never fed back
    assert kv_bytes_per_token(config) == 2 * 2 * 2 * 16 * 4
    assert stats.kv_reserved_peak_bytes == expected
    assert stats.kv_used_peak_bytes == expected  # a full-length run fills every reserved slot


def test_kv_memory_of_a_request_that_stops_early(m02_engine, tiny_checkpoint, hf_reference):
    config = tiny_checkpoint[1].config
    prompt, full = mixed_length_prompts()[5], hf_reference[5]
    stop = full[3]
    produced = full.index(stop) + 1
    assert produced < GREEDY_MAX_TOKENS
    params = SamplingParams(max_tokens=GREEDY_MAX_TOKENS, ignore_eos=True, stop_token_ids=[stop])
    m02_engine.generate([prompt], params, use_tqdm=False)
    stats = m02_engine.stats
    assert stats.kv_reserved_peak_bytes == kv_bytes_per_token(config) * (len(prompt) + GREEDY_MAX_TOKENS - 1)
    assert stats.kv_used_peak_bytes == kv_bytes_per_token(config) * (len(prompt) + produced - 1)


def test_kv_peak_is_the_largest_request_not_the_sum(m02_engine, tiny_checkpoint):
    """m02 runs one request at a time, so only one cache exists at once."""
    config = tiny_checkpoint[1].config
    prompts = mixed_length_prompts()
    m02_engine.generate(prompts, GREEDY, use_tqdm=False)
    longest = max(len(p) for p in prompts) + GREEDY_MAX_TOKENS - 1
    assert m02_engine.stats.kv_reserved_peak_bytes == kv_bytes_per_token(config) * longest


def test_m02_computes_each_token_once(m02_engine, m01_engine):
    prompts = mixed_length_prompts()
    m02_engine.generate(prompts, GREEDY, use_tqdm=False)
    stats = m02_engine.stats
    n = GREEDY_MAX_TOKENS
    assert stats.steps == len(prompts) * n  # one prefill + n - 1 decode steps per request
    assert stats.tokens_computed == sum(len(p) + n - 1 for p in prompts)
    assert stats.prompt_tokens_computed == sum(len(p) for p in prompts)
    assert stats.padding_tokens == 0

    m01_engine.generate(prompts, GREEDY, use_tqdm=False)
    naive = m01_engine.stats
    assert naive.tokens_computed == sum(len(p) + i for p in prompts for i in range(n))
    assert naive.tokens_computed > 5 * stats.tokens_computed
    assert naive.prompt_tokens_computed == n * stats.prompt_tokens_computed


# --------------------------------------------------------------------------- CachedAttention


@pytest.fixture(scope="module")
def model(tiny_checkpoint):
    return load_model(str(tiny_checkpoint[0]), torch.device("cpu"), torch.float32).model


def run_chunks(model, ids: torch.Tensor, chunks: list[int]) -> tuple[torch.Tensor, KVCache]:
    """Feed ``ids [B, T]`` through the model in pieces of the given sizes against one cache."""
    cache = KVCache.for_model(model.config, ids.shape[0], ids.shape[1], torch.float32, torch.device("cpu"))
    assert sum(chunks) == ids.shape[1]
    hidden, start = [], 0
    with torch.no_grad():
        for size in chunks:
            piece = ids[:, start:start + size]
            positions = torch.arange(start, start + size)[None, :].expand_as(piece)
            hidden.append(model(piece, positions, CachedAttention(cache, start, size)))
            start += size
    return torch.cat(hidden, dim=1), cache


@pytest.mark.parametrize("chunks", [[5, 20], [1, 24], [5, 1, 1, 18], [8, 8, 9], [24, 1]])
def test_chunked_prefill_equals_one_prefill(model, chunks, monkeypatch):
    ids = torch.randint(4, 512, (2, 25), generator=torch.Generator().manual_seed(0))
    masks = []
    original = CachedAttention.causal_mask
    monkeypatch.setattr(CachedAttention, "causal_mask", lambda self, device: masks.append(1) or original(self, device))

    whole, whole_cache = run_chunks(model, ids, [25])
    assert masks == []  # one prefill at slot 0 needs no explicit mask
    pieces, pieces_cache = run_chunks(model, ids, chunks)
    multi_token_later_chunks = sum(size > 1 for size in chunks[1:])
    assert len(masks) == multi_token_later_chunks * model.config.num_hidden_layers  # the masked branch ran

    torch.testing.assert_close(pieces, whole, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(pieces_cache.k, whole_cache.k, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(pieces_cache.v, whole_cache.v, rtol=1e-5, atol=1e-5)
    # And both equal m01's cache-free causal attention over the whole sequence.
    with torch.no_grad():
        reference = model(ids, torch.arange(25)[None, :].expand_as(ids), CausalAttention())
    torch.testing.assert_close(pieces, reference, rtol=1e-5, atol=1e-5)


def test_causal_mask_shape_and_values():
    cache = KVCache(num_layers=1, batch=1, max_len=8, num_kv_heads=1, head_dim=2, dtype=torch.float32,
                    device=torch.device("cpu"))
    mask = CachedAttention(cache, start=3, num_new=2).causal_mask(torch.device("cpu"))
    assert mask.dtype == torch.bool
    assert mask.shape == (1, 1, 2, 5)  # [batch or 1, 1, T, keys]: what sdpa takes
    assert mask[0, 0].tolist() == [[True] * 4 + [False], [True] * 5]


def test_cache_geometry(tiny_checkpoint):
    config = tiny_checkpoint[1].config
    cache = KVCache.for_model(config, batch=3, max_len=10, dtype=torch.bfloat16, device=torch.device("cpu"))
    assert cache.k.shape == cache.v.shape == (2, 3, 10, 2, 16)
    assert cache.max_len == 10
    assert cache.bytes_per_slot == kv_bytes_per_token(config, element_size=2)
    assert cache.reserved_bytes == 3 * 10 * cache.bytes_per_slot
