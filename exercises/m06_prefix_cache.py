"""Build it, m06: ``cached_prefix``, the lookup that finds a prompt's longest cached prefix.

Every full block the engine computes is registered under a chained hash (``cache_full_blocks``, already
written): ``block.hash = block_hash(parent_hash, token ids of the block)``, where ``parent_hash`` is the hash
of the block before it, or ``ROOT_HASH`` for a sequence's first block. Write the lookup that walks a new
prompt block by block and returns the blocks that already hold its K/V; ``allocate`` (inherited from m06's
``PrefixCachingBlockManager``) calls it and shares what it returns.

What is there to use:

* ``self.block_size``; ``self.enable_caching`` (False: nothing is ever found);
* ``self.cached_blocks``: hash -> block id, for every findable block;
* ``self.blocks[block_id]``: a ``CachedBlock`` with ``.hash``, ``.parent_hash`` and ``.token_ids`` (a tuple);
* ``block_hash(parent_hash, token_ids_tuple)`` and ``ROOT_HASH``, imported below.

Check your version (docs/m06-prefix-cache.md, "Build it", has the task and a folded reference answer):

    .venv/bin/python -m pytest tests/exercises -k m06 --solution exercises/m06_prefix_cache.py
"""

from __future__ import annotations

from collections.abc import Sequence as Seq

from milestones.m06_prefix_cache.block_manager import ROOT_HASH, block_hash  # noqa: F401 - yours to use
from milestones.m06_prefix_cache.block_manager import PrefixCachingBlockManager as CachingBlockManager

EXERCISE = "m06"  # which exercise this file answers: the tests look for it


class PrefixCachingBlockManager(CachingBlockManager):
    def cached_prefix(self, token_ids: Seq[int]) -> list[int]:
        """Block ids of the longest run of cached *full* blocks at the start of ``token_ids``, looking only at
        the blocks that lie entirely within the first ``len(token_ids) - 1`` tokens (the last prompt token is
        always computed: its logits give the first output token). Stop at the first block that is not found.
        A hit must be confirmed: the cached block's token ids and parent hash must be this prompt's, so that a
        hash collision can never serve another prefix's K/V."""
        raise NotImplementedError("exercise m06: write PrefixCachingBlockManager.cached_prefix")
