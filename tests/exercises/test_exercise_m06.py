"""Build it, m06: ``cached_prefix``, the longest cached prefix of a prompt (``exercises/m06_prefix_cache.py``).

Each check takes a *solution* module with a ``PrefixCachingBlockManager`` class (``conftest.py`` in this directory
says which modules). Pure Python: no model, no torch.
"""

from __future__ import annotations

import pytest

from .exercise_support import Checks, assert_stub_fails
from milestones.m06_prefix_cache.block_manager import ROOT_HASH, block_hash
from milestones.m06_prefix_cache.scheduler import Scheduler as PrefixCachingScheduler
from test_m05_block_manager import FakeEngine, check_all_returned, check_block_manager, make_seq, solo_tokens

EXERCISE = "m06"
CHECKS = Checks()
X, Y, Z, W = [1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11, 12], [13, 14, 15, 16]  # one block each (block_size 4)


def cached(solution, *prompts: list[int], num_blocks: int = 16):
    """A manager (block_size 4) in which each prompt was allocated, computed whole, and freed again."""
    manager = solution.PrefixCachingBlockManager(num_blocks, 4)
    for i, prompt in enumerate(prompts):
        manager.allocate(f"p{i}", prompt)
        manager.cache_full_blocks(f"p{i}", prompt, len(prompt))
    tables = {f"p{i}": list(manager.block_tables[f"p{i}"]) for i in range(len(prompts))}
    for request_id in tables:
        manager.free(request_id)
    return manager, tables


@CHECKS
def test_m06_an_empty_cache_finds_nothing(solution):
    manager = solution.PrefixCachingBlockManager(8, 4)
    assert manager.cached_prefix(X + Y + [1]) == []
    assert manager.allocate("a", X + Y + [1]) == 0


@CHECKS
def test_m06_a_cached_prefix_is_found_and_shared(solution):
    manager, tables = cached(solution, X + Y + Z + [1])
    assert manager.cached_prefix(X + Y + W + [2]) == tables["p0"][:2]
    assert manager.allocate("b", X + Y + W + [2]) == 8, "allocate starts b after its 8 cached tokens"
    assert manager.block_tables["b"][:2] == tables["p0"][:2]
    check_block_manager(manager)


@CHECKS
def test_m06_the_last_prompt_token_is_never_served_from_the_cache(solution):
    manager, tables = cached(solution, X + Y + Z)
    assert manager.cached_prefix(X + Y + Z) == tables["p0"][:2], "3 full blocks: reuse 2, compute the last one"
    assert manager.cached_prefix(X + Y + Z + [7]) == tables["p0"]
    assert manager.cached_prefix(X + [5]) == tables["p0"][:1]
    assert manager.cached_prefix(X) == [] and manager.cached_prefix([1]) == []


@CHECKS
def test_m06_the_lookup_stops_at_the_first_block_not_found(solution):
    manager, tables = cached(solution, X + Y + Z + [1])
    assert manager.cached_prefix(X + W + Z + [1]) == tables["p0"][:1]
    assert manager.cached_prefix(W + Y + Z + [1]) == []


@CHECKS
def test_m06_a_block_is_named_by_its_whole_prefix_not_its_own_tokens(solution):
    manager, _ = cached(solution, X + Y + [1])
    assert manager.cached_prefix(Z + Y + [1]) == [], "Y after Z holds other K/V than Y after X"


@CHECKS
def test_m06_a_hash_collision_never_serves_another_prefix(solution):
    manager, tables = cached(solution, X + Y + [1])
    # Make W's hash point at X's block, as a collision would: the tokens must be compared before sharing.
    manager.cached_blocks[block_hash(ROOT_HASH, tuple(W))] = tables["p0"][0]
    assert manager.cached_prefix(W + Y + [1]) == []
    # The same for the parent: Y's block reached from another parent must not match.
    other_parent = block_hash(ROOT_HASH, tuple(Z))
    manager.cached_blocks[other_parent] = tables["p0"][0]
    manager.blocks[tables["p0"][0]].token_ids = tuple(Z)  # now it claims Z's tokens, under X's chain
    manager.cached_blocks[block_hash(other_parent, tuple(Y))] = tables["p0"][1]
    assert manager.cached_prefix(Z + Y + [1]) == tables["p0"][:1], "the second block's parent is X's hash, not Z's"


@CHECKS
def test_m06_nothing_is_found_with_caching_off(solution):
    manager = solution.PrefixCachingBlockManager(16, 4, enable_caching=False)
    manager.allocate("a", X + Y + [1])
    manager.cache_full_blocks("a", X + Y + [1], 9)
    assert manager.cached_prefix(X + Y + [1]) == []
    assert manager.allocate("b", X + Y + [1]) == 0


@CHECKS
def test_m06_a_freed_prefix_is_found_until_its_blocks_are_handed_out(solution):
    manager, tables = cached(solution, X + Y + [1], num_blocks=4)
    assert manager.cached_prefix(X + Y + [3]) == tables["p0"][:2]
    manager.allocate("big", W * 4)  # needs all 4 blocks: both cached ones are evicted
    assert manager.cached_prefix(X + Y + [3]) == []
    manager.free("big")
    check_all_returned(manager)


@CHECKS
def test_m06_the_scheduler_shares_a_system_prompt_through_your_lookup(solution):
    manager = solution.PrefixCachingBlockManager(num_blocks=40, block_size=4)
    scheduler = PrefixCachingScheduler(max_num_seqs=2, max_num_batched_tokens=64, block_manager=manager)
    system = X + Y + Z  # 12 tokens: 3 blocks shared by every request
    seqs = [make_seq(f"q{i}", system + [20 + i, 30 + i], max_tokens=5) for i in range(5)]
    for seq in seqs:
        scheduler.add(seq)
    engine = FakeEngine(scheduler)  # fails at once if a shared block holds K/V of another prefix
    while scheduler.has_unfinished():
        engine.step()
        check_block_manager(manager, {s.request_id: s.all_token_ids for s in scheduler.running})
    # The first request's blocks are findable once its step is scheduled: the second, admitted later in the same
    # step, already shares them.
    assert [s.num_cached_tokens for s in seqs] == [0, 12, 12, 12, 12], "every request after the first finds the system prompt"
    for seq in seqs:
        assert seq.output_token_ids == solo_tokens(seq.prompt_token_ids, seq.params.max_tokens)
    check_all_returned(manager)


@pytest.mark.parametrize("check", CHECKS, ids=[check.__name__ for check in CHECKS])
def test_m06_the_bare_stub_fails_every_check(check, stub):
    assert_stub_fails(check, stub)
