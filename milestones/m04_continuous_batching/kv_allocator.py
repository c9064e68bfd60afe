"""Contiguous K/V regions carved out of one pool: first fit, reserved for a request's maximum length.

Continuous batching admits a request while others are mid-decode, so each request needs K/V space of its
own. The simplest scheme gives it ONE contiguous range of pool slots, large enough for the longest it can
get (prompt + max_tokens), reserved up front so it can never run out halfway::

    pool:  [ A: 300 reserved, 120 used | B: 700 reserved, 40 used | free 500 | C: 200 reserved ... ]

Two kinds of waste follow, and ``stats`` puts numbers on both:

* **over-reservation**: most of a range waits for tokens that arrive late or never (a request that stops at
  EOS after 10 of its 1,000 tokens still held 1,000 slots);
* **fragmentation**: freed ranges leave holes; a request can be refused although the free slots add up to
  enough, because no single hole is long enough.

Paged K/V (m05) removes both by handing out small fixed-size blocks on demand. Pure Python: no torch here.
"""

from __future__ import annotations


class ContiguousAllocator:
    """First-fit allocator of ``[start, start + length)`` ranges over ``capacity`` slots."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._free: list[tuple[int, int]] = [(0, capacity)]  # (start, length), sorted by start, never adjacent
        self._regions: dict[str, tuple[int, int]] = {}  # owner -> (start, length)

    def allocate(self, owner: str, length: int) -> int | None:
        """Reserve ``length`` contiguous slots for ``owner``; return the first slot, or None if no hole fits."""
        if owner in self._regions:
            raise ValueError(f"{owner!r} already holds a region")
        for i, (start, free_length) in enumerate(self._free):
            if free_length >= length:
                if free_length == length:
                    del self._free[i]
                else:
                    self._free[i] = (start + length, free_length - length)
                self._regions[owner] = (start, length)
                return start
        return None

    def free(self, owner: str) -> None:
        """Give ``owner``'s region back, merging it with free neighbours."""
        start, length = self._regions.pop(owner)
        self._free.append((start, length))
        self._free.sort()
        merged: list[tuple[int, int]] = []
        for s, n in self._free:
            if merged and merged[-1][0] + merged[-1][1] == s:
                merged[-1] = (merged[-1][0], merged[-1][1] + n)
            else:
                merged.append((s, n))
        self._free = merged

    def start_of(self, owner: str) -> int:
        return self._regions[owner][0]

    @property
    def reserved_slots(self) -> int:
        return sum(length for _, length in self._regions.values())

    @property
    def free_slots(self) -> int:
        return self.capacity - self.reserved_slots

    @property
    def largest_free_range(self) -> int:
        return max((length for _, length in self._free), default=0)
