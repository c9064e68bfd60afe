"""The prefix cache: full blocks found again by a chained hash, shared by reference count, kept after free.

Two requests that start with the same tokens (a system prompt, a few-shot preamble, an earlier chat turn)
compute the same keys and values for them, because a token's K/V depends only on the tokens before it. So a
*full* block can be named by everything that determines its contents::

    hash(block i) = hash( hash(block i - 1),  token ids of block i )          (block 0 chains from ROOT)

    request A:  [ system prompt ........................ | A's question ]
                  h0 = H(ROOT, t0..t15)  h1 = H(h0, t16..t31)  ...
    request B:  [ system prompt ........................ | B's question ]   same h0, h1, ... -> same blocks

The chain makes a block's name depend on its whole prefix, so two equal blocks after different prefixes never
meet. A table ``hash -> block id`` finds them; a hit is confirmed by comparing the block's token ids (and its
parent's hash), so even a hash collision cannot serve wrong K/V.

* **Sharing**: a hit block gets one more reference (``ref_count``) instead of a copy. It is read-only: only
  full blocks are shared, and a request writes only to its own last, partial block.
* **Keeping**: a block whose last reference goes is put on the free list *with its contents and hash*. Until
  the free list hands it out again (oldest freed first: least recently used), a new request can still hit it.
* **Where the prefill starts**: at admission, the longest run of cached full blocks that lies within the first
  ``len(prompt) - 1`` tokens is reused, so a prompt that is cached entirely still computes at least its last
  token (its logits give the first output token). As in vLLM, hits are whole blocks: a prompt of exactly ``k``
  blocks reuses ``k - 1`` of them and computes the last block again.
* **When a block becomes findable**: when the step that computes its last token is scheduled (``cache_full_blocks``).
  Every layer writes the whole step's K/V before any attention reads it, so a request admitted later in the same
  step may already hit it; a block whose tokens are not scheduled yet is never findable (m07 relies on that).
"""

from __future__ import annotations

from collections.abc import Sequence as Seq

from milestones.m05_paged_blocks.block_manager import Block, BlockManager

ROOT_HASH = 0x6E616E6F  # the parent hash of a sequence's first block


def block_hash(parent_hash: int, token_ids: tuple[int, ...]) -> int:
    """Python's ``hash`` of a tuple of ints: 64-bit, and the same in every process (only ``str`` and ``bytes``
    hashes are randomised per process)."""
    return hash((parent_hash, token_ids))


class CachedBlock(Block):
    """A block that may hold a full, registered prefix: its hash, its parent's hash, its tokens."""

    __slots__ = ("hash", "parent_hash", "token_ids")

    def __init__(self, block_id: int) -> None:
        super().__init__(block_id)
        self.forget()

    def forget(self) -> None:
        self.hash: int | None = None
        self.parent_hash: int | None = None
        self.token_ids: tuple[int, ...] = ()


