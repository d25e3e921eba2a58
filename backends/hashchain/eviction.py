"""The block pool's eviction order, an object the pool is given: ``FreeQueueLRU`` (vLLM's one
order, the free queue's) or ``RankedEviction`` (ours, a policy's order over the free cached
blocks); ``make_eviction_order`` picks one by policy name. Both take the pool's hooks (blocks
taken, cached, hit, freed, uncached, evicted, a request admitted and released), so neither the
pool nor the manager asks which one it has; what a policy learns (lrp) stays inside it.

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

from collections.abc import Callable, Collection, Iterable, Sequence
from functools import partial
from typing import Any, Protocol

from prefixcache.backends.hashchain.block import KVCacheBlock, RankedKVCacheBlock
from prefixcache.backends.hashchain.free_queue import FreeKVCacheBlockQueue, LazyBlocks

from prefixcache.eviction import (
    LEAF_LRU,
    EvictionPolicy,
    LearnedReuse,
    admit,
    forget,
    keys_stay_fresh,
    make_index,
    make_policy,
    note_eviction,
)
from prefixcache.interface import ensure
from prefixcache.request import Request


class BlockPool(Protocol):
    """What an eviction order reads and calls of the pool that owns it (block_pool.py)."""

    free_block_queue: FreeKVCacheBlockQueue
    num_cached_free_blocks: int
    blocks: LazyBlocks

    def _maybe_evict_cached_block(self, block: KVCacheBlock) -> bool: ...

    def _uncache_free_block(self, block: KVCacheBlock) -> bool: ...

# A request's lookup keys within its hit cap, built only if an order asks for them.
LookupKeys = Callable[[Request], Sequence[Any]]


class FreeQueueLRU:
    """vLLM's order: the free queue's head goes first (unhashed blocks are prepended, cached
    ones appended as freed). Nothing to keep beside the queue, so every hook but the two that
    take blocks is empty."""

    num_orphaned_blocks = 0
    caches_partial_blocks = True  # vLLM's partial-tail keys (a block cached by a later key)
    needs_unhashed_first = False  # one queue: unhashed blocks may go to its tail (the ablation)
    make_block: Callable[[int], KVCacheBlock] = KVCacheBlock

    def take(self, pool: BlockPool, num_blocks: int) -> list[KVCacheBlock]:
        return pool.free_block_queue.popleft_n(num_blocks)

    def evict(self, pool: BlockPool, num_blocks: int) -> int:
        """Drop the hashes of up to ``num_blocks`` cached free blocks from the queue's head."""
        dropped = 0
        queue = pool.free_block_queue
        block = queue.fake_free_list_head.next_free_block
        while dropped < num_blocks and block is not None and block is not queue.fake_free_list_tail:
            if block.block_hash is not None:
                pool.num_cached_free_blocks -= 1
                dropped += pool._maybe_evict_cached_block(block)
            block = block.next_free_block
        return dropped

    def on_cached(self, blocks: list[KVCacheBlock], cached_at: Iterable[int], num_prompt_blocks: int) -> None:
        pass

    def on_hit(self, blocks: Sequence[KVCacheBlock]) -> None:
        pass

    def on_freed(self, released: list[KVCacheBlock]) -> None:
        pass

    def uncached(self, block: KVCacheBlock) -> None:
        pass

    def requeue_uncached(self, pool: BlockPool, block: KVCacheBlock) -> None:
        pass  # vLLM's one queue leaves a block that lost its hash where it is

    def admitted(self, request: Request, hit_blocks: Sequence[KVCacheBlock], lookup: LookupKeys) -> None:
        pass

    def released(self, request: Request) -> None:
        pass

    def check(self, pool: BlockPool, free_blocks: list[KVCacheBlock]) -> None:
        pass

    def check_requests(self, live: Collection[str]) -> None:
        pass


