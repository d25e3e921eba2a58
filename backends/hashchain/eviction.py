"""``RankedEviction``: ours, a policy's order over the free cached blocks (vLLM has one order,
the free queue's LRU).

The free queue still holds every free block; this index ranks the free cached *leaf* blocks
(no cached block extends them) by the policy's key, deepest first among equals, so a policy
evicts a chain from its end and never orphans a block (a cached block whose parent is gone
can never hit again). Only when no free cached leaf is left (a sliding-window group can free
a parent while its child is in use) does the pool fall back to the free queue's head and
orphan what that block's children were; ``num_orphaned_blocks`` counts them, as waste.

A key's own inputs change only while its block is out of the index (a hit takes it out of the
free set; it comes back, restamped, when freed), so the fixed policies' keys never go stale.
lrp's keys also read what it has learned, which moves on; they stay as computed when the block
was freed (re-ranking every free block would cost a scan), as in the block model.
"""

from __future__ import annotations

from prefixcache.backends.hashchain.block import RankedKVCacheBlock

from prefixcache.eviction import (
    EvictionPolicy,
    LearnedReuse,
    admit,
    forget,
    keys_stay_fresh,
    make_index,
    note_eviction,
)
from prefixcache.interface import ensure


class RankedEviction:
    __slots__ = ("policy", "learner", "clock", "num_orphaned_blocks", "_index", "_entry")

    def __init__(self, policy: EvictionPolicy) -> None:
        self.policy = policy
        # lrp learns from hits, frees and evictions (the manager tells it about requests)
        self.learner = policy if isinstance(policy, LearnedReuse) else None
        self.clock = 0  # logical time: one tick per pool operation
        self.num_orphaned_blocks = 0
        self._index = make_index(policy)  # (key, -depth, block_id, block)
        self._entry: dict[int, tuple] = {}

    def tick(self) -> int:
        self.clock += 1
        return self.clock

    def __len__(self) -> int:
        return len(self._index)

    # ---------------------------------------------------------------- pool events
    def cached(
        self, block: RankedKVCacheBlock, parent: RankedKVCacheBlock | None, depth: int, prompt: bool, now: int
    ) -> None:
        """``block`` (in use) just got its hash, after ``parent`` in its request's table."""
        block.epoch += 1
        block.creation_time = block.last_access_time = now
        block.hit_count = 1
        block.priority = int(prompt)
        block.depth = depth
        block.num_cached_children = 0
        block.tail_tokens = 0
        block.policy_state = None
        admit(self.policy, block, block.block_hash)
        block.parent = parent
        if parent is not None:
            block.parent_epoch = parent.epoch
            parent.num_cached_children += 1

    def hit(self, block: RankedKVCacheBlock, now: int) -> None:
        """A new request takes cached ``block`` (before its ref_cnt rises)."""
        self._drop(block)
        if self.learner is not None:
            self.learner.reused(block, now)
        block.hit_count += 1
        block.last_access_time = now

    def freed(self, block: RankedKVCacheBlock, now: int, tail_tokens: int = 0) -> None:
        """Cached ``block`` reached ref_cnt 0; ``tail_tokens``: the tokens of the cached blocks
        after it that the same request freed."""
        block.last_access_time = now
        block.tail_tokens = tail_tokens
        if self.learner is not None:
            self.learner.assign(block)
        if block.num_cached_children == 0:
            self._add(block)

    def uncached(self, block: RankedKVCacheBlock) -> None:
        """``block`` loses its hash (evicted, reused or reset): its parent may become a leaf."""
        self._drop(block)
        if block.block_hash is not None:
            forget(self.policy, block, block.block_hash)
            if self.learner is not None:
                self.learner.evicted(block, block.block_hash)
        self.num_orphaned_blocks += block.num_cached_children
        block.num_cached_children = 0
        block.epoch += 1  # orphans' links to it are dead now
        parent, block.parent = block.parent, None
        if parent is not None and parent.epoch == block.parent_epoch:
            parent.num_cached_children -= 1
            if parent.num_cached_children == 0 and parent.ref_cnt == 0 and parent.block_hash is not None:
                self._add(parent)

    def pop_victim(self) -> RankedKVCacheBlock | None:
        """The free cached leaf the policy evicts first (taken out of the index), or None."""
        if not self._index:
            return None
        entry = self._index.pop(0)
        del self._entry[entry[2]]
        note_eviction(self.policy, entry[0])
        return entry[3]  # type: ignore[no-any-return]

    # ---------------------------------------------------------------- index
    def _add(self, block: RankedKVCacheBlock) -> None:
        entry = (self.policy.priority(block), -block.depth, block.block_id, block)
        self._entry[block.block_id] = entry
        self._index.add(entry)

    def _drop(self, block: RankedKVCacheBlock) -> None:
        entry = self._entry.pop(block.block_id, None)
        if entry is not None:
            self._index.remove(entry)

    def check(self, blocks: list[RankedKVCacheBlock]) -> None:
        """InvariantError unless the index holds exactly the free cached leaves, with fresh
        keys, and every child count is right."""
        children = [0] * len(blocks)
        for b in blocks:
            p = b.parent
            if b.block_hash is not None and p is not None and p.epoch == b.parent_epoch:
                ensure(p.block_hash is not None, f"block {b.block_id}'s live parent {p.block_id} has no hash")
                children[p.block_id] += 1
        leaves = set()
        for b in blocks:
            if b.block_hash is None:
                continue
            ensure(
                b.num_cached_children == children[b.block_id],
                f"block {b.block_id}: {b.num_cached_children} cached children kept, "
                f"{children[b.block_id]} found",
            )
            if b.ref_cnt == 0 and children[b.block_id] == 0:
                leaves.add(b.block_id)
        ensure(set(self._entry) == leaves, "ranked index != free cached leaf blocks")
        ensure(len(self._index) == len(self._entry), "ranked index and its sorted list disagree")
        if keys_stay_fresh(self.policy):  # lrp's and gdsf's are stale by design
            for key, _, block_id, block in self._index:
                ensure(key == self.policy.priority(block), f"block {block_id}: stale eviction key")
