"""m05: paged K/V blocks, packed batches and preemption by recompute give every request exactly its solo
(transformers' and m04's) greedy tokens, under any batch, block size and K/V budget."""

from __future__ import annotations

import math
from collections import Counter

import pytest

from conftest import GREEDY_MAX_TOKENS, mixed_length_prompts, random_prompts
from milestones.m01_naive_loop import SamplingParams
from paged_helpers import (StepRecorder, assert_blocks_all_free, drain, generate_exactly, greedy, make_engine, poison,
                           reference)

M05 = "m05_paged_blocks"
GREEDY = SamplingParams(max_tokens=GREEDY_MAX_TOKENS, ignore_eos=True)
# Prompts in no particular order of length (1..40 tokens), and output lengths from 1 to 16.
PROMPTS = random_prompts(8, 1, 40, seed=21)
LENGTHS = [9, 1, 16, 4, 12, 2, 7, 14]


@pytest.fixture
def engine_on(tied_checkpoint, tokenizer_cache):
    """``engine_on(milestone, **config)``: a fresh engine on the tied checkpoint."""
    return lambda milestone=M05, **config: make_engine(milestone, tied_checkpoint[0], **config)


# --------------------------------------------------------------------------- exactness


@pytest.mark.parametrize("max_num_seqs, block_size", [(2, 1), (16, 4), (5, 16)])
def test_greedy_matches_transformers_under_batching(tiny_checkpoint, tokenizer_cache, hf_reference,
                                                    max_num_seqs, block_size):
    # Longest prompt first: prompts admitted together are packed in an order their lengths do not follow.
    engine = make_engine(M05, tiny_checkpoint[0], max_num_seqs=max_num_seqs, block_size=block_size,
                         kv_cache_tokens=2048)
    outputs = engine.generate(mixed_length_prompts()[::-1], GREEDY, use_tqdm=False)
    assert [o.token_ids for o in outputs] == hf_reference[::-1]
    assert max(engine.stats.running_per_step) == min(max_num_seqs, len(hf_reference))
    assert_blocks_all_free(engine)


def test_prompts_admitted_together_keep_their_own_attention_outputs(engine_on, tied_checkpoint):
    # Regression: a step's prompts attended as one length-sorted group had their outputs swapped.
    engine = engine_on(max_num_seqs=4, block_size=4, kv_cache_tokens=256)
    prompts = [PROMPTS[i] for i in (4, 2, 6)]
    with StepRecorder(engine) as recorder:
        outputs = engine.generate(prompts, greedy(3), use_tqdm=False)
    assert len(recorder.steps[0].admitted) == 3  # all three in the first step
    lengths = [n for _, _, n in recorder.steps[0].scheduled]
    recorder.assert_fed_as_scheduled({o.request_id: o.prompt_token_ids + o.token_ids for o in outputs})
    assert lengths != sorted(lengths)
    assert [o.token_ids for o in outputs] == [reference(tied_checkpoint[1], p, 3) for p in prompts]


def test_mixed_output_lengths_match_m04_and_transformers(engine_on, tied_checkpoint):
    params = [greedy(n) for n in LENGTHS]
    m05 = engine_on(max_num_seqs=3, block_size=4, kv_cache_tokens=512).generate(PROMPTS, params, use_tqdm=False)
    m04 = engine_on("m04_continuous_batching", max_num_seqs=3, kv_cache_tokens=512).generate(
        PROMPTS, params, use_tqdm=False)
    for prompt, n, a, b in zip(PROMPTS, LENGTHS, m05, m04):
        assert a.token_ids == b.token_ids == reference(tied_checkpoint[1], prompt, n)
        assert a.finish_reason == "length"


