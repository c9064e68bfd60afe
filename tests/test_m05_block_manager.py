"""The block managers (m05's, m06's prefix-caching one) and the paged schedulers (m05, m06, m07), alone.

They are pure Python, so they are tested here with plain ``Sequence`` objects and no model. Besides unit tests,
hypothesis drives them through random workloads and checks the invariants their docstrings promise after every
operation. The scheduler runs are driven by a fake engine that keeps a *shadow K/V cache*: each slot records
the token prefix whose K/V it would hold (a token's K/V depends on every token up to it), so a step that lets a
sequence read a slot nobody wrote, or one written for another prefix, fails at once; and a fake model whose
next token is a function of the whole sequence, so a preempted and recomputed request must end with exactly
the tokens it would have had alone.
"""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from milestones.m01_naive_loop.sampling_params import SamplingParams
from milestones.m05_paged_blocks.block_manager import BlockManager, NoFreeBlocksError
from milestones.m05_paged_blocks.scheduler import Scheduler as PagedScheduler
from milestones.m05_paged_blocks.sequence import Sequence
from milestones.m06_prefix_cache.block_manager import PrefixCachingBlockManager
from milestones.m06_prefix_cache.scheduler import Scheduler as PrefixCachingScheduler
from milestones.m07_chunked_prefill.scheduler import Scheduler as ChunkedPrefillScheduler
from test_m04_scheduler import ROOT, torch_reachable

# Derandomized: the same examples on every run, so the suite never fails by luck (widen max_examples, or drop
# derandomize locally, to search harder).
PROPERTY = settings(max_examples=150, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])


def make_seq(request_id: str, prompt: list[int] | int, max_tokens: int = 4) -> Sequence:
    prompt = [7] * prompt if isinstance(prompt, int) else prompt
    return Sequence(request_id, prompt, SamplingParams(max_tokens=max_tokens, ignore_eos=True), frozenset())


# --------------------------------------------------------------------------- no torch


@pytest.mark.parametrize("module", ["m05_paged_blocks/block_manager.py", "m05_paged_blocks/scheduler.py",
                                    "m05_paged_blocks/sequence.py", "m06_prefix_cache/block_manager.py",
                                    "m06_prefix_cache/scheduler.py", "m07_chunked_prefill/scheduler.py"])
def test_schedulers_block_managers_and_sequence_import_no_torch(module):
    assert not torch_reachable(ROOT / "milestones" / module)


def test_the_torch_check_sees_the_paged_engine():
    assert torch_reachable(ROOT / "milestones" / "m05_paged_blocks" / "engine.py")


# --------------------------------------------------------------------------- BlockManager, by hand


def test_blocks_are_taken_as_tokens_arrive_and_slots_follow_the_table():
    manager = BlockManager(num_blocks=6, block_size=4)
    assert manager.allocate("a", [1] * 5) == 0  # nothing is ever cached in m05
    assert manager.block_tables["a"] == [0, 1] and manager.num_free_blocks == 4
    manager.append_slots("a", 8)  # positions 5..7 fit in block 1
    assert manager.block_tables["a"] == [0, 1]
    manager.append_slots("a", 9)  # position 8 starts a block
    assert manager.block_tables["a"] == [0, 1, 2]
    assert [manager.slot("a", p) for p in (0, 3, 4, 8)] == [0, 3, 4, 8]
    manager.allocate("b", [1])
    manager.free("a")  # freed tail first: 2, 1, 0 join the back of the free list
    assert list(manager.free_block_ids) == [4, 5, 2, 1, 0]
    manager.allocate("c", [1] * 12)
    assert manager.block_tables["c"] == [4, 5, 2]
    assert [manager.slot("c", p) for p in (0, 4, 9)] == [16, 20, 9]
    assert manager.num_used_blocks == 4 and manager.num_free_blocks == 2


def test_can_allocate_and_can_append_count_free_blocks_and_the_reserve():
    manager = BlockManager(num_blocks=4, block_size=2)
    assert manager.can_allocate([1] * 8) and not manager.can_allocate([1] * 9)
    assert not manager.can_allocate([1] * 7, reserve=1) and manager.can_allocate([1] * 6, reserve=1)
    manager.allocate("a", [1] * 3)
    assert manager.can_append_slots("a", 8) and not manager.can_append_slots("a", 9)
    assert manager.can_append_slots("a", 2)  # already held: no block needed


