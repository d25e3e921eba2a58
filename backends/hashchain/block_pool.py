"""``BlockPool``: allocates, frees, caches and evicts KV blocks (vLLM ``block_pool.py``).

A cached block is a full block registered in ``cached_block_hash_to_block``. It stays a valid
hit after its last user frees it (it then sits in the free queue) until it is popped for reuse:
eviction is lazy.

What the pool is given: its eviction order (eviction.py, vLLM's free queue or a ranked policy)
and its KV-event recorder (events.py, vLLM's ``enable_kv_cache_events``; None: no event code
runs). The calls that store blocks take the request whose blocks they are, as vLLM's do.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from operator import attrgetter
from typing import Any

from prefixcache.backends.hashchain.block import KVCacheBlock
from prefixcache.backends.hashchain.events import BlockPoolEventRecorder
from prefixcache.backends.hashchain.eviction import EvictionOrder, FreeQueueLRU
from prefixcache.backends.hashchain.free_queue import FreeKVCacheBlockQueue, LazyBlocks
from prefixcache.backends.hashchain.hash_map import BlockHashToBlockMap
from prefixcache.backends.hashchain.hashing import BlockHash, BlockHashWithGroupId

from prefixcache.interface import ensure
from prefixcache.request import Request

__all__ = ["BlockHashToBlockMap", "BlockPool"]
_ref_cnt = attrgetter("ref_cnt")
_block_hash = attrgetter("block_hash")


class BlockPool:
    """``num_gpu_blocks`` blocks; block 0 is the null block, so ``num_gpu_blocks - 1`` usable.

    ``unhashed_first`` is our ablation switch (vLLM: always True): freed blocks without a hash
    go to the head of the free queue instead of the tail.

    ``eviction``: the order cached free blocks are evicted in (eviction.py,
    ``make_eviction_order``); None: vLLM's, the free queue's (``FreeQueueLRU``).

    ``dedupe`` is our ablation switch (vLLM: False, it keeps duplicates): a block that fills
    with content already cached under its key is given back at once and the request takes the
    cached block in its place, as SGLang's insert frees a request's duplicate slots.

    ``kv_events``: where the pool's KV events go (vLLM: ``enable_kv_cache_events`` and the
    pool's own queue), None for none.
    """

    def __init__(
        self,
        num_gpu_blocks: int,
        unhashed_first: bool = True,
        eviction: EvictionOrder | None = None,
        dedupe: bool = False,
        kv_events: BlockPoolEventRecorder | None = None,
    ) -> None:
        if num_gpu_blocks < 2:
            raise ValueError(
                f"a BlockPool needs at least 2 blocks (block 0 is the null block), got {num_gpu_blocks}"
            )
        self.num_gpu_blocks = num_gpu_blocks
        self.unhashed_first = unhashed_first
        if not isinstance(dedupe, bool):
            raise ValueError(f"dedupe must be a bool, got {dedupe!r}")
        self.dedupe = dedupe
        self.eviction = FreeQueueLRU() if eviction is None else eviction
        if self.eviction.needs_unhashed_first and not unhashed_first:
            raise ValueError("a ranked eviction_policy needs unhashed_first=True (unhashed blocks go first)")
        # Created on first use (free_queue.LazyBlocks), in the order vLLM's preallocated ones
        # leave the queue: ids, free order and eviction order as vLLM's.
        self.blocks = LazyBlocks(num_gpu_blocks, self.eviction.make_block)
        self.free_block_queue = FreeKVCacheBlockQueue(self.blocks)
        self.cached_block_hash_to_block = BlockHashToBlockMap()
        # A cached block's keys beyond its own hash (partial tails, cache_partial_block), each also
        # in the map; they leave with the block's hash. vLLM keeps a set: we keep insertion order.
        self.cached_block_hashes_by_block: dict[int, list[BlockHashWithGroupId]] = {}
        # The null block stands in for skipped blocks (sliding window); its ref_cnt is not kept.
        self.null_block = self.free_block_queue.popleft()
        self.null_block.is_null = True
        # Ours, not vLLM's: O(1) PageUsage and the evicted-token stat.
        self.num_cached_free_blocks = 0  # free-queue blocks that still carry a hash
        self.num_evicted_blocks = 0  # hashes dropped by eviction (lazy, evict_blocks, LRU evict)
        self.kv_events = kv_events

    # ---------------------------------------------------------------- lookups
    def get_cached_block(self, keys: Sequence[BlockHashWithGroupId]) -> list[KVCacheBlock] | None:
        """One cached block per key (one key per group), or None unless every group hits.

        vLLM takes the block hash and the group ids; we take the keys, which a request's
        hasher record builds once (``RequestHashes.keys``)."""
        out: list[KVCacheBlock] = []
        for key in keys:
            block = self.cached_block_hash_to_block.get_one_block(key)
            if block is None:
                return None
            out.append(block)
        return out

    def get_num_free_blocks(self) -> int:
        return self.free_block_queue.num_free_blocks

    # ---------------------------------------------------------------- state changes
    def cache_full_blocks(
        self,
        request: Request,
        block_keys: Sequence[BlockHashWithGroupId],
        blocks: list[KVCacheBlock],
        num_cached_blocks: int,
        num_full_blocks: int,
        num_prompt_blocks: int = 0,
        block_mask: Sequence[bool] | None = None,
    ) -> None:
        """Register ``request``'s ``blocks[num_cached_blocks:num_full_blocks]`` under their keys.

        vLLM takes the group id and reads the hashes off the request; we take the request's keys
        of that group (``RequestHashes.keys``, built once per block), so the pool stays
        hash-agnostic. The request itself only names the blocks' tokens in KV events.
        ``num_prompt_blocks``: blocks wholly inside the prompt (the ``priority`` policy's input).
        ``block_mask`` (vLLM 0.33): one flag per block of that range; a False block stays
        unhashed (sparse sliding-window retention: no hit can ever read it).
        """
        if num_cached_blocks >= num_full_blocks:
            return
        if len(block_keys) < num_full_blocks:
            raise ValueError(f"{num_full_blocks} full blocks but only {len(block_keys)} block keys")
        if block_mask is not None and len(block_mask) != num_full_blocks - num_cached_blocks:
            raise ValueError(
                f"block_mask has {len(block_mask)} flags for {num_full_blocks - num_cached_blocks} blocks"
            )
        cached_at = self._blocks_to_cache(block_keys, blocks, num_cached_blocks, num_full_blocks, block_mask)
        if isinstance(cached_at, range):  # the whole range: slices, no step per block
            new_blocks = blocks[num_cached_blocks:num_full_blocks]
            keys = list(block_keys[num_cached_blocks:num_full_blocks])
        else:
            new_blocks = [blocks[i] for i in cached_at]
            keys = [block_keys[i] for i in cached_at]
        if any(map(_block_hash, new_blocks)):  # vLLM's block_hash setter asserts this per block
            for block, key in zip(new_blocks, keys, strict=True):
                if block.block_hash is not None:
                    block.assign_hash(key)  # raises, before any block is hashed
        for block, key in zip(new_blocks, keys, strict=True):
            block.block_hash = key
        self.cached_block_hash_to_block.insert_many(keys, new_blocks)
        if self.kv_events is not None:
            self.kv_events.emit_block_stored(
                request, block_keys, num_cached_blocks, num_full_blocks, keys, cached_at
            )
        self.eviction.on_cached(blocks, cached_at, num_prompt_blocks)

    def _blocks_to_cache(
        self, block_keys: Sequence[BlockHashWithGroupId], blocks: list[KVCacheBlock], lo: int, hi: int,
        block_mask: Sequence[bool] | None,
    ) -> range | list[int]:
        """The indices in [lo, hi) whose blocks take their keys: all of them (a range) unless
        some are null (sliding-window placeholders: nothing to cache), masked out, or (dedupe)
        given back for a cached twin, which ``_adopt_cached`` swaps into ``blocks`` here."""
        if block_mask is None and not self.dedupe and self.null_block not in blocks[lo:hi]:
            return range(lo, hi)
        out = []
        for i in range(lo, hi):
            if blocks[i].is_null or (block_mask is not None and not block_mask[i - lo]):
                continue
            if self.dedupe and self._adopt_cached(block_keys[i], blocks, i):
                continue
            out.append(i)
        return out

    def _adopt_cached(self, key: BlockHashWithGroupId, blocks: list[KVCacheBlock], i: int) -> bool:
        """``dedupe``: if ``key`` is cached already, the request's table takes that block at
        ``i`` and its own copy goes back to the pool (no hash: reused first). True if so."""
        existing = self.cached_block_hash_to_block.get_one_block(key)
        if existing is None:
            return False
        duplicate = blocks[i]
        self.touch([existing])
        blocks[i] = existing
        self.free_blocks([duplicate])
        return True

    def cache_partial_block(
        self,
        request: Request,
        block: KVCacheBlock,
        key: BlockHashWithGroupId,
        parent: BlockHash | None,
        start: int,
        end: int,
    ) -> None:
        """vLLM 0.33 ``cache_partial_block``: ``key``, the hash of the prefix ``[0, end)`` that
        ends inside ``block``, names ``block`` too: as its hash if it has none, else as a further
        key that leaves the map with the block's hash. Its ``BlockStored`` covers the last hash
        unit ``[start, end)`` with ``parent`` the unit before it, unless the key was there.
        (vLLM's case of a shorter key replaced by a longer one never arises here: a block holds
        one request's single prompt boundary, or is full and keyed past it.)"""
        if block.is_null:
            return
        further = self.cached_block_hashes_by_block.get(block.block_id, ())
        if block.block_hash == key or key in further:
            return
        if block.block_hash is None:  # its own hash was evicted while in use (evict_blocks)
            if not self.eviction.caches_partial_blocks:
                return  # ours: a ranked policy indexes full blocks only, so no partial block is cached
            block.assign_hash(key)
        else:
            self.cached_block_hashes_by_block.setdefault(block.block_id, []).append(key)
        self.cached_block_hash_to_block.insert(key, block)
        if self.kv_events is not None:
            self.kv_events.emit_partial_block_stored(request, key, parent, start, end)

    def _keys_of(self, block: KVCacheBlock) -> list[BlockHashWithGroupId]:
        """Every key naming ``block``: its hash first, then its further keys; [] if uncached."""
        if block.block_hash is None:
            return []
        return [block.block_hash, *self.cached_block_hashes_by_block.get(block.block_id, ())]

    def _pop_further_keys(self, block: KVCacheBlock) -> None:
        """Drop ``block``'s further keys from the map (its own hash is the caller's)."""
        for key in self.cached_block_hashes_by_block.pop(block.block_id, ()):
            popped = self.cached_block_hash_to_block.pop(key, block.block_id)
            assert popped is block, f"block {block.block_id}'s partial key is not in the map"

    def get_new_blocks(self, num_blocks: int) -> list[KVCacheBlock]:
        """Pop ``num_blocks`` from the head; a popped cached block loses its hash now."""
        if num_blocks > self.free_block_queue.num_free_blocks:
            raise ValueError(
                f"cannot get {num_blocks} free blocks from the pool ({self.get_num_free_blocks()} free)"
            )
        blocks = self.eviction.take(self, num_blocks)
        if self.num_cached_free_blocks:  # else no free block carries a hash
            if self.kv_events is not None:
                self.kv_events.emit_block_removed_events([key for b in blocks for key in self._keys_of(b)])
            if self.cached_block_hashes_by_block:
                for block in blocks:
                    self._pop_further_keys(block)
            evicted = self.cached_block_hash_to_block.evict_hashed(blocks)
            self.num_cached_free_blocks -= evicted
            self.num_evicted_blocks += evicted
        for block in blocks:
            block.ref_cnt += 1
        return blocks

    def touch(self, blocks: Iterable[KVCacheBlock]) -> None:
        """A hit: take unreferenced blocks out of the free queue, then ref_cnt += 1."""
        queue = self.free_block_queue
        blocks = list(blocks)
        self.eviction.on_hit(blocks)
        for block in blocks:
            if block.is_null:  # we skip the null block's ref_cnt; vLLM bumps it and never reads it
                continue
            if block.ref_cnt == 0:
                queue.remove(block)
                if block.block_hash is not None:
                    self.num_cached_free_blocks -= 1
            block.ref_cnt += 1

    def free_blocks(self, ordered_blocks: Iterable[KVCacheBlock]) -> None:
        """ref_cnt -= 1; blocks reaching 0 re-enter the free queue, first = evicted first.

        Without a hash they are worthless as cache: prepended (reused first). With a hash they
        are appended (LRU). Each list keeps the given order.
        """
        blocks = list(ordered_blocks)
        if self.null_block in blocks:  # (sliding window) the null block is never freed
            blocks = [b for b in blocks if not b.is_null]
        # Ours (vLLM does not check): a bad free raises before any change, leaving the pool intact.
        if blocks and min(map(_ref_cnt, blocks)) <= 0:
            bad = next(b for b in blocks if b.ref_cnt <= 0)
            raise ValueError(f"free of block {bad.block_id} whose ref_cnt is {bad.ref_cnt}")
        released: list[KVCacheBlock] = []
        for block in blocks:
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                released.append(block)
        if not released:
            return
        self.eviction.on_freed(released)
        if self.unhashed_first:
            with_hash = [b for b in released if b.block_hash is not None]
            self.num_cached_free_blocks += len(with_hash)
            if len(with_hash) < len(released):
                self.free_block_queue.prepend_n([b for b in released if b.block_hash is None])
            self.free_block_queue.append_n(with_hash)
        else:
            # Ablation: one LRU queue in the given order, hashed or not.
            self.num_cached_free_blocks += sum(1 for b in released if b.block_hash is not None)
            self.free_block_queue.append_n(released)

    def evict_blocks(self, block_ids: Iterable[int]) -> int:
        """Drop the hashes of these blocks (in use or not); returns how many had one."""
        ids = list(block_ids)
        for block_id in ids:
            if not 0 <= block_id < self.num_gpu_blocks:
                raise ValueError(f"block id {block_id} outside [0, {self.num_gpu_blocks})")
        dropped = 0
        for block_id in ids:
            block = self.blocks[block_id]
            if block.block_hash is not None and block.ref_cnt == 0 and not block.is_null:
                dropped += self._uncache_free_block(block)
            else:
                dropped += self._maybe_evict_cached_block(block)
        return dropped

    def _uncache_free_block(self, block: KVCacheBlock) -> bool:
        """A free cached block loses its hash and stays free. Ranked policies take unhashed
        free blocks from the queue's head, so there it moves to the head (vLLM's one LRU queue
        leaves it in place)."""
        self.num_cached_free_blocks -= 1
        self.eviction.requeue_uncached(self, block)
        return self._maybe_evict_cached_block(block)

    def evict_lru_blocks(self, num_blocks: int) -> int:
        """Ours (vLLM evicts only lazily): drop the hashes of up to ``num_blocks`` cached
        blocks in the eviction order (the free queue's head first, LRU, or the policy's
        victims). The blocks stay free, now unhashed."""
        return self.eviction.evict(self, num_blocks)

    def reset_prefix_cache(self) -> bool:
        """Drop every hash; refused (False, nothing changed) while any block is in use."""
        if self.get_num_free_blocks() != self.num_gpu_blocks - 1:
            return False
        self.cached_block_hash_to_block.clear()
        self.cached_block_hashes_by_block.clear()
        for block in self.blocks.created():  # a block never used has no hash
            if block.block_hash is not None:
                self.eviction.uncached(block)
            block.reset_hash()
        self.num_cached_free_blocks = 0
        if self.kv_events is not None:
            self.kv_events.emit_all_blocks_cleared()
        return True

    def _maybe_evict_cached_block(self, block: KVCacheBlock) -> bool:
        """Remove ``block`` from the hash map and clear its hash; False if it had none."""
        key = block.block_hash
        if key is None:
            return False
        keys = self._keys_of(block)  # vLLM 0.33: BlockRemoved for its hash, then its further keys
        self._pop_further_keys(block)
        popped = self.cached_block_hash_to_block.pop(key, block.block_id)
        assert popped is block, f"block {block.block_id} has a hash but is not in the map"
        if self.kv_events is not None:
            self.kv_events.emit_block_removed_events(keys)
        self.eviction.uncached(block)
        block.reset_hash()
        self.num_evicted_blocks += 1
        return True

    def take_events(self) -> list[Any]:
        """The queued KV events, oldest first; the queue is left empty ([] with events off)."""
        return [] if self.kv_events is None else self.kv_events.take_events()

    # ---------------------------------------------------------------- invariants
    def check_invariants(self) -> None:
        """Real accounting, O(num_blocks): raises InvariantError on any inconsistency."""
        queue = self.free_block_queue
        forward: list[KVCacheBlock] = []  # bounded walk: a cycle must fail, not hang
        curr = queue.fake_free_list_head.next_free_block
        while (
            curr is not None and curr is not queue.fake_free_list_tail and len(forward) <= self.num_gpu_blocks
        ):
            forward.append(curr)
            curr = curr.next_free_block
        ensure(curr is queue.fake_free_list_tail, "free queue does not end at the tail sentinel")
        entries, forward = forward, [b for entry in forward for b in queue.blocks_of(entry)]
        ensure(
            len(forward) == queue.num_free_blocks,
            f"free queue holds {len(forward)} blocks, counter says {queue.num_free_blocks}",
        )
        backward: list[KVCacheBlock] = []
        curr = queue.fake_free_list_tail.prev_free_block
        while curr is not None and curr is not queue.fake_free_list_head and len(backward) <= len(entries):
            backward.append(curr)
            nxt = curr.prev_free_block
            ensure(
                nxt is not None and nxt.next_free_block is curr, f"broken back link at block {curr.block_id}"
            )
            curr = nxt
        ensure(backward[::-1] == entries, "free queue walked backward differs from forward")
        free_ids = {b.block_id for b in forward}
        ensure(len(free_ids) == len(forward), "a block is twice in the free queue")
        ensure(self.null_block.block_id not in free_ids, "the null block is in the free queue")
        ensure(self.null_block.block_hash is None, "the null block has a hash")
        ensure(
            self.null_block.prev_free_block is None and self.null_block.next_free_block is None,
            "null block linked",
        )
        mapped: dict[int, list[BlockHashWithGroupId]] = {}
        for key, block in self.cached_block_hash_to_block.items():
            ensure(block is self.blocks[block.block_id], f"map holds a stranger as block {block.block_id}")
            keys = mapped.setdefault(block.block_id, [])
            ensure(key not in keys, f"block {block.block_id} is twice in the hash map")
            ensure(
                key in self._keys_of(block),
                f"map entry points at block {block.block_id}, which carries another hash",
            )
            keys.append(key)
        hashed = {b.block_id for b in self.blocks if b.block_hash is not None}
        ensure(
            hashed == set(mapped),
            f"blocks with a hash but not in the map: {sorted(hashed - set(mapped))[:8]}",
        )
        for block_id, further in self.cached_block_hashes_by_block.items():
            block = self.blocks[block_id]
            ensure(block.block_hash is not None and bool(further), f"block {block_id}: partial keys, no hash")
            ensure(
                len(mapped[block_id]) == 1 + len(further),
                f"block {block_id}: a partial key is not in the map",
            )
        in_use = 0
        cached_free = 0
        for block in self.blocks[1:]:
            ensure(block.ref_cnt >= 0, f"block {block.block_id} has ref_cnt {block.ref_cnt}")
            in_queue = block.block_id in free_ids
            ensure(
                in_queue == (block.ref_cnt == 0),
                f"block {block.block_id}: ref_cnt {block.ref_cnt}, in free queue {in_queue}",
            )
            if not in_queue:
                ensure(
                    block.prev_free_block is None and block.next_free_block is None,
                    f"{block} linked but not free",
                )
            in_use += block.ref_cnt > 0
            cached_free += in_queue and block.block_hash is not None
        ensure(
            queue.num_free_blocks + in_use == self.num_gpu_blocks - 1,
            f"free {queue.num_free_blocks} + in use {in_use} != {self.num_gpu_blocks - 1} usable",
        )
        ensure(
            cached_free == self.num_cached_free_blocks,
            f"{cached_free} cached free blocks, counter says {self.num_cached_free_blocks}",
        )
        self.eviction.check(self, forward)