def test_preempted_again_and_again_tokens_stay_exact(engine_on, tied_checkpoint):
    # 24 blocks of one slot for 8 requests of 6 + up to 16 tokens: each fits alone, together they keep running
    # out, so the newest is preempted, readmitted when a request finishes, and preempted again.
    prompts = [p[:6] for p in PROMPTS]
    lengths = [16, 14, 12, 10, 8, 6, 4, 2]
    engine = engine_on(max_num_seqs=8, block_size=1, kv_cache_tokens=24)
    outputs, recorder = generate_exactly(engine, tied_checkpoint[1], prompts, lengths)
    stats = engine.stats
    preempted = Counter(request_id for step in recorder.steps for request_id in step.preempted)
    assert stats.num_preemptions == sum(preempted.values()) >= len(prompts)
    assert max(preempted.values()) >= 2  # some request was preempted again after its readmission
    # Every position computed is a needed one (prompt + all outputs but the last) or a recomputed one.
    needed = sum(len(p) + n - 1 for p, n in zip(prompts, lengths))
    assert stats.tokens_computed == needed + stats.recomputed_tokens
    assert stats.recomputed_tokens >= stats.num_preemptions * 6  # at least the prompt, each time
    assert stats.blocks_used_peak == stats.num_blocks == 24
    assert_blocks_all_free(engine)


def test_requests_added_mid_decode(engine_on, tied_checkpoint):
    engine = engine_on(max_num_seqs=4, block_size=4, kv_cache_tokens=512)
    ids = [engine.add_request(PROMPTS[i], greedy(LENGTHS[i])) for i in (2, 0)]
    tokens: dict[str, list[int]] = {}
    for _ in range(4):  # both are mid-decode when the others arrive
        for out in engine.step():
            tokens[out.request_id] = out.token_ids
    assert 0 < len(tokens[ids[0]]) < LENGTHS[2]
    ids += [engine.add_request(PROMPTS[i], greedy(LENGTHS[i])) for i in (4, 6, 7)]
    latest = drain(engine)
    for i, request_id in zip((2, 0, 4, 6, 7), ids):
        assert latest[request_id].token_ids == reference(tied_checkpoint[1], PROMPTS[i], LENGTHS[i])
        assert latest[request_id].finish_reason == "length"
    assert_blocks_all_free(engine)


def test_unwritten_pool_memory_is_never_read(engine_on, tied_checkpoint):
    # Different prompt and output lengths, block size 4: decode rows of different lengths gather padding keys
    # and padded block-table entries; all of them must point at slots that hold real values.
    engine = engine_on(max_num_seqs=3, block_size=4, kv_cache_tokens=256)
    poison(engine)
    outputs = engine.generate(PROMPTS, [greedy(n) for n in LENGTHS], use_tqdm=False)
    for prompt, n, out in zip(PROMPTS, LENGTHS, outputs):
        assert out.token_ids == reference(tied_checkpoint[1], prompt, n)


# --------------------------------------------------------------------------- abort


def test_abort_frees_the_blocks_of_waiting_running_and_preempted_requests(engine_on, tied_checkpoint):
    engine = engine_on(max_num_seqs=3, block_size=4, kv_cache_tokens=32)  # 8 blocks
    manager, scheduler = engine.block_manager, engine.scheduler
    prompts = [PROMPTS[i] for i in (2, 3, 0, 7)]
    assert [len(p) for p in prompts] == [8, 6, 11, 12]
    ids = [engine.add_request(p, greedy(20)) for p in prompts[:3]]
    never_admitted = engine.add_request(prompts[3], greedy(20))  # max_num_seqs=3 keeps it waiting
    while not any(seq.num_preemptions for seq in scheduler.waiting):
        engine.step()
    preempted = next(seq for seq in scheduler.waiting if seq.num_preemptions)
    running = [seq.request_id for seq in scheduler.running]
    held = {rid: len(table) for rid, table in manager.block_tables.items()}
    assert preempted.request_id not in held and set(held) == set(running)
    assert manager.num_used_blocks == sum(held.values())

    assert engine.abort(preempted.request_id) is True
    assert engine.abort(never_admitted) is True
    assert manager.num_used_blocks == sum(held.values())  # neither held a block
    victim = running[0]
    assert engine.abort(victim) is True
    assert manager.num_used_blocks == sum(held.values()) - held[victim]
    assert victim not in manager.block_tables
    assert engine.abort(victim) is False and engine.abort("no-such-id") is False

    survivors = [rid for rid in ids if rid not in (preempted.request_id, victim)]
    latest = drain(engine)
    for rid in survivors:
        assert latest[rid].token_ids == reference(tied_checkpoint[1], prompts[ids.index(rid)], 20)
    assert_blocks_all_free(engine)