def test_block_manager_errors():
    with pytest.raises(ValueError, match="at least one block"):
        BlockManager(num_blocks=0, block_size=4)
    with pytest.raises(ValueError, match="at least one block"):
        BlockManager(num_blocks=4, block_size=0)
    manager = BlockManager(num_blocks=2, block_size=2)
    manager.allocate("a", [1, 2])
    with pytest.raises(ValueError, match="already holds"):
        manager.allocate("a", [1])
    with pytest.raises(NoFreeBlocksError):
        manager.allocate("b", [1] * 5)


# --------------------------------------------------------------------------- m05's Scheduler, by hand


class FakeEngine:
    """Runs a scheduler's steps as the engine does, with a shadow K/V cache and a fake model (module docstring)."""

    def __init__(self, scheduler) -> None:
        self.scheduler = scheduler
        self.manager = scheduler.block_manager
        self.kv: dict[int, tuple[int, ...]] = {}  # slot -> the token prefix whose K/V it holds

    @staticmethod
    def next_token(token_ids: list[int]) -> int:
        return hash(tuple(token_ids)) % 5 + 1  # few distinct tokens: outputs of equal prompts share blocks too

    def step(self):
        out = self.scheduler.schedule()
        starts = {item.seq: item.seq.num_computed_tokens for item in out.scheduled}
        for item in out.scheduled:  # every layer writes the whole step's K/V before any of it is read
            seq, start = item.seq, starts[item.seq]
            for p in range(start, start + item.num_new_tokens):
                self.kv[self.manager.slot(seq.request_id, p)] = tuple(seq.all_token_ids[:p + 1])
        for item in out.scheduled:
            seq = item.seq
            end = starts[seq] + item.num_new_tokens
            for p in range(end):
                assert self.kv.get(self.manager.slot(seq.request_id, p)) == tuple(seq.all_token_ids[:p + 1]), \
                    f"{seq.request_id} reads wrong K/V at position {p}"
        for item in out.scheduled:
            item.seq.num_computed_tokens += item.num_new_tokens
            if item.seq.num_computed_tokens == item.seq.num_tokens:
                item.seq.append_token(self.next_token(item.seq.all_token_ids), 0.0)
        self.scheduler.remove_finished()
        return out


def solo_tokens(prompt: list[int], max_tokens: int) -> list[int]:
    tokens = list(prompt)
    for _ in range(max_tokens):
        tokens.append(FakeEngine.next_token(tokens))
    return tokens[len(prompt):]


def ids(seqs) -> list[str]:
    return [s.request_id for s in seqs]


def test_admission_is_fcfs_within_the_token_budget_and_an_oversized_head_runs_alone():
    scheduler = PagedScheduler(max_num_seqs=8, max_num_batched_tokens=10,
                               block_manager=BlockManager(num_blocks=64, block_size=4))
    for request_id, prompt in [("a", 4), ("b", 5), ("c", 2), ("big", 30), ("d", 1)]:
        scheduler.add(make_seq(request_id, prompt))
    engine = FakeEngine(scheduler)
    first = engine.step()
    assert ids(first.admitted) == ["a", "b"]  # c would make 11 tokens: it waits for the next step
    assert [s.num_new_tokens for s in first.scheduled] == [4, 5]
    second = engine.step()  # admissions first: the decoders of a and b wait (m07 mixes them)
    assert ids(second.admitted) == ["c"] and second.num_batched_tokens == 2  # big does not fit the other 8
    third = engine.step()
    assert ids(third.admitted) == ["big"] and third.num_batched_tokens == 30  # alone, over the budget
    fourth = engine.step()
    assert ids(fourth.admitted) == ["d"]
    fifth = engine.step()
    assert not fifth.admitted and ids(s.seq for s in fifth.scheduled) == ["a", "b", "c", "big", "d"]
    assert all(s.num_new_tokens == 1 for s in fifth.scheduled)


