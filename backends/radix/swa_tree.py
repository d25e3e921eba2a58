"""SWARadixTree: SGLang 0.5.23's ``UnifiedRadixCache`` with the FULL and SWA components
(``unified_cache/unified_tree_core.py`` Python core, ``components/full.py``, ``components/swa.py``),
HiCache and sessions left out. ``is_eagle``: keys become bigram views at match / insert (key.py),
so every length here (window rule, split, SWA frontier) counts bigrams, as SGLang's does.

One tree. A node holds its full-pool slots (``value``, never None here: without a host tier a
node loses its full KV only by being deleted) and its SWA-pool slots (``swa``; None = tombstone,
SWA freed, full kept). Tombstone leaves exist: a deleted leaf's ancestors are removed only when
they hold no full KV, which never happens without HiCache.

Locks: ``lock_ref`` on the whole path; ``swa_lock`` from the node up until one window of tokens
is covered (tombstones counted), the boundary node stamped with a uuid that the release stops at.
Evictable leaves: unlocked in both, holding full KV, no child. Sizes (tokens): evictable +
protected per component, over nodes holding that component's value.

Eviction (``_evict_components``): full first, a heap of evictable leaves by last_access_time
built at the start, the parent pushed when it becomes a leaf; then, if still short, SWA: walk
the SWA LRU list from its LRU end skipping SWA-locked nodes; an evictable leaf is deleted, any
other node is tombstoned. The SWA list is refreshed only for window + page tokens back from a
match's best node / an insert's target, the deepest first (parents older).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from typing import NamedTuple

import numpy as np
from prefixcache.backends.radix.adapter import slot_pages
from prefixcache.backends.radix.events import RadixEventRecorder
from prefixcache.backends.radix.key import RadixKey
from prefixcache.backends.radix.swa_node import SWALRU
from prefixcache.backends.radix.swa_pool import SWAPagePool
from prefixcache.backends.radix.tree import SlotArray
from prefixcache.backends.radix.tree import TreeNode as SWANode
from prefixcache.backends.radix.unified_tree import EMPTY, UnifiedTreeCore


class SWAMatch(NamedTuple):
    length: int  # tokens reusable (whole pages)
    indices: SlotArray  # their full-pool slots
    last_node: SWANode  # best match node (root for none)
    full_hit: int  # tokens whose full KV matched (``full_kv_hit_length``), before the window rule


class LockReceipt(NamedTuple):
    node: SWANode
    swa_uuid: int | None  # where the SWA lock's window ended (None: it reached the root)


class SWARadixTree(UnifiedTreeCore):
    def __init__(
        self,
        page_size: int,
        window: int,
        pool: SWAPagePool,
        is_eagle: bool = False,
        events: RadixEventRecorder | None = None,
    ) -> None:
        if window < 1:
            raise ValueError(f"SWA tree needs a positive window, got {window}")
        if events is not None and is_eagle:
            raise ValueError("kv_events with is_eagle (bigram-keyed pages) is not modelled")
        super().__init__(page_size, events)
        self.window = window
        self.is_eagle = is_eagle
        self.pool = pool
        self._next_uuid = 0
        self.reset()

    def reset(self) -> None:
        super().reset()
        self.root.swa = EMPTY
        self.lru = SWALRU()
        self.leaves: set[SWANode] = set()  # evictable device leaves
        self.swa_evictable = self.swa_protected = 0

    def _pages(self, slots: SlotArray) -> SlotArray:
        return slot_pages(slots, self.page_size)

    def to_swa(self, full_slots: SlotArray) -> SlotArray:
        """``translate_loc_from_full_to_swa`` (0 where a slot has no SWA peer)."""
        p = self.page_size
        peers = self.pool.full_to_swa[full_slots // p]
        return np.where(peers > 0, peers * p + full_slots % p, 0)  # type: ignore[no-any-return]

    def _is_leaf(self, node: SWANode) -> bool:
        """``_is_device_leaf``: holds full KV, no lock of either kind, no child, not root."""
        return (
            node is not self.root
            and node.value is not None
            and node.lock_ref == 0
            and node.swa_lock == 0
            and not node.children
        )

    def _update_leaf(self, node: SWANode) -> None:
        if self._is_leaf(node):
            self.leaves.add(node)
        else:
            self.leaves.discard(node)

    def _set_swa(self, node: SWANode, swa: SlotArray) -> None:
        """``set_component_device_value``: store SWA slots, MRU, counted by lock state."""
        node.swa = swa
        self.version += 1
        self.lru.insert_mru(node)
        if node.swa_lock > 0:
            self.swa_protected += len(swa)
        else:
            self.swa_evictable += len(swa)

    def redistribute_on_node_split(self, new: SWANode, child: SWANode) -> None:
        """The SWA part of a split: the lock is inherited, the uuid moves up, the new node goes
        just after the child in the SWA LRU (its parent, so older)."""
        new.swa_lock = child.swa_lock
        if child.swa is not None:
            new.swa, child.swa = child.swa[: len(new.key)].copy(), child.swa[len(new.key) :].copy()
        new.swa_uuid, child.swa_uuid = child.swa_uuid, None
        if new.swa is not None:
            self.lru.insert_after(child, new)

    # ------------------------------------------------------------------ match
    def match_prefix(self, key: RadixKey) -> SWAMatch:
        """Longest prefix whose full KV is cached and whose SWA holds one window before its
        end: a run of >= window untombstoned tokens after the last tombstone on the path (or
        no tombstone at all). Splits where the key ends inside a node; stamps the best path."""
        key = key.maybe_to_bigram_view(self.is_eagle)[0].page_aligned(self.page_size)
        if len(key) == 0:
            return SWAMatch(0, EMPTY, self.root, 0)
        walk = self._match_walk(key, self.create_match_validator())
        self.lru.refresh_window(walk.best, self.root, self.window + self.page_size)
        self._stamp_path(walk.best)
        indices = walk.indices()
        return SWAMatch(len(indices), indices, walk.best, walk.length)

    def create_match_validator(self) -> Callable[[SWANode], bool]:
        """The SWA component's rule: a match may end where at least one window of untombstoned
        tokens follows the last tombstone on the path."""
        since = float("inf")  # untombstoned tokens since the last tombstone

        def accept(node: SWANode) -> bool:
            nonlocal since
            if node.swa is None:
                since = 0
                return False
            since += len(node.key)
            return since >= self.window

        return accept

    # ------------------------------------------------------------------ insert
    def insert(
        self, key: RadixKey, value: SlotArray, prev_prefix_len: int = 0, swa_evicted_seqlen: int = 0
    ) -> tuple[int, SWANode]:
        """Cache ``key`` with full slots ``value``; returns (tokens already cached, last node).

        prev_prefix_len: the inserter's own tree-owned prefix (not freed as a duplicate).
        swa_evicted_seqlen: the inserter already freed the SWA KV of its first this many tokens
        (page-aligned): new nodes below it are tombstones, a fully evicted suffix becomes a
        tombstone leaf, and tombstones past it adopt the inserter's KV.
        Duplicates of cached tokens past prev_prefix_len are freed (only their full page where
        their SWA peer is already gone).
        """
        if swa_evicted_seqlen % self.page_size:
            raise ValueError(f"swa_evicted_seqlen={swa_evicted_seqlen} is not page-aligned")
        key = key.maybe_to_bigram_view(self.is_eagle)[0].page_aligned(self.page_size)
        value = np.asarray(value, dtype=np.int64)[: len(key)]
        if len(value) != len(key):
            raise ValueError(f"insert of {len(key)} tokens with only {len(value)} slot indices")

        def overlap(child: SWANode, start: int, n: int) -> None:
            self._overlap(child, start, value[start : start + n], prev_prefix_len, swa_evicted_seqlen)

        node, total = self._insert_walk(key, overlap)
        prefix_len = total
        target = node
        if total < len(key):
            target = self._add_leaf(node, key[total:], value[total:])
            self._populate(target, total, len(key), swa_evicted_seqlen)
        if target is not self.root:
            self.lru.refresh_window(target, self.root, self.window + self.page_size)
        return prefix_len, target

    def _overlap(
        self, node: SWANode, start: int, incoming: SlotArray, prev_prefix_len: int, evicted: int
    ) -> None:
        """``update_component_on_insert_overlap`` and the duplicate frees of one walked node."""
        n = len(incoming)
        end = start + n
        if prev_prefix_len >= end:
            return
        consumed_from = n
        live_start = self._clip_to_window(node, start, end, evicted)
        if live_start is not None:
            fresh = incoming[live_start - start :]
            if node.lock_ref > 0:  # RecoverSWAWithLockedFull: keep the locked full KV
                assert node.value is not None
                peers = self.pool.move_swa(self._pages(fresh), self._pages(node.value))
                self.pool.free_full_only(self._pages(fresh))
                self._set_swa(node, self.to_swa(node.value))
                assert len(peers) == len(node.value) // self.page_size
            else:  # adopt the inserter's full + SWA KV, free the old full-only KV
                assert node.value is not None
                old = node.value
                node.value = fresh.copy()
                self.pool.free_full_only(self._pages(old))
                self._set_swa(node, self.to_swa(node.value))
            consumed_from = live_start - start
        dup_start = max(0, prev_prefix_len - start)
        if dup_start < consumed_from:
            dup = incoming[dup_start:consumed_from]
            already = min(max(evicted - (start + dup_start), 0), len(dup))
            if already:
                self.pool.free_full_only(self._pages(dup[:already]))
            if already < len(dup):
                self.pool.free(self._pages(dup[already:]))

    def _clip_to_window(self, node: SWANode, start: int, end: int, evicted: int) -> int | None:
        """Where a tombstone ``node`` covering [start, end) can take live SWA KV from an
        inserter that freed its SWA below ``evicted`` (splitting off the part below); None if
        the node is live or wholly below it."""
        if node.swa is not None:
            return None
        live_start = max(start, evicted)
        if live_start >= end:
            return None
        if live_start > start:
            self._split(node, live_start - start)  # ``node`` keeps the upper part
        return live_start

    def _populate(self, leaf: SWANode, start: int, end: int, evicted: int) -> None:
        """``commit_insert_component_data`` for a new leaf: give it SWA KV where the inserter
        still holds it, capping a fresh leaf at one page-aligned window (the older part is
        split off, so an SWA lock pins only one window)."""
        live_start = self._clip_to_window(leaf, start, end, evicted)
        if live_start is None:
            return  # wholly below the inserter's SWA frontier: a tombstone leaf
        parent = None
        p = self.page_size
        tail = -(-self.window // p) * p
        if leaf.swa_lock == 0 and len(leaf.key) > tail:
            parent = self._split(leaf, len(leaf.key) - tail)
        for node in (parent, leaf):
            if node is not None:
                assert node.value is not None
                self._set_swa(node, self.to_swa(node.value))

    # ------------------------------------------------------------------ locks
    def inc_lock_ref(self, node: SWANode) -> LockReceipt:
        """Full lock on the path; SWA lock up to one window back (the window's end stamped)."""
        if node.value is None:
            raise ValueError(f"inc_lock_ref on deleted {node}")
        self._lock_full(node)
        cur, covered, uuid = node, 0, None
        while cur is not self.root and covered < self.window:
            if cur.swa_lock == 0 and cur.swa is not None:
                self.swa_evictable -= len(cur.swa)
                self.swa_protected += len(cur.swa)
            cur.swa_lock += 1
            covered += len(cur.key)
            if covered >= self.window:
                if cur.swa_uuid is None:
                    self._next_uuid += 1
                    cur.swa_uuid = self._next_uuid
                uuid = cur.swa_uuid
            assert cur.parent is not None
            cur = cur.parent
        self._update_leaf(node)
        return LockReceipt(node, uuid)

    def _release_swa_lock(self, receipt: LockReceipt) -> None:
        cur = receipt.node
        while cur is not self.root:
            if cur.swa_lock <= 0:
                raise RuntimeError(f"unbalanced SWA lock release at {cur}")
            if cur.swa_lock == 1 and cur.swa is not None:
                self.swa_evictable += len(cur.swa)
                self.swa_protected -= len(cur.swa)
            cur.swa_lock -= 1
            if cur.swa_lock == 0:
                self._update_leaf(cur)
            if receipt.swa_uuid is not None and cur.swa_uuid == receipt.swa_uuid:
                break
            assert cur.parent is not None
            cur = cur.parent

    def dec_lock_ref(self, receipt: LockReceipt, swa_released: bool = False) -> None:
        """Undo ``inc_lock_ref`` (SWA first, then full); skip SWA if released early."""
        if not swa_released:
            self._release_swa_lock(receipt)
        for cur in self._unlock_full(receipt.node):
            self._update_leaf(cur)
        self._update_leaf(receipt.node)

    # ------------------------------------------------------------------ eviction
    def _delete_leaf(self, node: SWANode, freed: list[int]) -> None:
        """Free a leaf's full and SWA KV and delete it (``_delete_unbacked_device_leaf``)."""
        assert node.value is not None and node.parent is not None and not node.children
        pages = self._pages(node.value)
        freed[0] += len(node.value)
        self.full_evictable -= len(node.value)
        if node.swa is not None:
            freed[1] += len(node.swa)
            self.swa_evictable -= len(node.swa)
            self.lru.remove(node)
            node.swa = None
            self.pool.free_swa(pages)
        self.pool.full.free(pages)
        self.leaves.discard(node)
        node.value = None
        self._unlink(node)

    def _tombstone(self, node: SWANode, freed: list[int]) -> None:
        assert node.swa is not None and node.value is not None
        freed[1] += len(node.swa)
        self.swa_evictable -= len(node.swa)
        self.lru.remove(node)
        node.swa = None
        self.pool.free_swa(self._pages(node.value))
        self.version += 1
        self._update_leaf(node)

    def evict(self, full_tokens: int, swa_tokens: int = 0, *, to_available: bool = False) -> tuple[int, int]:
        """Evict for ``full_tokens`` full and ``swa_tokens`` SWA tokens; returns (full, SWA)
        tokens freed. ``to_available``: SGLang's ``evict_for_alloc``: the requests are
        shortfalls, and each phase stops once its pool has that much more free than before."""
        p = self.page_size
        freed = [0, 0]
        avail = (self.pool.full.num_free * p, self.pool.swa.num_free * p)
        targets = (
            avail[0] + full_tokens if to_available and full_tokens > 0 else None,
            avail[1] + swa_tokens if to_available and swa_tokens > 0 else None,
        )

        def reached(i: int) -> bool:
            free = (self.pool.full.num_free, self.pool.swa.num_free)[i] * p
            return targets[i] is not None and free >= targets[i]  # type: ignore[operator]

        if full_tokens > 0 and not reached(0):
            quota = (
                max(full_tokens, freed[0] + self.full_evictable) if targets[0] is not None else full_tokens
            )
            heap = [(n.last_access_time, n) for n in self.leaves]
            heapq.heapify(heap)
            while freed[0] < quota and heap:
                _, x = heapq.heappop(heap)
                if x not in self.leaves:
                    continue
                parent = x.parent
                self._delete_leaf(x, freed)
                if reached(0):
                    break
                if parent in self.leaves:
                    assert parent is not None
                    heapq.heappush(heap, (parent.last_access_time, parent))
        if swa_tokens > 0 and not reached(1) and freed[1] < swa_tokens:
            cursor = self.lru.lru_unlocked()
            while True:
                if cursor is not None and cursor not in self.lru:
                    cursor = self.lru.lru_unlocked()
                if freed[1] >= swa_tokens or cursor is None:
                    break
                x = cursor
                cursor = self.lru.prev_unlocked(x)
                if x in self.leaves:
                    self._delete_leaf(x, freed)
                else:
                    self._tombstone(x, freed)
                if reached(1):
                    break
        return freed[0], freed[1]

    def release_swa_early(self, receipt: LockReceipt) -> None:
        """``dec_swa_lock_only``: drop the SWA part of a lock; a node left with no lock of
        either kind and no child loses its SWA at once (with the full lock held: never)."""
        cur = receipt.node
        freed = [0, 0]
        while cur is not self.root:
            if cur.swa_lock <= 0:
                raise RuntimeError(f"unbalanced SWA lock release at {cur}")
            cur.swa_lock -= 1
            if cur.swa_lock == 0:
                self._update_leaf(cur)
                if cur.swa is not None:
                    self.swa_protected -= len(cur.swa)
                    self.swa_evictable += len(cur.swa)
                    if self._is_leaf(cur):
                        self._tombstone(cur, freed)
            if receipt.swa_uuid is not None and cur.swa_uuid == receipt.swa_uuid:
                break
            assert cur.parent is not None
            cur = cur.parent

    # ------------------------------------------------------------------ inspection
    def check(self) -> None:
        """AssertionError unless links, sizes, locks, the leaf set and the SWA list agree."""
        self._check_full()
        se = sp = 0
        leaves, in_lru = set(), set()
        for node in self.iter_nodes():
            assert node.value is not None
            assert node.swa_lock == 0 or node.lock_ref > 0, f"{node}: an SWA lock without a full lock"
            if node.swa is not None:
                assert len(node.swa) == len(node.value), f"{node}: swa length"
                assert np.array_equal(self.to_swa(node.value), node.swa), f"{node}: swa slots != mapping"
                in_lru.add(node.id)
                if node.swa_lock:
                    sp += len(node.swa)
                else:
                    se += len(node.swa)
            else:
                assert not (self.pool.full_to_swa[self._pages(node.value)] > 0).any(), (
                    f"{node}: tombstone with SWA peers"
                )
            if self._is_leaf(node):
                leaves.add(node.id)
        assert (se, sp) == (self.swa_evictable, self.swa_protected), f"swa sizes drifted: {(se, sp)}"
        assert {n.id for n in self.leaves} == leaves, "evictable leaf set is stale"
        assert in_lru == self.lru.members == {n.id for n in self.lru.order()}, "SWA LRU != live SWA nodes"


__all__ = ["EMPTY", "SWALRU", "LockReceipt", "SWAMatch", "SWANode", "SWARadixTree"]
