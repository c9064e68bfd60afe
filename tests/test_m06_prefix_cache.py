"""m06: requests that share a prompt prefix share its K/V blocks, skip its prefill, and still get exactly their
solo (transformers' and m05's) greedy tokens: shared system prompts, full-prompt hits on a block boundary,
prefixes of earlier prompts, hits under preemption and abort. Also the LRU pool of freed blocks."""

from __future__ import annotations

import pytest

from conftest import random_prompts
from milestones.m06_prefix_cache.block_manager import PrefixCachingBlockManager
from paged_helpers import (CHATS, SYSTEM, StepRecorder, assert_blocks_all_free, drain, generate_exactly, greedy,
                           make_engine, reference)

M06 = "m06_prefix_cache"
SUFFIXES = [chat[len(SYSTEM):] for chat in CHATS]
LONG = random_prompts(1, 30, 30, seed=33)[0]


@pytest.fixture
def engine_on(tied_checkpoint, tokenizer_cache):
    """``engine_on(milestone, **config)``: a fresh engine (an empty prefix cache) on the tied checkpoint."""
    return lambda milestone=M06, **config: make_engine(milestone, tied_checkpoint[0], **config)


def test_a_shared_system_prompt_is_computed_once_and_tokens_stay_exact(engine_on, tied_checkpoint):
    engine = engine_on(max_num_seqs=4, block_size=4, kv_cache_tokens=256)
    outputs, recorder = generate_exactly(engine, tied_checkpoint[1], CHATS, 6)
    # All four are admitted in the first step; the later ones find the blocks the first one registered in
    # that same step (every layer writes the step's K/V before any of it is read).
    assert len(recorder.steps[0].admitted) == 4
    assert [o.num_cached_tokens for o in outputs] == [0, 24, 24, 24]
    assert [n for _, _, n in recorder.steps[0].scheduled] == [len(CHATS[0])] + [len(s) for s in SUFFIXES[1:]]
    stats, total = engine.stats, sum(len(p) for p in CHATS)
    assert stats.prompt_tokens_computed == total - 3 * 24
    assert (stats.prefix_cache_queried_tokens, stats.prefix_cache_hit_tokens) == (total, 72)
    assert stats.prefix_cache_hit_rate == pytest.approx(72 / total)
    assert stats.as_dict()["prefix_cache_hit_rate"] == stats.prefix_cache_hit_rate
    assert stats.kv_used_peak_bytes <= stats.kv_reserved_peak_bytes  # shared blocks hold their tokens once
    assert_blocks_all_free(engine)

    # The blocks outlive their requests: a later request with the same system prompt still finds them.
    (again,) = engine.generate([CHATS[2]], greedy(6), use_tqdm=False)
    assert again.num_cached_tokens == 24 and again.token_ids == outputs[2].token_ids
    assert engine.stats.prompt_tokens_computed == len(SUFFIXES[2])


def test_only_uncached_tokens_count_against_the_step_budget(engine_on, tied_checkpoint):
    # A budget that holds the first chat whole and only the questions of the other three: all four still
    # join the first step, because the later ones' system prompt is cached by then.
    budget = len(CHATS[0]) + sum(len(s) for s in SUFFIXES[1:])
    engine = engine_on(max_num_seqs=4, block_size=4, kv_cache_tokens=256, max_num_batched_tokens=budget)
    with StepRecorder(engine) as recorder:
        outputs = engine.generate(CHATS, greedy(2), use_tqdm=False)
    assert len(recorder.steps[0].admitted) == 4 and recorder.steps[0].num_batched_tokens == budget
    for prompt, out in zip(CHATS, outputs):
        assert out.token_ids == reference(tied_checkpoint[1], prompt, 2)