# --------------------------------------------------------------------------- stats


def test_stats_count_blocks_steps_and_kv_exactly(engine_on):
    # One request, prompt 5, 4 tokens, blocks of 4: steps feed 5, 1, 1, 1 tokens; after each the cache holds
    # 5, 6, 7, 8 tokens in 2 blocks (8 slots reserved).
    engine = engine_on(max_num_seqs=2, block_size=4, kv_cache_tokens=64)
    engine.generate([PROMPTS[2][:5]], greedy(4), use_tqdm=False)
    stats, per_token = engine.stats, engine.kv_bytes_per_token
    assert (stats.num_blocks, stats.block_size, stats.blocks_used_peak) == (16, 4, 2)
    assert (stats.steps, stats.tokens_computed, stats.prompt_tokens_computed) == (4, 8, 5)
    assert stats.running_per_step == [1, 1, 1, 1] and stats.blocks_used_per_step == [2, 2, 2, 2]
    assert (stats.num_preemptions, stats.recomputed_tokens, stats.padding_tokens) == (0, 0, 0)
    assert stats.kv_reserved_mean_bytes == 8 * per_token and stats.kv_reserved_peak_bytes == 8 * per_token
    assert stats.kv_used_mean_bytes == 6.5 * per_token and stats.kv_used_peak_bytes == 8 * per_token
    assert stats.as_dict()["num_preemptions"] == 0


def test_stats_show_more_requests_in_flight_than_m04_at_the_same_budget(engine_on):
    # m04 reserves prompt + max_tokens for each request; m05 only the blocks that hold tokens.
    prompts = [p for p in PROMPTS if len(p) >= 5][:4]
    params = greedy(8)
    m05 = engine_on(max_num_seqs=8, block_size=4, kv_cache_tokens=64)
    m04 = engine_on("m04_continuous_batching", max_num_seqs=8, kv_cache_tokens=64)
    a = m05.generate(prompts, params, use_tqdm=False)
    b = m04.generate(prompts, params, use_tqdm=False)
    assert [o.token_ids for o in a] == [o.token_ids for o in b]
    assert m05.stats.mean_running > m04.stats.mean_running
    m05_ratio = m05.stats.kv_used_mean_bytes / m05.stats.kv_reserved_mean_bytes
    assert m05_ratio > m04.stats.kv_used_mean_bytes / m04.stats.kv_reserved_mean_bytes
    assert m05_ratio > 0.75  # at most one partly filled block of 4 per request


# --------------------------------------------------------------------------- sizing and validation


def test_the_cache_is_whole_blocks_and_refuses_a_request_longer_than_all_of_it(engine_on, tied_checkpoint):
    engine = engine_on(max_num_seqs=2, block_size=4, kv_cache_tokens=35)  # 8 whole blocks: 32 slots
    assert (engine.kv_pool.num_blocks, engine.kv_pool.capacity, engine.block_manager.num_blocks) == (8, 32, 8)
    assert "8 blocks x 4 tokens" in engine.describe_kv_cache()
    prompt = PROMPTS[4][:20]
    with pytest.raises(ValueError, match="K/V slots"):
        engine.add_request(prompt, greedy(14))  # 20 + 14 - 1 = 33 slots
    with pytest.raises(ValueError, match="K/V slots"):
        engine.generate([PROMPTS[1], prompt], [greedy(2), greedy(14)], use_tqdm=False)
    assert not engine.has_unfinished()  # nothing was queued
    (out,) = engine.generate([prompt], greedy(13), use_tqdm=False)  # exactly the whole cache
    assert out.token_ids == reference(tied_checkpoint[1], prompt, 13)
    assert engine.stats.blocks_used_peak == 8
    assert_blocks_all_free(engine)


