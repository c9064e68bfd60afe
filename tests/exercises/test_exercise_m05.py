"""Build it, m05: a block manager's ``allocate``, ``append_slots`` and ``free`` (``exercises/m05_block_manager.py``).

Each check takes a *solution* module with a ``BlockManager`` class (``conftest.py`` in this directory says which
modules: the reference, the page's answer, a learner's file). Pure Python: no model, no torch.
"""

from __future__ import annotations

import random

import pytest

from .exercise_support import Checks, assert_stub_fails
from milestones.m05_paged_blocks.scheduler import Scheduler as PagedScheduler
from test_m05_block_manager import FakeEngine, ShadowKV, check_all_returned, check_block_manager, make_seq, solo_tokens

EXERCISE = "m05"
CHECKS = Checks()


@CHECKS
def test_m05_allocate_takes_whole_blocks_from_the_front_of_the_free_list(solution):
    manager = solution.BlockManager(num_blocks=6, block_size=4)
    assert manager.allocate("a", [1] * 5) == 0, "m05 caches nothing: allocate returns 0"
    assert manager.block_tables["a"] == [0, 1], "5 tokens of block_size 4 need 2 blocks, the first two free"
    assert [manager.slot("a", p) for p in (0, 3, 4)] == [0, 3, 4]
    assert manager.allocate("b", [1] * 4) == 0 and manager.block_tables["b"] == [2]
    assert manager.num_free_blocks == 3 and list(manager.free_block_ids) == [3, 4, 5]
    check_block_manager(manager)


@CHECKS
def test_m05_a_request_id_cannot_be_allocated_twice(solution):
    manager = solution.BlockManager(num_blocks=4, block_size=2)
    manager.allocate("a", [1, 2])
    with pytest.raises(ValueError, match="a"):
        manager.allocate("a", [3])
    assert manager.block_tables == {"a": [0]}, "a refused allocate must change nothing"


@CHECKS
def test_m05_append_slots_takes_a_block_only_when_the_last_one_is_full(solution):
    manager = solution.BlockManager(num_blocks=8, block_size=4)
    manager.allocate("a", [1] * 5)
    manager.append_slots("a", 8)  # positions 5..7 fit in block 1
    assert manager.block_tables["a"] == [0, 1]
    manager.append_slots("a", 9)  # position 8 starts block 2
    assert manager.block_tables["a"] == [0, 1, 2]
    manager.append_slots("a", 6)  # fewer than it holds: nothing changes
    assert manager.block_tables["a"] == [0, 1, 2]
    manager.allocate("b", [1])
    manager.append_slots("b", 13)  # several blocks at once (a prompt chunk in m07)
    assert manager.block_tables["b"] == [3, 4, 5, 6]
    assert manager.slot("b", 12) == 6 * 4
    check_block_manager(manager)


@CHECKS
def test_m05_free_gives_every_block_back_tail_first(solution):
    manager = solution.BlockManager(num_blocks=6, block_size=2)
    manager.allocate("a", [1] * 5)  # blocks 0, 1, 2
    manager.allocate("b", [1])  # block 3
    manager.free("a")
    assert "a" not in manager.block_tables
    assert list(manager.free_block_ids) == [4, 5, 2, 1, 0], "freed blocks join the back of the list, tail first"
    assert all(manager.blocks[b].ref_count == 0 for b in (0, 1, 2))
    manager.allocate("c", [1] * 6)  # the free list's front is handed out first
    assert manager.block_tables["c"] == [4, 5, 2]
    check_block_manager(manager)


@CHECKS
def test_m05_a_block_held_twice_is_free_only_after_its_last_holder_leaves(solution):
    # m05 never shares a block, but its free must count references: m06 shares prefix blocks through it.
    manager = solution.BlockManager(num_blocks=4, block_size=2)
    manager.allocate("a", [1, 2, 3])  # blocks 0, 1
    manager.allocate("b", [4])  # block 2
    manager.block_tables["b"].insert(0, 0)  # b shares a's first block, as m06's allocate would arrange
    manager.blocks[0].ref_count += 1
    manager.free("a")
    assert 0 not in manager.free_block_ids and manager.blocks[0].ref_count == 1
    assert 1 in manager.free_block_ids
    manager.free("b")
    assert manager.num_free_blocks == 4 and all(block.ref_count == 0 for block in manager.blocks)


@CHECKS
def test_m05_random_operations_keep_every_invariant(solution):
    rng = random.Random(5)
    for block_size in (1, 2, 4):
        manager = solution.BlockManager(num_blocks=12, block_size=block_size)
        shadow, live = ShadowKV(manager), {}
        for _ in range(300):
            request_id = f"r{rng.randrange(6)}"
            if request_id not in live:
                tokens = [rng.randrange(1, 9) for _ in range(rng.randint(1, 9))]
                if manager.can_allocate(tokens):
                    assert manager.allocate(request_id, tokens) == 0
                    shadow.compute(request_id, tokens, 0, len(tokens))
                    live[request_id] = tokens
            elif rng.random() < 0.6 and manager.can_append_slots(request_id, len(live[request_id]) + 1):
                tokens = live[request_id]
                tokens.append(rng.randrange(1, 9))
                manager.append_slots(request_id, len(tokens))
                shadow.compute(request_id, tokens, len(tokens) - 1, len(tokens))
            else:
                manager.free(request_id)
                del live[request_id]
            check_block_manager(manager)
            for rid, tokens in live.items():
                assert len(manager.block_tables[rid]) == manager.blocks_for(len(tokens))
                shadow.check(rid, tokens, len(tokens))  # no two live requests ever share a slot
        for request_id in list(live):
            manager.free(request_id)
        check_all_returned(manager)


@CHECKS
def test_m05_the_scheduler_runs_and_preempts_on_your_block_manager(solution):
    # m05's scheduler over 6 blocks of 2 slots: the requests outgrow them, so some are preempted and recomputed.
    manager = solution.BlockManager(num_blocks=6, block_size=2)
    scheduler = PagedScheduler(max_num_seqs=4, max_num_batched_tokens=64, block_manager=manager)
    seqs = [make_seq(request_id, [i + 1, 2, 3], max_tokens=6) for i, request_id in enumerate("abc")]
    seqs.append(make_seq("w", [9], max_tokens=2))
    for seq in seqs:
        scheduler.add(seq)
    engine = FakeEngine(scheduler)  # fails at once if a step reads K/V that was not written for its prefix
    while scheduler.has_unfinished():
        engine.step()
        check_block_manager(manager)
    assert scheduler.num_preemptions >= 1
    for seq in seqs:
        assert seq.output_token_ids == solo_tokens(seq.prompt_token_ids, seq.params.max_tokens)
    check_all_returned(manager)


@pytest.mark.parametrize("check", CHECKS, ids=[check.__name__ for check in CHECKS])
def test_m05_the_bare_stub_fails_every_check(check, stub):
    assert_stub_fails(check, stub)