def test_admission_stops_at_max_num_seqs_and_at_the_watermark():
    manager = BlockManager(num_blocks=8, block_size=4)
    scheduler = PagedScheduler(max_num_seqs=2, max_num_batched_tokens=64, block_manager=manager, watermark_blocks=2)
    for request_id, prompt in [("a", 16), ("b", 12), ("c", 1)]:
        scheduler.add(make_seq(request_id, prompt))
    # a takes 4 of 8 blocks (nobody runs yet: no watermark); b's 3 would leave 1 < 2 free: it waits.
    assert ids(FakeEngine(scheduler).step().admitted) == ["a"]
    assert ids(scheduler.waiting) == ["b", "c"] and manager.num_free_blocks == 4
    scheduler.watermark_blocks = 1
    assert ids(scheduler.schedule().admitted) == ["b"]  # now it fits; c waits for a seat (max_num_seqs=2)
    assert ids(scheduler.waiting) == ["c"]


def test_preemption_takes_the_newest_and_puts_it_back_at_the_front():
    # 6 blocks of 2 slots; three 3-token prompts take 2 blocks each, so w (1 token) finds no free block.
    manager = BlockManager(num_blocks=6, block_size=2)
    scheduler = PagedScheduler(max_num_seqs=4, max_num_batched_tokens=64, block_manager=manager)
    seqs = {request_id: make_seq(request_id, [i + 1, 2, 3], max_tokens=6) for i, request_id in enumerate("abc")}
    seqs["w"] = make_seq("w", [9], max_tokens=2)
    for seq in seqs.values():
        scheduler.add(seq)
    engine = FakeEngine(scheduler)
    assert ids(engine.step().admitted) == ["a", "b", "c"]
    step = engine.step()  # position 3 still fits everyone's second block
    assert ids(s.seq for s in step.scheduled) == ["a", "b", "c"] and not step.preempted
    step = engine.step()  # position 4 needs a third block each: c (newest) gives its two to a and b
    assert ids(step.preempted) == ["c"] and ids(s.seq for s in step.scheduled) == ["a", "b"]
    c = seqs["c"]
    assert ids(scheduler.waiting) == ["c", "w"] and "c" not in manager.block_tables
    assert (c.num_computed_tokens, c.num_tokens, c.num_preemptions) == (0, 5, 1)  # its 2 outputs are kept
    engine.step()
    step = engine.step()  # position 6: a needs a fourth block; b is the newest running now
    assert ids(step.preempted) == ["b"] and ids(scheduler.waiting) == ["b", "c", "w"]  # b arrived before c
    assert scheduler.num_preemptions == 2
    while scheduler.has_unfinished():
        step = engine.step()
        assert len(step.scheduled) > 0
    for seq in seqs.values():  # recomputed requests continue exactly where they stopped
        assert seq.output_token_ids == solo_tokens(seq.prompt_token_ids, seq.params.max_tokens)
    assert manager.num_free_blocks == 6 and manager.block_tables == {}


def test_the_older_of_two_requests_is_never_preempted():
    # Two requests and one spare block to grow into: whenever blocks run out, the newer one gives way.
    manager = BlockManager(num_blocks=5, block_size=2)
    scheduler = PagedScheduler(max_num_seqs=4, max_num_batched_tokens=64, block_manager=manager)
    old, new = make_seq("old", 4, max_tokens=5), make_seq("new", 4, max_tokens=5)
    scheduler.add(old)
    scheduler.add(new)
    engine = FakeEngine(scheduler)
    while scheduler.has_unfinished():
        before = ids(scheduler.running)
        step = engine.step()
        if step.preempted:
            assert ids(step.preempted) == [before[-1]] and before[-1] != before[0]
    assert old.output_token_ids == solo_tokens(old.prompt_token_ids, 5)
    assert new.output_token_ids == solo_tokens(new.prompt_token_ids, 5)
    assert new.num_preemptions >= 1 and old.num_preemptions == 0


# --------------------------------------------------------------------------- invariants, checked after every operation