def test_a_shared_block_counts_once_in_kv_used(engine_on):
    # A (8 tokens) and B (A's first block + 2 tokens) run one step together; B shares A's first block.
    # Slots holding K/V: 8 + 6 - 4 shared = 10, in 3 blocks of 4 (12 slots reserved).
    engine = engine_on(max_num_seqs=2, block_size=4, kv_cache_tokens=64)
    a = LONG[:8]
    outputs = engine.generate([a, a[:4] + LONG[20:22]], greedy(1), use_tqdm=False)
    assert [o.num_cached_tokens for o in outputs] == [0, 4]
    stats, per_token = engine.stats, engine.kv_bytes_per_token
    assert stats.steps == 1 and stats.blocks_used_peak == 3
    assert (stats.kv_used_peak_bytes, stats.kv_reserved_peak_bytes) == (10 * per_token, 12 * per_token)
    assert engine.block_manager.num_shared_references == 0  # both finished: nothing shared any more


def test_prefix_caching_off_is_exactly_m05(engine_on):
    knobs = dict(max_num_seqs=3, block_size=4, kv_cache_tokens=256)
    off, m05 = engine_on(enable_prefix_caching=False, **knobs), engine_on("m05_paged_blocks", **knobs)
    a = off.generate(CHATS, greedy(5), use_tqdm=False)
    b = m05.generate(CHATS, greedy(5), use_tqdm=False)
    assert [o.token_ids for o in a] == [o.token_ids for o in b]
    assert [o.num_cached_tokens for o in a] == [0, 0, 0, 0]
    for name in ("steps", "tokens_computed", "prompt_tokens_computed", "running_per_step", "blocks_used_per_step",
                 "blocks_used_peak", "kv_used_byte_steps", "kv_reserved_byte_steps"):
        assert getattr(off.stats, name) == getattr(m05.stats, name), name
    assert off.stats.prefix_cache_hit_tokens == 0 and off.stats.prefix_cache_hit_rate == 0.0
    assert off.block_manager.cached_blocks == {} and off.block_manager.num_cached_free_blocks == 0


def test_a_prompt_of_whole_blocks_hit_entirely_still_computes_its_last_block(engine_on, tied_checkpoint):
    prompt = LONG[:12]  # exactly 3 blocks of 4
    engine = engine_on(max_num_seqs=2, block_size=4, kv_cache_tokens=128)
    (first,) = engine.generate([prompt], greedy(8), use_tqdm=False)
    assert first.num_cached_tokens == 0 and first.token_ids == reference(tied_checkpoint[1], prompt, 8)
    (again,) = engine.generate([prompt], greedy(8), use_tqdm=False)
    # Hits are whole blocks within the first 11 tokens: 2 blocks; the third is computed again (its last
    # token's logits give the first output token).
    assert again.num_cached_tokens == 8 and engine.stats.prompt_tokens_computed == 4
    assert again.token_ids == first.token_ids
    # A prompt that continues into blocks the first request filled with its OUTPUT tokens hits those too.
    continued = prompt + first.token_ids[:5]  # 17 tokens: blocks 0-3 cached (block 3 holds outputs 0-3)
    (cont,) = engine.generate([continued], greedy(3), use_tqdm=False)
    assert cont.num_cached_tokens == 16 and engine.stats.prompt_tokens_computed == 1
    assert cont.token_ids == first.token_ids[5:8]  # greedy continues the same sequence
    assert_blocks_all_free(engine)


def test_a_prefix_of_an_earlier_prompt_hits_its_whole_blocks(engine_on, tied_checkpoint):
    engine = engine_on(max_num_seqs=2, block_size=4, kv_cache_tokens=128)
    engine.generate([LONG], greedy(2), use_tqdm=False)
    for length, cached in [(17, 16), (16, 12), (5, 4), (4, 0)]:
        (out,) = engine.generate([LONG[:length]], greedy(4), use_tqdm=False)
        assert out.num_cached_tokens == cached, length
        assert engine.stats.prompt_tokens_computed == length - cached
        assert out.token_ids == reference(tied_checkpoint[1], LONG[:length], 4), length