class PrefixCachingBlockManager(BlockManager):
    """m05's block manager, plus ``hash -> block`` lookups, shared blocks, and freed blocks kept until reused."""

    block_class = CachedBlock
    blocks: list[CachedBlock]

    def __init__(self, num_blocks: int, block_size: int, enable_caching: bool = True) -> None:
        super().__init__(num_blocks, block_size)
        self.enable_caching = enable_caching  # False: nothing is ever registered, so nothing is ever found
        self.cached_blocks: dict[int, int] = {}  # hash -> block id
        self._num_registered: dict[str, int] = {}  # request id -> how many of its leading blocks are registered
        self.num_shared_references = 0  # sum over blocks of (ref_count - 1) where above 1: copies NOT stored

    # ------------------------------------------------------------------ lookups

    def cached_prefix(self, token_ids: Seq[int]) -> list[int]:
        """Block ids of the longest cached run of full blocks within the first ``len(token_ids) - 1`` tokens."""
        size, found, parent = self.block_size, [], ROOT_HASH
        if not self.enable_caching:
            return found
        for i in range((len(token_ids) - 1) // size):
            chunk = tuple(token_ids[i * size:(i + 1) * size])
            digest = block_hash(parent, chunk)
            block_id = self.cached_blocks.get(digest)
            if block_id is None:
                break
            block = self.blocks[block_id]
            if block.token_ids != chunk or block.parent_hash != parent:  # a hash collision: not our prefix
                break
            found.append(block_id)
            parent = digest
        return found

    def num_cached_tokens(self, token_ids: Seq[int]) -> int:
        return len(self.cached_prefix(token_ids)) * self.block_size

    # ------------------------------------------------------------------ m05's operations, cache-aware

    def can_allocate(self, token_ids: Seq[int], reserve: int = 0) -> bool:
        hits = self.cached_prefix(token_ids)
        revived = sum(1 for b in hits if self.blocks[b].ref_count == 0)  # hits that sit on the free list
        fresh = self.blocks_for(len(token_ids)) - len(hits)
        return fresh + revived + reserve <= self.num_free_blocks

    def allocate(self, request_id: str, token_ids: Seq[int]) -> int:
        if request_id in self.block_tables:
            raise ValueError(f"request {request_id!r} already holds blocks")
        hits = self.cached_prefix(token_ids)
        for block_id in hits:
            block = self.blocks[block_id]
            if block.ref_count == 0:
                del self.free_block_ids[block_id]  # back from the LRU pool, contents intact
            else:
                self.num_shared_references += 1
            block.ref_count += 1
        fresh = [self._take_free_block() for _ in range(self.blocks_for(len(token_ids)) - len(hits))]
        self.block_tables[request_id] = hits + fresh
        self._num_registered[request_id] = len(hits)
        return len(hits) * self.block_size

    def cache_full_blocks(self, request_id: str, token_ids: Seq[int], num_tokens: int) -> None:
        """Register the request's blocks that are full within its first ``num_tokens`` tokens (those the
        current step computes or earlier steps did), so that later requests can find them."""
        if not self.enable_caching:
            return
        size, table = self.block_size, self.block_tables[request_id]
        first = self._num_registered[request_id]
        for i in range(first, num_tokens // size):
            block = self.blocks[table[i]]
            parent = self.blocks[table[i - 1]].hash if i else ROOT_HASH
            chunk = tuple(token_ids[i * size:(i + 1) * size])
            block.hash, block.parent_hash, block.token_ids = block_hash(parent, chunk), parent, chunk
            # An equal block may be cached already (e.g. the last block of a fully cached prompt, computed
            # again): keep the first one findable; this one still carries its hash, so its children chain on.
            self.cached_blocks.setdefault(block.hash, block.block_id)
        self._num_registered[request_id] = max(first, num_tokens // size)

    def num_registered_blocks(self, request_id: str) -> int:
        return self._num_registered[request_id]

    def free(self, request_id: str) -> None:
        self.num_shared_references -= sum(1 for b in self.block_tables[request_id] if self.blocks[b].ref_count > 1)
        super().free(request_id)
        del self._num_registered[request_id]

    # ------------------------------------------------------------------ the LRU pool

    def _take_free_block(self) -> int:
        """The least recently freed block; if it still holds a cached prefix, that prefix is evicted now."""
        block_id = super()._take_free_block()
        block = self.blocks[block_id]
        if block.hash is not None:
            if self.cached_blocks.get(block.hash) == block_id:
                del self.cached_blocks[block.hash]
            block.forget()
        return block_id

    def reset_cache(self) -> bool:
        """Forget every cached prefix (the blocks stay free, their contents unfindable). Only while no request
        holds blocks, since a running request's blocks may be shared; returns whether it was done."""
        if self.block_tables:
            return False
        for block in self.blocks:
            block.forget()
        self.cached_blocks.clear()
        return True

    @property
    def num_cached_free_blocks(self) -> int:
        """Free blocks that still hold a findable prefix (evicted only when a new block is needed)."""
        return sum(1 for b in self.free_block_ids if self.blocks[b].hash is not None)
