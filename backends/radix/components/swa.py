"""The SWA component (SGLang 0.5.23's ``unified_cache/components/swa.py``, Python tree core,
HiCache and sessions left out). With ``is_eagle`` every length here (window rule, split, SWA
frontier) counts bigrams, as SGLang's does.

A node holds its full-pool slots (``value``, never None here: without a host tier a node loses
its full KV only by being deleted) and its SWA-pool slots (``swa``; None = tombstone, SWA freed,
full kept). Tombstone leaves exist: a deleted leaf's ancestors are removed only when they hold no
full KV, which never happens without HiCache.

Locks: ``lock_ref`` on the whole path; ``swa_lock`` from the node up until one window of tokens
is covered (tombstones counted), the boundary node stamped with a uuid that the release stops at.
Eviction, after the core's FULL phase: walk the SWA LRU list from its LRU end skipping SWA-locked
nodes; an evictable leaf is deleted, any other node is tombstoned. The SWA list is refreshed only
for window + page tokens back from a match's best node / an insert's target, the deepest first
(parents older).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

import numpy as np
from prefixcache.backends.radix.events import RadixEventRecorder
from prefixcache.backends.radix.key import request_key
from prefixcache.backends.radix.radix_cache import (
    EMPTY_SLOTS,
    CheckpointInsert,
    InsertParams,
    LockReceipt,
    RadixCache,
    ReqKV,
    TreeComponent,
)
from prefixcache.backends.radix.swa_pool import (
    DEFAULT_SWA_FULL_TOKENS_RATIO,
    SWAPagePool,
    SWAPoolSizes,
    swa_pool_sizes,
    swa_window,
)
from prefixcache.backends.radix.tree import SlotArray, TreeNode, slot_pages

from prefixcache.config import CacheConfig
from prefixcache.interface import KVGroup, PageUsage
from prefixcache.invariants import check_usage, ensure
from prefixcache.layout import ModelLayout
from prefixcache.pool import PageIds
from prefixcache.request import Request

DEFAULT_SWA_EVICTION_INTERVAL = 128  # SGLANG_SWA_EVICTION_INTERVAL


def swa_tree(
    page_size: int, swa: SWAComponent, is_eagle: bool = False, events: RadixEventRecorder | None = None
) -> RadixCache:
    """The FULL + SWA tree over ``swa``'s pools: a deleted leaf's full pages go back to the full
    pool. Time counts walks (SGLang's tree counts stamps: the same order)."""

    def free_full(runs: list[SlotArray]) -> None:
        for slots in runs:
            swa.pool.full.free(slot_pages(slots, page_size))

    return RadixCache(
        page_size, is_eagle=is_eagle, free_slots=free_full, clock=itertools.count().__next__,
        events=events, component=swa,
    )


class SWALRU:
    """The nodes holding SWA KV (SGLang's ``LRUList``), linked through their ``lru_prev`` /
    ``lru_next``, MRU after ``head``."""

    def __init__(self) -> None:
        self.head, self.tail = TreeNode(0.0), TreeNode(0.0)
        self.head.id, self.tail.id = -1, -2  # sentinels, never members
        self.head.lru_next, self.tail.lru_prev = self.tail, self.head
        self.members: set[int] = set()

    def __contains__(self, node: TreeNode | None) -> bool:
        return node is not None and node.id in self.members

    def _link_after(self, prev: TreeNode, node: TreeNode) -> None:
        nxt = prev.lru_next
        assert nxt is not None
        node.lru_prev, node.lru_next = prev, nxt
        nxt.lru_prev = node
        prev.lru_next = node

    def _unlink(self, node: TreeNode) -> None:
        assert node.lru_prev is not None and node.lru_next is not None
        node.lru_prev.lru_next = node.lru_next
        node.lru_next.lru_prev = node.lru_prev
        node.lru_prev = node.lru_next = None

    def insert_mru(self, node: TreeNode) -> None:
        assert node.id not in self.members
        self.members.add(node.id)
        self._link_after(self.head, node)

    def insert_after(self, prev: TreeNode, node: TreeNode) -> None:
        assert prev.id in self.members and node.id not in self.members
        self.members.add(node.id)
        self._link_after(prev, node)

    def remove(self, node: TreeNode) -> None:
        self.members.remove(node.id)
        self._unlink(node)

    def refresh_window(self, node: TreeNode, root: TreeNode, span: int) -> None:
        """``reset_node_and_window_ancestors_mru``: ``node`` and its ancestors within ``span``
        tokens move to the MRU end, the deepest first (so parents are evicted first)."""
        prev, covered = self.head, 0
        while node is not root and covered < span:
            if node.swa is not None:
                self._unlink(node)
                self._link_after(prev, node)
                prev = node
            covered += len(node.key)
            assert node.parent is not None
            node = node.parent

    def prev_unlocked(self, node: TreeNode) -> TreeNode | None:
        """``get_prev_no_lock``: the next node towards the MRU end with no SWA lock."""
        x = node.lru_prev
        assert x is not None
        while x is not self.head and x.swa_lock > 0:
            x = x.lru_prev
            assert x is not None
        return None if x is self.head else x

    def lru_unlocked(self) -> TreeNode | None:
        return self.prev_unlocked(self.tail)

    def order(self) -> list[TreeNode]:
        """MRU first (for checks)."""
        out, x = [], self.head.lru_next
        while x is not None and x is not self.tail:
            out.append(x)
            x = x.lru_next
        return out


class SWAComponent(TreeComponent):
    free_groups = True
    slides_window = True

    def __init__(
        self, window: int, pool: SWAPagePool, eviction_interval: int = DEFAULT_SWA_EVICTION_INTERVAL,
        sizes: SWAPoolSizes | None = None,
    ) -> None:
        """eviction_interval: SGLANG_SWA_EVICTION_INTERVAL, the tokens a decoding request lets
        slide out of its window before it frees their SWA pages (``maybe_evict_swa``). sizes:
        the pools' usable tokens, as sized (swa_pool.py)."""
        if window < 1:
            raise ValueError(f"SWA tree needs a positive window, got {window}")
        interval = eviction_interval
        if isinstance(interval, bool) or not isinstance(interval, int) or interval < 1:
            raise ValueError(f"swa_eviction_interval must be a positive int, got {eviction_interval!r}")
        self.window = window
        self.pool = pool
        self.eviction_interval = eviction_interval
        self.sizes = sizes
        self._next_uuid = 0

    @classmethod
    def from_config(
        cls, config: CacheConfig, *, swa_full_tokens_ratio: float | None = None,
        swa_eviction_interval: int | None = None,
    ) -> SWAComponent:
        """The component of a full + sliding-window layout over pools sized as SGLang sizes them
        (swa_pool.py; ``swa_full_tokens_ratio``: --swa-full-tokens-ratio, 0.8)."""
        ratio = DEFAULT_SWA_FULL_TOKENS_RATIO if swa_full_tokens_ratio is None else swa_full_tokens_ratio
        sizes = swa_pool_sizes(config, ratio)
        p = config.page_size
        pool = SWAPagePool(sizes.full_tokens // p + 1, sizes.swa_tokens // p + 1, page_size=p)
        interval = DEFAULT_SWA_EVICTION_INTERVAL if swa_eviction_interval is None else swa_eviction_interval
        return cls(swa_window(config), pool, interval, sizes)

    def reset(self) -> None:
        self.tree.root_node.swa = EMPTY_SLOTS
        self.lru = SWALRU()
        self.evictable = self.protected = 0

    def _pages(self, slots: SlotArray) -> SlotArray:
        return slot_pages(slots, self.tree.page_size)

    def _span(self) -> int:
        """How far back from a match's or an insert's end the SWA list is refreshed."""
        return self.window + self.tree.page_size

    def to_swa(self, full_slots: SlotArray) -> SlotArray:
        """``translate_loc_from_full_to_swa`` (0 where a slot has no SWA peer)."""
        p = self.tree.page_size
        peers = self.pool.full_to_swa[full_slots // p]
        return np.where(peers > 0, peers * p + full_slots % p, 0)  # type: ignore[no-any-return]

    def _set_swa(self, node: TreeNode, swa: SlotArray) -> None:
        """``set_component_device_value``: store SWA slots, MRU, counted by lock state."""
        node.swa = swa
        self.tree.version += 1
        self.lru.insert_mru(node)
        if node.swa_lock > 0:
            self.protected += len(swa)
        else:
            self.evictable += len(swa)

    def redistribute_on_node_split(self, new: TreeNode, child: TreeNode) -> None:
        """The lock is inherited, the uuid moves up, the new node goes just after the child in
        the SWA LRU (its parent, so older)."""
        new.swa_lock = child.swa_lock
        if child.swa is not None:
            new.swa, child.swa = child.swa[: len(new.key)].copy(), child.swa[len(new.key) :].copy()
        new.swa_uuid, child.swa_uuid = child.swa_uuid, None
        if new.swa is not None:
            self.lru.insert_after(child, new)

    # ------------------------------------------------------------------ match
    def create_match_validator(self) -> Callable[[TreeNode], bool]:
        """A match may end where at least one window of untombstoned tokens follows the last
        tombstone on the path (or there is none)."""
        since = float("inf")  # untombstoned tokens since the last tombstone

        def accept(node: TreeNode) -> bool:
            nonlocal since
            if node.swa is None:
                since = 0
                return False
            since += len(node.key)
            return since >= self.window

        return accept

    def refresh_lru(self, node: TreeNode) -> None:
        self.lru.refresh_window(node, self.tree.root_node, self._span())

    # ------------------------------------------------------------------ insert
    def check_insert(self, params: InsertParams) -> None:
        if params.swa_evicted_seqlen % self.tree.page_size:
            raise ValueError(f"swa_evicted_seqlen={params.swa_evicted_seqlen} is not page-aligned")

    def update_component_on_insert_overlap(
        self, node: TreeNode, start: int, incoming: SlotArray, params: InsertParams
    ) -> None:
        """A tombstone past the inserter's frontier adopts its KV (keeping its own full KV if
        locked); the inserter's other duplicates are freed, only their full page where their SWA
        peer is already gone."""
        prev_prefix_len, evicted = params.prev_prefix_len, params.swa_evicted_seqlen
        n = len(incoming)
        end = start + n
        if prev_prefix_len >= end:
            return
        consumed_from = n
        live_start = self._clip_to_window(node, start, end, evicted)
        if live_start is not None:
            fresh = incoming[live_start - start :]
            assert node.value is not None
            if node.lock_ref > 0:  # RecoverSWAWithLockedFull: keep the locked full KV
                peers = self.pool.move_swa(self._pages(fresh), self._pages(node.value))
                self.pool.free_full_only(self._pages(fresh))
                self._set_swa(node, self.to_swa(node.value))
                assert len(peers) == len(node.value) // self.tree.page_size
            else:  # adopt the inserter's full + SWA KV, free the old full-only KV
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

    def _clip_to_window(self, node: TreeNode, start: int, end: int, evicted: int) -> int | None:
        """Where a tombstone ``node`` covering [start, end) can take live SWA KV from an
        inserter that freed its SWA below ``evicted`` (splitting off the part below); None if
        the node is live or wholly below it."""
        if node.swa is not None:
            return None
        live_start = max(start, evicted)
        if live_start >= end:
            return None
        if live_start > start:
            # stamped as this walk stamped ``node``, which keeps the part from live_start on
            self.tree._split_node(node, live_start - start, node.last_access_time)
        return live_start

    def commit_insert_component_data(
        self, node: TreeNode, start: int, end: int, params: InsertParams, fresh: bool
    ) -> bool:
        """A new leaf gets SWA KV where the inserter still holds it, a fresh leaf capped at one
        page-aligned window (the older part is split off, so an SWA lock pins only one window)."""
        live_start = self._clip_to_window(node, start, end, params.swa_evicted_seqlen) if fresh else None
        if live_start is not None:
            parent = None
            p = self.tree.page_size
            tail = -(-self.window // p) * p
            if node.swa_lock == 0 and len(node.key) > tail:
                parent = self.tree._split_node(node, len(node.key) - tail, node.last_access_time)
            for part in (parent, node):
                if part is not None:
                    assert part.value is not None
                    self._set_swa(part, self.to_swa(part.value))
        if node is not self.tree.root_node:
            self.refresh_lru(node)
        return False

    # ------------------------------------------------------------------ locks
    def acquire_component_lock(self, node: TreeNode) -> int | None:
        """Up to one window back, the window's end stamped with a uuid."""
        cur, covered, uuid = node, 0, None
        while cur is not self.tree.root_node and covered < self.window:
            if cur.swa_lock == 0 and cur.swa is not None:
                self.evictable -= len(cur.swa)
                self.protected += len(cur.swa)
            cur.swa_lock += 1
            covered += len(cur.key)
            if covered >= self.window:
                if cur.swa_uuid is None:
                    self._next_uuid += 1
                    cur.swa_uuid = self._next_uuid
                uuid = cur.swa_uuid
            assert cur.parent is not None
            cur = cur.parent
        return uuid

    def release_component_lock(self, receipt: LockReceipt) -> None:
        self._release(receipt, early=False)

    def release_swa_early(self, receipt: LockReceipt) -> None:
        """``dec_swa_lock_only``: drop the SWA part of a lock; a node left with no lock of
        either kind and no child loses its SWA at once (with the full lock held: never)."""
        self._release(receipt, early=True)

    def _release(self, receipt: LockReceipt, early: bool) -> None:
        cur = receipt.node
        freed = [0, 0]
        while cur is not self.tree.root_node:
            if cur.swa_lock <= 0:
                raise RuntimeError(f"unbalanced SWA lock release at {cur}")
            if cur.swa_lock == 1 and cur.swa is not None:
                self.evictable += len(cur.swa)
                self.protected -= len(cur.swa)
            cur.swa_lock -= 1
            if cur.swa_lock == 0:
                self.tree._update_leaf_status(cur)
                if early and self.tree.in_leaf_index(cur) and cur.swa is not None:
                    self._tombstone(cur, freed)
            if receipt.swa_uuid is not None and cur.swa_uuid == receipt.swa_uuid:
                break
            assert cur.parent is not None
            cur = cur.parent

    # ------------------------------------------------------------------ eviction
    def on_delete_leaf(self, leaf: TreeNode, freed: list[int]) -> None:
        if leaf.swa is not None:
            freed[1] += len(leaf.swa)
            self.evictable -= len(leaf.swa)
            self.lru.remove(leaf)
            leaf.swa = None
            assert leaf.value is not None
            self.pool.free_swa(self._pages(leaf.value))

    def _tombstone(self, node: TreeNode, freed: list[int]) -> None:
        assert node.swa is not None and node.value is not None
        freed[1] += len(node.swa)
        self.evictable -= len(node.swa)
        self.lru.remove(node)
        node.swa = None
        self.pool.free_swa(self._pages(node.value))
        self.tree.version += 1
        self.tree._update_leaf_status(node)

    def evict_component(self, amount: int, freed: list[int]) -> None:
        cursor = self.lru.lru_unlocked()
        while True:
            if cursor is not None and cursor not in self.lru:
                cursor = self.lru.lru_unlocked()
            if freed[1] >= amount or cursor is None:
                break
            x = cursor
            cursor = self.lru.prev_unlocked(x)
            if self.tree.in_leaf_index(x):
                self.tree.delete_leaf(x, freed)
            else:
                self._tombstone(x, freed)

    # ------------------------------------------------------------------ the request side
    def new_pools(self) -> SWAPagePool:
        pool = self.pool
        self.pool = SWAPagePool(pool.full.num_pages, pool.swa.num_pages, page_size=pool.page_size)
        return self.pool

    def can_take(self, num_pages: int, admit: bool, bonus: int = 0) -> bool:
        return num_pages <= self.pool.swa.num_free + bonus + self.evictable // self.tree.page_size

    def shortfall(self, demand: int) -> int:
        return max(0, demand - self.pool.swa.num_free * self.tree.page_size)

    def admit(self, req: Request, live: ReqKV, full_hit: int) -> int:
        p = self.tree.page_size
        branching = full_hit // p * p
        live.branching = branching if branching > live.protected else None
        return 0

    def slide_span(self, req: Request, live: ReqKV, decode: bool) -> tuple[int, int] | None:
        """``maybe_evict_swa`` (prepare_for_decode): from the second decode step on, once an
        interval of tokens slid out of the window."""
        pre_len = req.num_computed_tokens
        slid = pre_len - self.window - live.swa_evicted
        if decode and pre_len > live.prefill_end and slid >= self.eviction_interval:
            return self._out_of_window(live, pre_len)
        return None

    def _out_of_window(self, live: ReqKV, pre_len: int) -> tuple[int, int] | None:
        """``free_swa_out_of_window_slots``' range: the request's own tokens [lo, hi) more than
        ceil(max(window, page)) tokens behind ``pre_len`` (page-aligned; lo >= the tree-owned
        prefix), or None when it returns early."""
        p = self.tree.page_size
        if pre_len - self.window < live.swa_evicted + 1:
            return None
        evicted = max(live.swa_evicted, live.protected)  # swa_dead_lo: the tree's prefix is not ours
        threshold = pre_len - -(-max(self.window, p) // p) * p
        return evicted, max(evicted, threshold) // p * p

    def free_span(self, live: ReqKV, span: tuple[int, int]) -> None:
        lo, hi = span
        p = self.tree.page_size
        if hi > lo:
            self.pool.free_swa(live.pages[lo // p : hi // p])
        live.swa_evicted = max(lo, hi)

    def free_out_of_window_slots(self, live: ReqKV, pre_len: int) -> None:
        span = self._out_of_window(live, pre_len)
        if span is not None:
            self.free_span(live, span)

    def checkpoint(self, req: Request, live: ReqKV, finished: bool, insert: CheckpointInsert) -> int:
        """An unfinished request frees what slid out of its window first (measured on the key,
        as SGLang); one whose full hit ran past its SWA-valid hit inserts only up to there."""
        computed = req.num_computed_tokens
        eagle = int(self.tree.is_eagle)  # an EAGLE key of N bigrams spans N + 1 raw tokens
        branching = -1 if live.branching is None else live.branching
        branch = live.protected < branching and branching + eagle <= computed
        cache_len = branching + eagle if branch else computed  # prepare_for_caching_req
        key = request_key(req)[:cache_len].maybe_to_bigram_view(self.tree.is_eagle)[0]
        if not finished:
            self.free_out_of_window_slots(live, len(key) - 1)
        key = key.page_aligned(self.tree.page_size)
        if len(key) == 0:
            return 0
        insert(live, key, InsertParams(live.protected, live.swa_evicted))
        if branch:  # cleanup_after_caching_req: the branch is in; free what slid out since
            live.branching = None
            if not finished:
                self.free_out_of_window_slots(live, computed - eagle - 1)
        return 0

    def release(self, live: ReqKV, own: PageIds) -> PageIds:
        """The pages whose SWA the request freed go back full-only (``free_full_segment``)."""
        p = self.tree.page_size
        dead = max(0, max(live.swa_evicted, live.protected) // p - live.protected // p)
        self.pool.free_full_only(own[:dead])
        return own[dead:]

    def new_page_limit(self) -> int:
        """A request may outgrow the SWA pool (its old SWA pages are freed as it goes), not one
        allocation."""
        return self.pool.swa.num_pages - 1

    def usage(self) -> PageUsage:
        free = self.pool.swa.num_free
        evictable = self.evictable // self.tree.page_size
        return PageUsage(free, evictable, self.pool.swa.num_pages - 1 - free - evictable)

    def kv_group(self, layout: ModelLayout) -> KVGroup:
        layers = tuple(i for i, layer in enumerate(layout.layers) if layer.kind == "sliding_window")
        p = self.tree.page_size
        return KVGroup("sliding_window", self.window, "swa", p, self.pool.swa.num_pages, layers)

    def page_table_row(self, live: ReqKV) -> list[int]:
        return self.pool.full_to_swa[live.pages.array()].tolist()  # type: ignore[no-any-return]

    def memory_in_use(self, layout: ModelLayout) -> int:
        return self.usage().in_use * self.tree.page_size * layout.count("sliding_window")

    def check_requests(self, lives: dict[str, ReqKV], tree_pages: set[int]) -> None:
        check_usage("swa", self.usage(), self.pool.swa.num_pages - 1)
        tree_swa: set[int] = set()
        for node in self.tree.iter_nodes():
            if node.swa is not None:
                assert node.value is not None
                tree_swa.update(self.pool.full_to_swa[self._pages(node.value)].tolist())
        mapped = self.pool.full_to_swa[self.pool.full_to_swa > 0]
        usable, free = self.pool.swa.num_pages - 1, self.pool.swa.num_free
        ensure(free + len(mapped) == usable, f"swa pages free {free} + mapped {len(mapped)} != {usable}")
        ensure(tree_swa <= set(mapped.tolist()), "a tree SWA page is not mapped")

    # ------------------------------------------------------------------ inspection
    def check(self) -> None:
        se = sp = 0
        in_lru = set()
        for node in self.tree.iter_nodes():
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
        assert (se, sp) == (self.evictable, self.protected), f"swa sizes drifted: {(se, sp)}"
        assert in_lru == self.lru.members == {n.id for n in self.lru.order()}, "SWA LRU != live SWA nodes"
