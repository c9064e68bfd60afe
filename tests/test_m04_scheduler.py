"""m04's scheduler and K/V allocator, alone: fake-free (they are pure Python), and proven torch-free."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from milestones.m01_naive_loop.request import Request
from milestones.m01_naive_loop.sampling_params import SamplingParams
from milestones.m04_continuous_batching.kv_allocator import ContiguousAllocator
from milestones.m04_continuous_batching.scheduler import Scheduler

ROOT = Path(__file__).resolve().parents[1]


def make_request(request_id: str, prompt_len: int, max_tokens: int) -> Request:
    return Request(request_id, [1] * prompt_len, SamplingParams(max_tokens=max_tokens), frozenset())


def imported_modules(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative import: resolve against the file's package
                package = path.parent.relative_to(ROOT).parts
                base = ".".join(package[: len(package) - node.level + 1] + ((base,) if base else ()))
            names.add(base)
    return names


def torch_reachable(path: Path, seen: set[Path] | None = None) -> bool:
    """Does this module, or any milestones module it imports (module files, not package __init__s), import torch?"""
    seen = set() if seen is None else seen
    if path in seen:
        return False
    seen.add(path)
    for name in imported_modules(path):
        if name.split(".")[0] == "torch":
            return True
        if name.startswith("milestones."):
            target = ROOT / (name.replace(".", "/") + ".py")
            if target.is_file() and torch_reachable(target, seen):
                return True
    return False


@pytest.mark.parametrize("module", ["scheduler.py", "kv_allocator.py"])
def test_scheduler_and_allocator_import_no_torch(module):
    assert not torch_reachable(ROOT / "milestones" / "m04_continuous_batching" / module)


def test_the_torch_check_can_fail():
    assert torch_reachable(ROOT / "milestones" / "m04_continuous_batching" / "engine.py")


def test_allocator_first_fit_merge_and_fragmentation():
    allocator = ContiguousAllocator(100)
    assert allocator.allocate("a", 30) == 0
    assert allocator.allocate("b", 30) == 30
    assert allocator.allocate("c", 30) == 60
    assert allocator.allocate("d", 20) is None  # only 10 left
    allocator.free("a")
    allocator.free("c")
    # 70 slots are free, but in holes of 30 and 40: a 50-slot request cannot be placed (fragmentation).
    assert allocator.free_slots == 70 and allocator.largest_free_range == 40
    assert allocator.allocate("e", 50) is None
    assert allocator.allocate("f", 25) == 0  # first fit: the first hole that is long enough
    allocator.free("b")
    allocator.free("f")
    assert allocator.largest_free_range == 100  # holes merged back into one
    assert allocator.allocate("g", 1) == 0
    with pytest.raises(ValueError, match="already holds"):
        allocator.allocate("g", 1)


def test_admission_is_fcfs_and_bounded_by_max_num_seqs():
    scheduler = Scheduler(max_num_seqs=2, allocator=ContiguousAllocator(1000))
    for i in range(4):
        scheduler.add(make_request(str(i), 10, 10))
    first = scheduler.schedule()
    assert [r.request_id for r in first.prefills] == ["0", "1"] and not first.decodes
    second = scheduler.schedule()
    assert not second.prefills and [r.request_id for r in second.decodes] == ["0", "1"]
    scheduler.running[0].finish(0.0, "length")
    assert [r.request_id for r in scheduler.remove_finished()] == ["0"]
    third = scheduler.schedule()
    assert [r.request_id for r in third.prefills] == ["2"]  # a freed seat is taken at the next step
    assert [r.request_id for r in scheduler.running] == ["1", "2"]


def test_head_of_line_waits_for_kv_space():
    scheduler = Scheduler(max_num_seqs=8, allocator=ContiguousAllocator(50))
    scheduler.add(make_request("big0", 20, 11))  # 30 slots
    scheduler.add(make_request("big1", 20, 11))  # 30 slots: does not fit next to big0
    scheduler.add(make_request("small", 2, 2))  # 3 slots: would fit, but FCFS keeps it behind big1
    assert [r.request_id for r in scheduler.schedule().prefills] == ["big0"]
    assert [r.request_id for r in scheduler.schedule().decodes] == ["big0"]
    scheduler.running[0].finish(0.0, "stop")
    scheduler.remove_finished()
    assert [r.request_id for r in scheduler.schedule().prefills] == ["big1", "small"]


def test_abort_waiting_and_running():
    allocator = ContiguousAllocator(100)
    scheduler = Scheduler(max_num_seqs=1, allocator=allocator)
    scheduler.add(make_request("r", 5, 5))
    scheduler.add(make_request("w", 5, 5))
    scheduler.schedule()
    assert allocator.reserved_slots == 9
    assert scheduler.abort("w").request_id == "w"
    assert scheduler.abort("r").request_id == "r"
    assert allocator.reserved_slots == 0
    assert scheduler.abort("r") is None
    assert not scheduler.has_unfinished()
