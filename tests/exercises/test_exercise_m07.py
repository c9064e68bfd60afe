"""Build it, m07: the chunked-prefill scheduler's ``schedule`` (``exercises/m07_chunked_prefill.py``).

Each check takes a *solution* module with a ``Scheduler`` class (``conftest.py`` in this directory says which
modules), builds it over m06's block manager and drives it with a fake engine that checks every K/V read. Pure
Python: no model, no torch.
"""

from __future__ import annotations

import random

import pytest

from .exercise_support import Checks, assert_stub_fails
from milestones.m06_prefix_cache.block_manager import PrefixCachingBlockManager
from test_m05_block_manager import FakeEngine, check_all_returned, check_block_manager, make_seq, solo_tokens

EXERCISE = "m07"
CHECKS = Checks()


def scheduler_on(solution, budget: int, num_blocks: int = 64, block_size: int = 4, max_num_seqs: int = 8):
    manager = PrefixCachingBlockManager(num_blocks, block_size)
    return solution.Scheduler(max_num_seqs=max_num_seqs, max_num_batched_tokens=budget, block_manager=manager)


def fed(step) -> dict[str, int]:
    """request id -> tokens it fed in this step."""
    return {item.seq.request_id: item.num_new_tokens for item in step.scheduled}


def run_to_the_end(engine: FakeEngine, budget: int) -> list:
    steps = []
    while engine.scheduler.has_unfinished():
        steps.append(engine.step())
        assert steps[-1].num_batched_tokens <= budget, "a step went over the budget"
        assert steps[-1].scheduled, "a step with work waiting scheduled nothing"
    return steps


@CHECKS
def test_m07_a_long_prompt_is_fed_in_chunks_of_the_budget(solution):
    scheduler = scheduler_on(solution, budget=3)
    seq = make_seq("p", list(range(1, 11)), max_tokens=3)  # 10 prompt tokens
    scheduler.add(seq)
    steps = run_to_the_end(FakeEngine(scheduler), 3)
    assert [fed(step)["p"] for step in steps] == [3, 3, 3, 1, 1, 1], "chunks of 3, 3, 3, 1, then two decodes"
    assert seq.output_token_ids == solo_tokens(seq.prompt_token_ids, 3)
    check_all_returned(scheduler.block_manager)


@CHECKS
def test_m07_decoders_get_a_token_every_step_while_a_prompt_is_chunked(solution):
    scheduler = scheduler_on(solution, budget=8)
    engine = FakeEngine(scheduler)
    decoders = [make_seq(f"d{i}", [i + 1, 2, 3], max_tokens=20) for i in range(3)]
    for seq in decoders:
        scheduler.add(seq)
    engine.step()  # the three prompts, 9 tokens > 8: the third starts with 2 of its 3
    engine.step()
    long = make_seq("long", list(range(1, 41)), max_tokens=2)
    scheduler.add(long)
    while long.num_computed_tokens < 40:
        step = fed(engine.step())
        assert all(step.get(s.request_id) == 1 for s in decoders), f"a decoder missed a step: {step}"
        assert step["long"] == 5, "the prompt gets what the three decodes leave of the budget"
    run_to_the_end(engine, 8)
    for seq in decoders + [long]:
        assert seq.output_token_ids == solo_tokens(seq.prompt_token_ids, seq.params.max_tokens)


@CHECKS
def test_m07_a_newcomer_joins_a_decode_step_with_what_is_left_of_the_budget(solution):
    scheduler = scheduler_on(solution, budget=6)
    engine = FakeEngine(scheduler)
    first = make_seq("first", [1, 2], max_tokens=8)
    scheduler.add(first)
    engine.step()
    scheduler.add(make_seq("second", list(range(1, 11)), max_tokens=2))
    step = engine.step()
    assert fed(step) == {"first": 1, "second": 5}, "decode first, then the newcomer's first chunk"
    assert [s.request_id for s in step.admitted] == ["second"]