def test_prefix_hits_with_preemption_and_readmission_stay_exact(engine_on, tied_checkpoint):
    # 14 blocks of 4 for four chats that share 6 blocks of system prompt and grow 12 tokens each.
    engine = engine_on(max_num_seqs=4, block_size=4, kv_cache_tokens=56)
    outputs, recorder = generate_exactly(engine, tied_checkpoint[1], CHATS, 12)
    preempted = {rid for step in recorder.steps for rid in step.preempted}
    readmitted = {rid for step in recorder.steps for rid in step.admitted if rid in preempted}
    assert engine.stats.num_preemptions >= 2 and readmitted == preempted
    assert engine.stats.prefix_cache_hit_tokens >= 48
    # A readmitted request finds its own blocks again (and the shared ones): it recomputes only the rest.
    needed = sum(len(p) + 12 - 1 for p in CHATS) - engine.stats.prefix_cache_hit_tokens
    assert engine.stats.tokens_computed == needed + engine.stats.recomputed_tokens
    readmissions = [(rid, start) for step in recorder.steps for rid, start, _ in step.scheduled
                    if rid in step.admitted and rid in preempted and start > 0]
    assert readmissions, "no readmission started after a cached prefix"
    assert_blocks_all_free(engine)


def test_aborting_one_of_two_requests_sharing_blocks_leaves_the_other_exact(engine_on, tied_checkpoint):
    engine = engine_on(max_num_seqs=2, block_size=4, kv_cache_tokens=128)
    manager = engine.block_manager
    a = engine.add_request(CHATS[0], greedy(10))
    b = engine.add_request(CHATS[1], greedy(10))
    engine.step()
    engine.step()
    shared = manager.block_tables[a][:6]
    assert manager.block_tables[b][:6] == shared
    assert [manager.blocks[i].ref_count for i in shared] == [2] * 6
    own_a = manager.block_tables[a][6:]
    assert not set(own_a) & set(manager.block_tables[b])
    assert engine.abort(a) is True
    assert [manager.blocks[i].ref_count for i in shared] == [1] * 6
    assert all(manager.blocks[i].ref_count == 0 and i in manager.free_block_ids for i in own_a)
    assert manager.block_tables[b][:6] == shared
    latest = drain(engine)
    assert latest[b].token_ids == reference(tied_checkpoint[1], CHATS[1], 10)
    assert latest[b].num_cached_tokens == 24
    assert_blocks_all_free(engine)


def test_lru_freed_blocks_stay_findable_until_needed_and_the_least_recently_freed_go_first():
    manager = PrefixCachingBlockManager(num_blocks=8, block_size=2)
    x, y = [1, 2, 3, 4, 5], [6, 7, 8, 9, 10]  # 2 full blocks each, plus a partial one

    def allocate_and_compute(request_id, tokens):
        cached = manager.allocate(request_id, tokens)
        manager.cache_full_blocks(request_id, tokens, len(tokens))
        return cached

    assert allocate_and_compute("x", x) == 0 and allocate_and_compute("y", y) == 0
    x_blocks, y_blocks = manager.block_tables["x"], manager.block_tables["y"]
    manager.free("x")  # freed first: least recently used
    manager.free("y")
    assert manager.num_free_blocks == 8 and manager.num_cached_free_blocks == 4
    assert manager.cached_prefix(x) == x_blocks[:2] and manager.cached_prefix(y) == y_blocks[:2]
    # Never-used blocks are handed out before any cached one.
    allocate_and_compute("a", [20, 21, 22, 23])
    assert manager.block_tables["a"] == [6, 7]
    assert manager.cached_prefix(x) == x_blocks[:2] and manager.cached_prefix(y) == y_blocks[:2]
    # Then x's blocks (freed before y's), tail first: its partial block, then block 1, where its chain breaks.
    allocate_and_compute("b", [24, 25, 26, 27])
    assert manager.block_tables["b"] == [x_blocks[2], x_blocks[1]]
    assert manager.cached_prefix(x) == x_blocks[:1] and manager.cached_prefix(y) == y_blocks[:2]
    # A hit takes y's two blocks back from the pool; its new partial block evicts the next in line, x's block 0.
    assert allocate_and_compute("y2", y) == 4
    assert manager.block_tables["y2"] == y_blocks[:2] + [x_blocks[0]]
    assert manager.cached_prefix(x) == []
    manager.free("y2")  # y's blocks are now the most recently freed: y's old partial block is next in line
    allocate_and_compute("c", [28, 29, 30, 31])
    assert manager.block_tables["c"] == [y_blocks[2], x_blocks[0]]
    assert manager.cached_prefix(y) == y_blocks[:2] and manager.num_cached_free_blocks == 2