def check_block_manager(manager: BlockManager, tokens: dict[str, list[int]] | None = None) -> None:
    """The invariants of ``block_manager.py`` (and, for m06, of the prefix cache). ``tokens``: every live
    request's token ids, when the caller knows them (needed to check what shared and registered blocks hold)."""
    holders = Counter(block_id for table in manager.block_tables.values() for block_id in table)
    for block in manager.blocks:
        assert block.ref_count >= 0
        assert block.ref_count == holders[block.block_id], f"{block}: held by {holders[block.block_id]} tables"
        assert (block.block_id in manager.free_block_ids) == (block.ref_count == 0)
    assert manager.num_free_blocks + manager.num_used_blocks == manager.num_blocks
    assert manager.num_used_blocks == len(holders)
    for table in manager.block_tables.values():
        assert len(set(table)) == len(table)  # a block appears once per table
    if not isinstance(manager, PrefixCachingBlockManager):
        assert all(count == 1 for count in holders.values())  # m05 never shares a block
        return
    assert manager.num_shared_references == sum(count - 1 for count in holders.values())
    for digest, block_id in manager.cached_blocks.items():
        block = manager.blocks[block_id]
        assert block.hash == digest and len(block.token_ids) == manager.block_size
    if tokens is None:
        return
    size = manager.block_size
    # A block in two tables sits at the same index of both, behind the same prefix (it is a shared prefix).
    where: dict[int, set[tuple[int, tuple[int, ...]]]] = {}
    for request_id, table in manager.block_tables.items():
        for i, block_id in enumerate(table):
            where.setdefault(block_id, set()).add((i, tuple(tokens[request_id][:(i + 1) * size])))
    for block_id, places in where.items():
        assert len(places) == 1, f"block {block_id} is shared by different prefixes: {places}"
        if holders[block_id] > 1:
            (i, prefix), = places
            assert len(prefix) == (i + 1) * size  # only full blocks are shared
            assert manager.blocks[block_id].token_ids == prefix[i * size:]
    # Registered blocks of a live table hold exactly that table's tokens.
    for request_id, table in manager.block_tables.items():
        for i in range(manager.num_registered_blocks(request_id)):
            assert manager.blocks[table[i]].token_ids == tuple(tokens[request_id][i * size:(i + 1) * size])


def check_all_returned(manager: BlockManager) -> None:
    check_block_manager(manager)
    assert manager.block_tables == {} and manager.num_free_blocks == manager.num_blocks
    if isinstance(manager, PrefixCachingBlockManager):  # what is still cached is free, just findable
        assert all(manager.blocks[b].ref_count == 0 for b in manager.cached_blocks.values())
        assert manager.num_cached_free_blocks <= manager.num_blocks


# --------------------------------------------------------------------------- property tests: the block managers


OPERATIONS = st.lists(st.tuples(st.sampled_from(["allocate", "allocate", "append", "free", "preempt"]),
                                st.integers(0, 5), st.integers(0, 12), st.integers(0, 3)),
                      min_size=1, max_size=40)


class ShadowKV:
    """Slot -> the token prefix whose K/V it holds, for block-manager-level runs (no scheduler)."""

    def __init__(self, manager: BlockManager) -> None:
        self.manager, self.kv = manager, {}

    def compute(self, request_id: str, tokens: list[int], start: int, end: int) -> None:
        for p in range(start, end):
            self.kv[self.manager.slot(request_id, p)] = tuple(tokens[:p + 1])

    def check(self, request_id: str, tokens: list[int], end: int) -> None:
        for p in range(end):
            assert self.kv.get(self.manager.slot(request_id, p)) == tuple(tokens[:p + 1]), (request_id, p)