class RankedEviction:
    __slots__ = (
        "policy", "learner", "clock", "num_orphaned_blocks", "make_block", "_index", "_entry", "seen_fraction"
    )  # fmt: skip

    caches_partial_blocks = False  # ours: the index ranks full blocks only
    needs_unhashed_first = True  # unhashed free blocks are taken from the queue's head

    def __init__(self, policy: EvictionPolicy, block_size: int = 0) -> None:
        self.policy = policy
        # lrp learns from hits, frees and evictions, and from requests as they come and go
        self.learner = policy if isinstance(policy, LearnedReuse) else None
        self.clock = 0  # logical time: one tick per pool operation
        self.num_orphaned_blocks = 0
        self.make_block = partial(RankedKVCacheBlock, num_tokens=block_size)
        self._index = make_index(policy)  # (key, -depth, block_id, block)
        self._entry: dict[int, tuple] = {}
        # lrp: each admitted request's hit fraction as the ghost saw it, until it is released
        self.seen_fraction: dict[str, float] = {}

    def tick(self) -> int:
        self.clock += 1
        return self.clock

    def __len__(self) -> int:
        return len(self._index)

    # ---------------------------------------------------------------- the pool's hooks
    def take(self, pool: BlockPool, num_blocks: int) -> list[KVCacheBlock]:
        """Free blocks without a hash first (the queue's head), then the policy's victims,
        each evicted at once so that its parent may be the next; with no free cached leaf
        left, the queue's head (orphaning its children, counted)."""
        queue = pool.free_block_queue
        out = queue.popleft_n(min(num_blocks, queue.num_free_blocks - pool.num_cached_free_blocks))
        while len(out) < num_blocks:
            victim: KVCacheBlock | None = self.pop_victim()
            if victim is None:
                victim = queue.popleft()
            else:
                queue.remove(victim)
            pool.num_cached_free_blocks -= 1
            pool._maybe_evict_cached_block(victim)
            out.append(victim)
        return out

    def evict(self, pool: BlockPool, num_blocks: int) -> int:
        """Uncache up to ``num_blocks`` of the policy's victims (they stay free)."""
        dropped = 0
        while dropped < num_blocks:
            victim = self.pop_victim()
            if victim is None:
                break  # every free cached block left is a parent whose child is in use
            dropped += pool._uncache_free_block(victim)
        return dropped

    def on_cached(self, blocks: list[KVCacheBlock], cached_at: Iterable[int], num_prompt_blocks: int) -> None:
        """``blocks[i]`` for each ``i`` of ``cached_at`` just got its hash."""
        now = self.tick()
        for i in cached_at:
            before = blocks[i - 1] if i else None
            parent = before if before is not None and before.block_hash is not None else None
            self.cached(blocks[i], parent, i, i < num_prompt_blocks, now)  # type: ignore[arg-type]

    def on_hit(self, blocks: Sequence[KVCacheBlock]) -> None:
        now = self.tick()
        for block in blocks:
            if not block.is_null:
                self.hit(block, now)  # type: ignore[arg-type]

    def on_freed(self, released: list[KVCacheBlock]) -> None:
        """``released`` reached ref_cnt 0, in the caller's order (a request's table tail first):
        tlru reads the cached tokens after each block (full blocks only, as radix's
        page-aligned key)."""
        now = self.tick()
        after = 0
        for block in released:
            if block.block_hash is not None:
                self.freed(block, now, after)  # type: ignore[arg-type]
                after += block.num_tokens  # type: ignore[attr-defined]

    def requeue_uncached(self, pool: BlockPool, block: KVCacheBlock) -> None:
        """Unhashed free blocks are taken from the queue's head: one that lost its hash moves there."""
        pool.free_block_queue.remove(block)
        pool.free_block_queue.prepend_n((block,))

    def admitted(self, request: Request, hit_blocks: Sequence[KVCacheBlock], lookup: LookupKeys) -> None:
        """lrp: the request's lookup (``lookup(request)``) against the ghost beyond its hit
        (``hit_blocks``, group 0's, nulls aside), as it is admitted."""
        if self.learner is not None:
            num_hit_blocks = sum(1 for b in hit_blocks if not b.is_null)
            self.seen_fraction[request.request_id] = self.learner.begin(
                lookup(request), num_hit_blocks, self.tick()
            )

    def released(self, request: Request) -> None:
        """lrp: the released request's class is known now (its blocks take it as freed)."""
        if self.learner is not None:
            seen = self.seen_fraction.pop(request.request_id, 0.0)
            self.learner.classify(seen, request.num_prompt_tokens, request.num_output_tokens)

    # ---------------------------------------------------------------- per block
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

    def check(self, pool: BlockPool, free_blocks: list[KVCacheBlock]) -> None:
        """InvariantError unless the index holds exactly the free cached leaves, with fresh
        keys, every child count is right, and no unhashed free block sits behind a cached one
        in the queue (``free_blocks``: the queue head to tail, as the pool's check walked it)."""
        unhashed = len(free_blocks) - pool.num_cached_free_blocks
        ensure(
            all(b.block_hash is None for b in free_blocks[:unhashed]),
            "ranked policy: a free block without a hash behind a cached one in the queue",
        )
        blocks: list[RankedKVCacheBlock] = list(pool.blocks)  # type: ignore[arg-type]
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

    def check_requests(self, live: Collection[str]) -> None:
        """InvariantError if lrp keeps state for a request that is not ``live``."""
        ensure(set(self.seen_fraction) <= set(live), "lrp keeps state for a request that is not live")


EvictionOrder = FreeQueueLRU | RankedEviction


def make_eviction_order(eviction_policy: str, num_blocks: int, block_size: int) -> EvictionOrder:
    """The order for a pool of ``num_blocks`` usable blocks of ``block_size`` tokens.

    "lru" is vLLM's, the free queue's order. Any other name of ``prefixcache.eviction`` ranks
    the free cached leaf blocks (``RankedEviction``, ours); free blocks without a hash still go
    first, and then stay at the queue's head. ``"leaf-lru"`` is that ranking under LRU:
    SGLang's eviction order over blocks."""
    leaf_lru = isinstance(eviction_policy, str) and eviction_policy.lower() == LEAF_LRU
    # validates the name
    policy = make_policy("lru" if leaf_lru else eviction_policy, capacity=num_blocks)
    ranked = leaf_lru or eviction_policy.lower() != "lru"
    return RankedEviction(policy, block_size) if ranked else FreeQueueLRU()