@CHECKS
def test_m07_admission_is_first_come_first_served(solution):
    # 10 blocks of 4 slots; "big" needs all 10 while "a" holds 2, so it waits, and "small" must wait behind it.
    scheduler = scheduler_on(solution, budget=64, num_blocks=10)
    engine = FakeEngine(scheduler)
    scheduler.add(make_seq("a", [1] * 6, max_tokens=3))
    engine.step()
    scheduler.add(make_seq("big", [2] * 40, max_tokens=1))
    scheduler.add(make_seq("small", [3], max_tokens=1))
    step = engine.step()
    assert [s.request_id for s in step.admitted] == [], "nobody overtakes the head of the queue"
    assert [s.request_id for s in scheduler.waiting] == ["big", "small"]
    run_to_the_end(engine, 64)
    check_all_returned(scheduler.block_manager)


@CHECKS
def test_m07_seats_are_limited_by_max_num_seqs(solution):
    scheduler = scheduler_on(solution, budget=16, max_num_seqs=2)
    for i in range(4):
        scheduler.add(make_seq(f"r{i}", [i + 1, 5], max_tokens=3))
    first = FakeEngine(scheduler).step()
    assert [s.request_id for s in first.admitted] == ["r0", "r1"]
    assert len(scheduler.running) == 2


@CHECKS
def test_m07_when_blocks_run_out_the_newest_request_is_preempted_and_requeued_first(solution):
    # 6 blocks of 2 slots: a, b and c fill them; when a needs a new block, c (the newest) gives its blocks back
    # and goes to the front of the queue, ahead of d.
    scheduler = scheduler_on(solution, budget=16, num_blocks=6, block_size=2, max_num_seqs=4)
    engine = FakeEngine(scheduler)
    for request_id, first in (("a", 1), ("b", 4), ("c", 7)):
        scheduler.add(make_seq(request_id, [first, first + 1, first + 2], max_tokens=4))
    engine.step()
    scheduler.add(make_seq("d", [10], max_tokens=1))
    preempting = next((step for step in (engine.step() for _ in range(12)) if step.preempted), None)
    assert preempting is not None, "a, b and c outgrew the 6 blocks, yet nobody was preempted"
    assert [s.request_id for s in preempting.preempted] == ["c"]
    assert [s.request_id for s in scheduler.waiting][:2] == ["c", "d"]
    run_to_the_end(engine, 16)
    check_all_returned(scheduler.block_manager)


@CHECKS
def test_m07_random_workloads_finish_exactly_within_the_budget(solution):
    rng = random.Random(7)
    for budget, num_blocks in ((8, 40), (5, 14), (16, 24)):
        scheduler = scheduler_on(solution, budget=budget, num_blocks=num_blocks, block_size=4, max_num_seqs=5)
        engine = FakeEngine(scheduler)
        system = [rng.randrange(1, 6) for _ in range(8)]
        seqs = [make_seq(f"r{i}", (system if i % 2 else []) + [rng.randrange(1, 6) for _ in range(rng.randint(1, 20))],
                         max_tokens=rng.randint(1, 8)) for i in range(10)]
        pending = list(seqs)
        mixed = False
        while pending or scheduler.has_unfinished():
            if pending and rng.random() < 0.5:
                scheduler.add(pending.pop(0))
            if not scheduler.has_unfinished():
                continue
            step = engine.step()
            assert step.num_batched_tokens <= budget, "a step went over the budget"
            mixed |= any(n == 1 for n in fed(step).values()) and any(n > 1 for n in fed(step).values())
            check_block_manager(scheduler.block_manager, {s.request_id: s.all_token_ids for s in scheduler.running})
        for seq in seqs:
            assert seq.output_token_ids == solo_tokens(seq.prompt_token_ids, seq.params.max_tokens)
        check_all_returned(scheduler.block_manager)
        assert mixed, "no step carried a decode and a prompt chunk together"


@pytest.mark.parametrize("check", CHECKS, ids=[check.__name__ for check in CHECKS])
def test_m07_the_bare_stub_fails_every_check(check, stub):
    assert_stub_fails(check, stub)