@st.composite
def prompt_families(draw) -> list[list[int]]:
    """A few prompts, many sharing prefixes: base prompts cut at random lengths, plus a random tail."""
    tokens = st.integers(1, 3)  # a small alphabet: equal blocks after different prefixes happen often
    bases = draw(st.lists(st.lists(tokens, min_size=2, max_size=14), min_size=1, max_size=3))
    prompts = []
    for _ in range(draw(st.integers(1, 8))):
        base = draw(st.sampled_from(bases))
        prompts.append(base[:draw(st.integers(len(base) // 2, len(base)))] + draw(st.lists(tokens, max_size=4)))
    return [p or [1] for p in prompts]


@pytest.mark.parametrize("caching", [False, True], ids=["m05", "m06"])
@PROPERTY
@given(num_blocks=st.integers(1, 24), block_size=st.integers(1, 4), prompts=prompt_families(),
       operations=OPERATIONS)
def test_block_manager_invariants_hold_under_random_operations(caching, num_blocks, block_size, prompts,
                                                              operations):
    manager = PrefixCachingBlockManager(num_blocks, block_size) if caching else BlockManager(num_blocks, block_size)
    shadow = ShadowKV(manager)
    live: dict[str, list[int]] = {}  # request id -> its tokens (all computed: block-manager runs have no steps)
    preempted: dict[str, list[int]] = {}
    for op, who, amount, extra in operations:
        request_id = f"r{who}"
        if op == "allocate" and request_id not in live:
            tokens = preempted.pop(request_id, None) or prompts[who % len(prompts)] + [extra] * (amount % 3)
            if not manager.can_allocate(tokens):
                continue
            cached = manager.allocate(request_id, tokens)
            assert len(manager.block_tables[request_id]) == manager.blocks_for(len(tokens))
            assert cached % block_size == 0 and 0 <= cached <= len(tokens) - 1
            if not caching:
                assert cached == 0
            event("prefix hit" if cached else "no prefix hit")
            shadow.check(request_id, tokens, cached)  # the hit blocks hold exactly this prefix's K/V
            shadow.compute(request_id, tokens, cached, len(tokens))
            if caching:
                manager.cache_full_blocks(request_id, tokens, len(tokens))
            live[request_id] = tokens
        elif op == "append" and request_id in live:
            tokens = live[request_id]
            grown = tokens + [extra + 1] * (amount % 6)
            if not manager.can_append_slots(request_id, len(grown)):
                continue
            manager.append_slots(request_id, len(grown))
            assert len(manager.block_tables[request_id]) == manager.blocks_for(len(grown))
            shadow.compute(request_id, grown, len(tokens), len(grown))
            if caching:
                manager.cache_full_blocks(request_id, grown, len(grown))
            live[request_id] = grown
        elif op in ("free", "preempt") and request_id in live:
            tokens = live.pop(request_id)
            manager.free(request_id)
            if op == "preempt":  # it keeps its tokens and asks for blocks again later
                preempted[request_id] = tokens
        check_block_manager(manager, live)
        for request_id, tokens in live.items():
            shadow.check(request_id, tokens, len(tokens))
    for request_id in list(live):
        manager.free(request_id)
    check_all_returned(manager)


# --------------------------------------------------------------------------- property tests: the schedulers


SCHEDULERS = {"m05": (PagedScheduler, BlockManager), "m06": (PrefixCachingScheduler, PrefixCachingBlockManager),
              "m07": (ChunkedPrefillScheduler, PrefixCachingBlockManager)}


@st.composite
def workloads(draw) -> dict:
    """Prompts sharing prefixes, output lengths, arrival steps, aborts, and a cache each request fits alone."""
    prompts = draw(prompt_families())
    max_tokens = [draw(st.integers(1, 10)) for _ in prompts]
    block_size = draw(st.integers(1, 4))
    largest = max(-(-(len(p) + n - 1) // block_size) for p, n in zip(prompts, max_tokens))  # engine's limit
    return dict(prompts=prompts, max_tokens=max_tokens, block_size=block_size,
                num_blocks=largest + draw(st.integers(0, 4)), max_num_seqs=draw(st.integers(1, 6)),
                budget=draw(st.integers(1, 24)), watermark=draw(st.integers(0, 2)),
                arrivals=[draw(st.integers(0, 10)) for _ in prompts],
                aborts=draw(st.lists(st.tuples(st.integers(0, 30), st.integers(0, 5)), max_size=2)))


def check_step(kind: str, budget: int, max_num_seqs: int, out, waiting_before: list[Sequence],
               running_before: list[Sequence], decoders_before: list[Sequence], scheduler) -> None:
    scheduled = [item.seq for item in out.scheduled]
    assert scheduled, "an empty step while requests are unfinished"
    assert len(set(scheduled)) == len(scheduled) and all(item.num_new_tokens >= 1 for item in out.scheduled)
    assert len(scheduler.running) <= max_num_seqs
    # The token budget: m07 always; m05/m06 except a prompt larger than it, admitted alone.
    if out.num_batched_tokens > budget:
        assert kind != "m07" and scheduled == out.admitted and len(scheduled) == 1
    # FCFS: whoever is admitted is the head of the queue, in order.
    assert out.admitted == waiting_before[:len(out.admitted)]
    # Preemption: only the newest running requests go (never one older than a request that stays), nobody is
    # admitted in the same step, and they return to the front of the queue, oldest first.
    if out.preempted:
        assert not out.admitted
        for victim in out.preempted:
            assert all(running_before.index(s) < running_before.index(victim) for s in scheduler.running)
            assert victim.num_computed_tokens == 0 and victim.request_id not in scheduler.block_manager.block_tables
        assert list(scheduler.waiting)[:len(out.preempted)] == sorted(out.preempted, key=running_before.index)
    if kind != "m07":  # a step either admits (and prefills only those) or decodes every running request
        if out.admitted:
            assert scheduled == out.admitted
        else:
            assert all(item.num_new_tokens == 1 for item in out.scheduled)
            assert set(scheduled) | set(out.preempted) == set(running_before)
    else:
        # Decodes never starve: with room in the budget, every running request gets its step (or is preempted);
        # new requests are admitted only after every running one has been served.
        if len(running_before) <= budget:
            assert set(scheduled) | set(out.preempted) >= set(decoders_before)
        if out.admitted:
            assert set(running_before) <= set(scheduled)


@pytest.mark.parametrize("kind", ["m05", "m06", "m07"])
@PROPERTY
@given(workload=workloads())
def test_scheduler_invariants_and_exact_tokens_under_random_workloads(kind, workload):
    scheduler_class, manager_class = SCHEDULERS[kind]
    w = workload
    manager = manager_class(w["num_blocks"], w["block_size"])
    # m05/m06 decode every running request in one step whatever the budget, so there (as vLLM requires) the
    # budget is at least max_num_seqs; m07 serves decodes from the budget too, and any budget >= 1 works.
    budget = w["budget"] if kind == "m07" else max(w["budget"], w["max_num_seqs"])
    scheduler = scheduler_class(w["max_num_seqs"], budget, manager, w["watermark"])
    engine = FakeEngine(scheduler)
    seqs = [make_seq(f"r{i}", p, n) for i, (p, n) in enumerate(zip(w["prompts"], w["max_tokens"]))]
    arrived: list[Sequence] = []
    aborted: set[Sequence] = set()
    step = 0
    while len(arrived) < len(seqs) or scheduler.has_unfinished():
        arrived += [seq for seq, at in zip(seqs, w["arrivals"]) if at == step]
        for seq in arrived[len(arrived) - sum(at == step for at in w["arrivals"]):]:
            scheduler.add(seq)
        for at, who in w["aborts"]:
            seq = seqs[who % len(seqs)]
            if at == step and seq in arrived and not seq.is_finished:
                assert scheduler.abort(seq.request_id) is seq
                seq.finish(0.0, "abort")
                aborted.add(seq)
        check_block_manager(manager, {s.request_id: s.all_token_ids for s in scheduler.running})
        for seq in scheduler.running:  # blocks for what is computed, at most for every token it has
            table = manager.block_tables[seq.request_id]
            assert manager.blocks_for(seq.num_computed_tokens) <= len(table) <= manager.blocks_for(seq.num_tokens)
        if scheduler.has_unfinished():
            waiting_before, running_before = list(scheduler.waiting), list(scheduler.running)
            decoders_before = [s for s in running_before if s.num_uncomputed_tokens == 1]
            out = engine.step()
            check_step(kind, budget, w["max_num_seqs"], out, waiting_before, running_before, decoders_before,
                       scheduler)
            if out.preempted:
                event("preemption")
            if any(s.num_cached_tokens for s in out.admitted):
                event("prefix hit at admission")
            if any(item.seq.num_computed_tokens < item.seq.num_prompt_tokens for item in out.scheduled):
                event("a prompt chunk that stops before the prompt's end")
        step += 1
        assert step < 1000, "no progress"
    for seq in seqs:
        if seq not in aborted:
            assert seq.output_token_ids == solo_tokens(seq.prompt_token_ids, seq.params.max_tokens)
            assert seq.num_cached_tokens % w["block_size"] == 0 and seq.num_cached_tokens < seq.num_prompt_tokens
            if kind == "m05":
                assert seq.num_cached_tokens == 0
    check_all_returned(manager)
