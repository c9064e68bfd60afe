"""Paged K/V memory: fixed-size blocks handed out as tokens arrive. Pure Python, no torch.

m04 reserved one contiguous region per request, sized for the longest the request could ever get. Here the
K/V pool is cut into ``num_blocks`` blocks of ``block_size`` token slots each, and a request owns a **block
table**: the list of its blocks, in order. Token ``p`` of a request lives in slot::

    slot(p) = block_table[p // block_size] * block_size + p % block_size

    request A, 37 tokens, block_size 16:   block_table = [7, 2, 12]
        block 7:  tokens  0..15   (full)
        block 2:  tokens 16..31   (full)
        block 12: tokens 32..36   (5 of 16 slots used; the other 11 are the only memory A wastes)

Blocks are taken from the free list only when a request's tokens reach them, so memory follows what requests
actually hold, not what they might hold; any free block serves any request, so nothing fragments.

Invariants (the property tests in ``tests/test_m05_block_manager.py`` check them after every operation):

* every block is either free (``ref_count == 0``, in ``free_block_ids``) or used (``ref_count > 0``), never both,
  so ``num_free_blocks + num_used_blocks == num_blocks``;
* a block's ``ref_count`` equals the number of block tables it appears in (in m05 always 0 or 1; m06's prefix
  cache lets several tables share a block);
* a table of a request holding ``n`` tokens has exactly ``ceil(n / block_size)`` blocks.
"""

from __future__ import annotations

from collections.abc import Sequence as Seq


class Block:
    """One block of ``block_size`` K/V slots, and how many block tables hold it."""

    __slots__ = ("block_id", "ref_count")

    def __init__(self, block_id: int) -> None:
        self.block_id = block_id
        self.ref_count = 0

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.block_id}, ref={self.ref_count})"


class NoFreeBlocksError(RuntimeError):
    """Raised when a block is asked for and none is free (a scheduler checks ``can_*`` first, so: a bug)."""


class BlockManager:
    """Free list, reference counts and one block table per request id."""

    block_class = Block

    def __init__(self, num_blocks: int, block_size: int) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"need at least one block of at least one slot, got {num_blocks} x {block_size}")
        self.block_size = block_size
        self.blocks = [self.block_class(i) for i in range(num_blocks)]
        # Insertion-ordered set of free block ids: blocks freed first are handed out first. m06 relies on that
        # order to evict its least recently used cached blocks first.
        self.free_block_ids: dict[int, None] = dict.fromkeys(range(num_blocks))
        self.block_tables: dict[str, list[int]] = {}

    # ------------------------------------------------------------------ sizes

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_block_ids)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - self.num_free_blocks

    def blocks_for(self, num_tokens: int) -> int:
        """Blocks needed to hold ``num_tokens`` tokens: ``ceil(num_tokens / block_size)``."""
        return -(-num_tokens // self.block_size)

    # ------------------------------------------------------------------ a new request

    def can_allocate(self, token_ids: Seq[int], reserve: int = 0) -> bool:
        """Could a new request holding these tokens get its blocks now, leaving ``reserve`` blocks free?"""
        return self.blocks_for(len(token_ids)) + reserve <= self.num_free_blocks

    def allocate(self, request_id: str, token_ids: Seq[int]) -> int:
        """Give a new request a table holding ``len(token_ids)`` tokens. Returns how many leading tokens are
        already computed in the cache: 0 here (m06's prefix cache finds some)."""
        if request_id in self.block_tables:
            raise ValueError(f"request {request_id!r} already holds blocks")
        self.block_tables[request_id] = [self._take_free_block() for _ in range(self.blocks_for(len(token_ids)))]
        return 0

    # ------------------------------------------------------------------ a growing request

    def can_append_slots(self, request_id: str, num_tokens: int) -> bool:
        """Could the request's table grow to hold ``num_tokens`` tokens?"""
        return self._missing_blocks(request_id, num_tokens) <= self.num_free_blocks

    def append_slots(self, request_id: str, num_tokens: int) -> None:
        """Grow the table to hold ``num_tokens`` tokens (a decode step: one more). A new block is taken only
        when the last one is full, i.e. when the new token's position is a multiple of ``block_size``."""
        table = self.block_tables[request_id]
        for _ in range(self._missing_blocks(request_id, num_tokens)):
            table.append(self._take_free_block())

    def _missing_blocks(self, request_id: str, num_tokens: int) -> int:
        return max(0, self.blocks_for(num_tokens) - len(self.block_tables[request_id]))

    # ------------------------------------------------------------------ leaving

    def free(self, request_id: str) -> None:
        """Drop the request's table; every block it held loses one reference, and is free at zero."""
        for block_id in reversed(self.block_tables.pop(request_id)):  # tail first: see m06's LRU order
            block = self.blocks[block_id]
            block.ref_count -= 1
            if block.ref_count == 0:
                self._release(block)

    # ------------------------------------------------------------------ slots

    def slot(self, request_id: str, position: int) -> int:
        """The pool slot of the request's token at ``position``."""
        table = self.block_tables[request_id]
        return table[position // self.block_size] * self.block_size + position % self.block_size

    # ------------------------------------------------------------------ the free list (m06 overrides these)

    def _take_free_block(self) -> int:
        if not self.free_block_ids:
            raise NoFreeBlocksError("no free K/V block; the scheduler should have checked can_allocate first")
        block_id = next(iter(self.free_block_ids))
        del self.free_block_ids[block_id]
        self.blocks[block_id].ref_count = 1
        return block_id

    def _release(self, block: Block) -> None:
        self.free_block_ids[block.block_id] = None