@pytest.mark.parametrize("knobs, message", [
    ({"block_size": 0}, "block_size"), ({"block_size": 2.0}, "block_size"), ({"block_size": True}, "block_size"),
    ({"max_num_batched_tokens": 0}, "max_num_batched_tokens"),
    ({"max_num_batched_tokens": None}, "max_num_batched_tokens"),
    ({"kv_cache_memory_bytes": 0}, "kv_cache_memory_bytes"), ({"kv_cache_memory_bytes": -1}, "kv_cache_memory_bytes"),
    ({"kv_cache_memory_bytes": math.nan}, "kv_cache_memory_bytes"), ({"kv_cache_memory_bytes": 2.5e9},
                                                                       "kv_cache_memory_bytes"),
    ({"kv_cache_memory_bytes": math.inf}, "kv_cache_memory_bytes"),
    ({"kv_cache_memory_bytes": "1"}, "kv_cache_memory_bytes"),
    ({"gpu_memory_utilization": 0}, "gpu_memory_utilization"),
    ({"gpu_memory_utilization": 1.5}, "gpu_memory_utilization"),
    ({"gpu_memory_utilization": True}, "gpu_memory_utilization"),
    ({"kv_watermark": 1.0}, "kv_watermark"), ({"kv_watermark": -0.1}, "kv_watermark"),
    ({"kv_cache_tokens": 64, "kv_cache_memory_bytes": 2**30}, "one way only"),
    ({"kv_cache_memory_bytes": 2**30, "gpu_memory_utilization": 0.5}, "one way only"),
])
def test_config_validation(knobs, message):
    from milestones.m05_paged_blocks import EngineConfig

    with pytest.raises(ValueError, match=message):
        EngineConfig(**knobs)


@pytest.mark.parametrize("knobs, message", [
    ({"gpu_memory_utilization": 0.5}, "needs a CUDA device"),
    ({"kv_cache_tokens": 3, "block_size": 4}, "less than one block"),
    ({"kv_cache_memory_bytes": 1}, "less than one block"),
])
def test_a_budget_that_cannot_be_met_is_a_clear_error(engine_on, knobs, message):
    with pytest.raises(ValueError, match=message):
        engine_on(**knobs)


def test_kv_cache_memory_bytes_sizes_the_pool(engine_on):
    engine = engine_on(block_size=4, kv_cache_memory_bytes=2**16)  # 64 KiB
    per_block = engine.kv_bytes_per_token * 4
    assert engine.kv_pool.num_blocks == 2**16 // per_block


# --------------------------------------------------------------------------- the demo


def test_demo_holds_more_requests_than_m04_with_identical_tokens(tied_checkpoint, tokenizer_cache, capsys):
    from milestones.m05_paged_blocks.__main__ import main

    rows = main(["--model", str(tied_checkpoint[0]), "--device", "cpu", "--num-prompts", "12", "--prompt-len", "6",
                 "--max-tokens", "24", "--median-tokens", "4", "--block-size", "4"])
    out = capsys.readouterr().out
    assert "K/V cache:" in out and "mean running" in out and "used / reserved" in out
    assert "identical tokens (greedy): yes" in out
    m04, m05 = rows
    assert (m04["label"], m05["label"]) == ("m04_continuous_batching", "m05_paged_blocks")
    assert m04["output tokens"] == m05["output tokens"] and m04["requests"] == m05["requests"] == 12
    # Counts, not timings: the same budget holds more requests, and reserves little that it does not use.
    assert m05["mean running"] > 1.2 * m04["mean running"] and m05["peak running"] > m04["peak running"]
    assert m05["used / reserved"] > m04["used / reserved"]
