"""Build it, m05: the block manager's ``allocate``, ``append_slots`` and ``free``.

Paged K/V memory is bookkeeping: a free list of block ids, a reference count per block, and one block table
per request. Write the three methods that hand blocks out and take them back; everything around them is
inherited from m05's ``BlockManager`` and already works:

* ``self.block_size``; ``self.blocks`` (``Block`` objects: ``.block_id``, ``.ref_count``);
  ``self.block_tables`` (request id -> list of block ids, in token order); ``self.blocks_for(n)`` (blocks needed
  to hold ``n`` tokens: ``ceil(n / block_size)``);
* ``self._take_free_block()``: removes the block at the front of the free list, sets its ``ref_count`` to 1 and
  returns its id (``NoFreeBlocksError`` when none is free: the scheduler checks ``can_allocate`` first);
* ``self._release(block)``: puts a block whose ``ref_count`` reached 0 at the back of the free list.

Check your version (docs/m05-paged-blocks.md, "Build it", has the task and a folded reference answer):

    .venv/bin/python -m pytest tests/exercises -k m05 --solution exercises/m05_block_manager.py
"""

from __future__ import annotations

from collections.abc import Sequence as Seq

from milestones.m05_paged_blocks.block_manager import BlockManager as PagedBlockManager

EXERCISE = "m05"  # which exercise this file answers: the tests look for it


class BlockManager(PagedBlockManager):
    def allocate(self, request_id: str, token_ids: Seq[int]) -> int:
        """Give a new request a block table holding ``len(token_ids)`` tokens, its blocks taken from the front
        of the free list in order. Return how many leading tokens are already computed: 0 in m05. A request
        id that already holds blocks is a ``ValueError``."""
        raise NotImplementedError("exercise m05: write BlockManager.allocate")

    def append_slots(self, request_id: str, num_tokens: int) -> None:
        """Grow the request's table to hold ``num_tokens`` tokens: a new block only when the ones it has are
        full (asking for fewer tokens than the table holds changes nothing)."""
        raise NotImplementedError("exercise m05: write BlockManager.append_slots")

    def free(self, request_id: str) -> None:
        """Drop the request's table. Every block in it loses one reference; a block left with none goes back
        to the free list. Free the table's blocks tail first (the last block first): m06 relies on that order
        to evict a prefix's last blocks before its first ones."""
        raise NotImplementedError("exercise m05: write BlockManager.free")