def test_equal_blocks_after_different_prefixes_are_different_blocks():
    """A block's K/V depends on every token before it, so its name is chained to its prefix. Here block 1 of A
    and block 1 of B hold the same tokens after different block 0s: B must not hit A's (nor may a prompt that
    starts with those tokens), and once B has computed its own, a prompt that continues B must find it."""
    manager = PrefixCachingBlockManager(num_blocks=16, block_size=4)
    equal = [50, 51, 52, 53]
    a, b = [10, 11, 12, 13] + equal + [99], [20, 21, 22, 23] + equal + [98]
    manager.allocate("a", a)
    manager.cache_full_blocks("a", a, len(a))
    assert manager.cached_prefix(b) == [] and manager.cached_prefix(equal + [99]) == []
    assert manager.allocate("b", b) == 0
    manager.cache_full_blocks("b", b, len(b))
    a_blocks, b_blocks = manager.block_tables["a"], manager.block_tables["b"]
    assert manager.cached_prefix(a + [1]) == a_blocks[:2]
    assert manager.cached_prefix(b + [1]) == b_blocks[:2] and b_blocks[1] != a_blocks[1]


def test_equal_blocks_after_different_prefixes_at_the_engine(engine_on, tied_checkpoint):
    """The same through the engine: B computes the block it shares token for token with A (after another
    first block), a continuation of B then hits both of B's blocks, and every request gets transformers' tokens."""
    engine = engine_on(max_num_seqs=2, block_size=4, kv_cache_tokens=128)
    equal = LONG[4:8]
    a, b = LONG[:4] + equal + LONG[20:22], LONG[10:14] + equal + LONG[24:26]
    continued = b[:8] + LONG[26:29]
    for prompt, cached in ((a, 0), (b, 0), (continued, 8)):
        (out,) = engine.generate([prompt], greedy(4), use_tqdm=False)
        assert out.num_cached_tokens == cached and engine.stats.prompt_tokens_computed == len(prompt) - cached
        assert out.token_ids == reference(tied_checkpoint[1], prompt, 4)


def test_a_hash_collision_is_not_a_hit(monkeypatch):
    from milestones.m06_prefix_cache import block_manager as module

    monkeypatch.setattr(module, "block_hash", lambda parent, tokens: 42)  # every block collides
    manager = PrefixCachingBlockManager(num_blocks=8, block_size=2)
    manager.allocate("a", [1, 2, 3])
    manager.cache_full_blocks("a", [1, 2, 3], 3)
    assert manager.cached_prefix([1, 2, 3]) == manager.block_tables["a"][:1]
    assert manager.cached_prefix([4, 5, 6]) == []  # same hash, other tokens: compared, and refused


def test_demo_computes_far_fewer_prompt_tokens_with_identical_tokens(tied_checkpoint, tokenizer_cache, capsys):
    from milestones.m06_prefix_cache.__main__ import main

    rows = main(["--model", str(tied_checkpoint[0]), "--device", "cpu", "--num-prompts", "6", "--system-len", "40",
                 "--question-len", "6", "--max-tokens", "3", "--block-size", "4"])
    out = capsys.readouterr().out
    assert "prompt tokens computed" in out and "cache hit rate" in out and "num_cached_tokens" in out
    assert "identical tokens (greedy): yes" in out
    off, on = rows
    assert off["prompt tokens computed"] == off["prompt tokens"] == 6 * 46 and off["cache hit rate"] == 0.0
    # The first request computes the system prompt; the others only their 6 tokens.
    assert on["prompt tokens computed"] == 46 + 5 * 6
    assert on["cache hit rate"] == pytest.approx(5 * 40 / (6 * 46))
