"""The hybrid caches' one tree: SGLang 0.5.23's ``UnifiedTreeCore``
(``unified_cache/unified_tree_core.py``): one walk, split, insert, lock and eviction over the
node type that holds every component's data (tree.py's ``TreeNode``). FULL, the KV every token
has, is the core's own; the other component (components/: SWA or MAMBA) takes part through
SGLang's ``TreeComponent`` hooks (``TreeComponent`` below), named as SGLang names them.

Time is SGLang's ``get_and_increase_time_counter``: a counter, two ticks per new node (its
last_access_time and creation_time), one per stamp.
"""

from __future__ import annotations

import heapq
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import NamedTuple

import numpy as np
from prefixcache.backends.radix.events import RadixEventRecorder
from prefixcache.backends.radix.key import RadixKey
from prefixcache.backends.radix.tree import SlotArray, TreeNode, iter_nodes

EMPTY: SlotArray = np.empty(0, dtype=np.int64)
EvictionOrder = Callable[[list[TreeNode]], list[TreeNode]]


class TreeMatch(NamedTuple):
    length: int  # tokens reusable, up to ``node`` (device_prefix_len)
    indices: SlotArray  # their full slots
    node: TreeNode  # the deepest node the component accepts (best_match_node; the root for none)
    full_hit: int  # tokens whose full KV matched (full_kv_hit_length)
    last_visited: TreeNode  # the deepest node the walk reached


class TreeInsert(NamedTuple):
    prefix_len: int  # tokens already cached (the caller's slots past prev_prefix_len there were freed)
    node: TreeNode  # where the key ends: a new leaf, or the node the walk ended on
    exist: bool  # MAMBA: that node kept its own state (``mamba_exist``: the caller's slot was not taken)


class InsertParams(NamedTuple):
    prev_prefix_len: int  # the inserter's tree-owned prefix: its slots there are the tree's, not duplicates
    swa_evicted_seqlen: int  # SWA: the inserter freed the SWA KV of its first this many tokens
    mamba: int | None  # MAMBA: the state slot at the key's end (None: KV only)


class LockReceipt(NamedTuple):
    node: TreeNode
    swa_uuid: int | None  # SWA: where its lock's window ended (None: at the root, or no SWA)


class TreeComponent(ABC):
    """A component's part in the core's operations (SGLang's ``TreeComponent``); its sizes
    (``evictable`` / ``protected``) count its own units over the nodes holding its data."""

    tree: UnifiedRadixTree
    evictable: int
    protected: int

    @abstractmethod
    def reset(self) -> None:
        """Empty sizes and lists, at every reset (the root is new)."""

    @abstractmethod
    def locked(self, node: TreeNode) -> bool:
        """Whether its lock holds ``node`` (then no evictable leaf)."""

    @abstractmethod
    def create_match_validator(self) -> Callable[[TreeNode], bool]:
        """Asked of each node a match walks, in order: may the hit end there?"""

    @abstractmethod
    def refresh_lru(self, node: TreeNode) -> None:
        """A match ended at ``node`` (``refresh_lru`` at MATCH_END)."""

    @abstractmethod
    def redistribute_on_node_split(self, new: TreeNode, child: TreeNode) -> None:
        """Its share of a split's data (``new`` the upper part, ``child`` the lower)."""

    @abstractmethod
    def check_insert(self, params: InsertParams) -> None:
        """ValueError, before anything changes, for parameters it cannot take."""

    @abstractmethod
    def update_component_on_insert_overlap(
        self, node: TreeNode, start: int, incoming: SlotArray, params: InsertParams
    ) -> None:
        """An insert walked ``node`` (tokens from ``start``) with slots ``incoming`` for it: adopt
        what it holds no more and free the inserter's duplicates (past ``prev_prefix_len``)."""

    @abstractmethod
    def commit_insert_component_data(
        self, node: TreeNode, start: int, end: int, params: InsertParams, fresh: bool
    ) -> bool:
        """The insert ends at ``node``, a new leaf for tokens [start, end) if ``fresh``; returns
        ``TreeInsert.exist``."""

    @abstractmethod
    def acquire_component_lock(self, node: TreeNode) -> int | None:
        """Its lock for a request locked at ``node``; returns what ``LockReceipt.swa_uuid`` keeps."""

    @abstractmethod
    def release_component_lock(self, receipt: LockReceipt) -> None:
        """Undo ``acquire_component_lock`` (RuntimeError, changing nothing, if not held)."""

    @abstractmethod
    def on_delete_leaf(self, leaf: TreeNode, freed: list[int]) -> None:
        """Free its data of a leaf being deleted, counting its units in ``freed[1]``."""

    @abstractmethod
    def evict_component(self, amount: int, freed: list[int]) -> None:
        """Its own eviction phase, until ``freed[1]`` reaches ``amount`` or nothing is left."""

    @abstractmethod
    def check(self) -> None:
        """AssertionError unless its sizes and lists agree with the nodes."""


class UnifiedRadixTree:
    def __init__(
        self,
        page_size: int,
        component: TreeComponent,
        free_full: Callable[[SlotArray], None],
        *,
        is_eagle: bool = False,
        events: RadixEventRecorder | None = None,
        order: EvictionOrder | None = None,
    ) -> None:
        """free_full: frees the full slots of a deleted leaf. is_eagle: keys become bigram views
        at match and insert (key.py), so every length the component measures counts bigrams.
        events: SGLang's ``kv_events`` recorder (None: off), a tree observer: BlockStored for
        each new leaf, BlockRemoved for each deleted node, AllBlocksCleared at every reset.
        order: None for SGLang's LRU (the least recent ``last_access_time`` first), else a
        function putting eviction candidates in eviction order (Marconi), asked in both phases."""
        if events is not None and is_eagle:
            raise ValueError("kv_events with is_eagle (bigram-keyed pages) is not modelled")
        self.page_size, self.is_eagle, self.events, self.order = page_size, is_eagle, events, order
        self.component, self.free_full = component, free_full
        component.tree = self
        # Ours, as RadixCache.version: changes whenever a match could change. It keeps counting
        # across resets: a match taken before one must never find its version again.
        self.version = 0
        self._time = 0.0
        self.reset()

    def reset(self) -> None:
        self.version += 1
        self.root = self._new_node()
        self.full_evictable = self.full_protected = 0
        self.leaves: set[TreeNode] = set()  # evictable device leaves (``_is_device_leaf``)
        self.component.reset()
        if self.events is not None:
            self.events.record_all_cleared()

    @property
    def root_node(self) -> TreeNode:
        """The root, by SGLang's name for it."""
        return self.root

    def _tick(self) -> float:
        """SGLang's ``get_and_increase_time_counter``."""
        t = self._time
        self._time += 1.0
        return t

    def _new_node(self) -> TreeNode:
        """A node stamped as SGLang's node constructor stamps it: last access, then creation,
        each a tick. (Its id comes from TreeNode's counter, which never restarts: a node of
        before a reset, a stale match's, never shares one with a new node.)"""
        node = TreeNode(self._tick())
        node.creation_time = self._tick()
        return node

    def _aligned(self, key: RadixKey) -> RadixKey:
        return key.maybe_to_bigram_view(self.is_eagle)[0].page_aligned(self.page_size)

    def _is_device_leaf(self, node: TreeNode) -> bool:
        """SGLang's ``_is_device_leaf``: holds full KV, no lock of either kind, no child, not root."""
        return (
            node is not self.root
            and node.value is not None
            and node.lock_ref == 0
            and not node.children
            and not self.component.locked(node)
        )

    def _update_leaf(self, node: TreeNode) -> None:
        if self._is_device_leaf(node):
            self.leaves.add(node)
        else:
            self.leaves.discard(node)

    def _split(self, child: TreeNode, n: int) -> TreeNode:
        """parent -> new[:n] -> child[n:]: the new upper node takes the full lock and the first
        n full slots; the component redistributes its own data (``redistribute_on_node_split``)."""
        assert child.parent is not None and child.value is not None and 0 < n < len(child.key)
        new = self._new_node()
        new.parent = child.parent
        new.key, child.key = child.key[:n], child.key[n:]
        new.children = {child.key.child_key(self.page_size): child}
        new.lock_ref = child.lock_ref
        new.value, child.value = child.value[:n].copy(), child.value[n:].copy()
        child.parent = new
        new.parent.children[new.key.child_key(self.page_size)] = new
        self.component.redistribute_on_node_split(new, child)
        child.last_access_time = self._tick()
        self._update_leaf(new)
        self._update_leaf(child)
        return new

    # ------------------------------------------------------------------ match / insert
    def match_prefix(self, key: RadixKey) -> TreeMatch:
        """Walk ``key`` down, splitting where it ends inside a node; the hit ends at the deepest
        node the component's validator accepts. Stamps that node and its ancestors only."""
        key = self._aligned(key)
        if len(key) == 0:
            return TreeMatch(0, EMPTY, self.root, 0, self.root)
        accept = self.component.create_match_validator()
        node, pos = self.root, 0
        values: list[SlotArray] = []
        best, best_nodes = self.root, 0
        while pos < len(key):
            child = node.children.get(key[pos:].child_key(self.page_size))
            if child is None:
                break
            n = child.key.match(key[pos:], self.page_size)
            partial = n < len(child.key)
            if partial:
                child = self._split(child, n)
            assert child.value is not None
            values.append(child.value)
            node, pos = child, pos + n
            if accept(child):
                best, best_nodes = child, len(values)
            if partial:
                break
        self.component.refresh_lru(best)
        self._stamp_path(best)
        chunks = values[:best_nodes]
        indices = np.concatenate(chunks) if chunks else EMPTY
        return TreeMatch(len(indices), indices, best, pos, node)

    def insert(
        self, key: RadixKey, value: SlotArray, prev_prefix_len: int = 0, *,
        swa_evicted_seqlen: int = 0, mamba: int | None = None,
    ) -> TreeInsert:
        """Cache ``key`` (its whole pages) with full slots ``value``. The root and each node
        walked are stamped, a node is split where ``key`` ends inside it, the component sees each
        walked node (``update_component_on_insert_overlap``) and the end
        (``commit_insert_component_data``). prev_prefix_len, swa_evicted_seqlen, mamba: as
        ``InsertParams``."""
        params = InsertParams(prev_prefix_len, swa_evicted_seqlen, mamba)
        self.component.check_insert(params)
        key = self._aligned(key)
        value = np.asarray(value, dtype=np.int64)[: len(key)]
        if len(value) != len(key):
            raise ValueError(f"insert of {len(key)} tokens with only {len(value)} slot indices")
        self.root.last_access_time = self._tick()
        node, pos = self.root, 0
        while pos < len(key):
            child = node.children.get(key[pos:].child_key(self.page_size))
            if child is None:
                break
            child.last_access_time = self._tick()
            n = child.key.match(key[pos:], self.page_size)
            if n < len(child.key):
                child = self._split(child, n)
            self.component.update_component_on_insert_overlap(child, pos, value[pos : pos + n], params)
            node, pos = child, pos + n
        fresh = pos < len(key)
        if fresh:
            node = self._add_leaf(node, key[pos:], value[pos:])
        exist = self.component.commit_insert_component_data(node, pos, len(key), params, fresh)
        return TreeInsert(pos, node, exist)

    def _add_leaf(self, parent: TreeNode, key: RadixKey, value: SlotArray) -> TreeNode:
        """A new leaf with the FULL component's data (own copies of the tokens and slots)."""
        leaf = self._new_node()
        leaf.parent = parent
        leaf.key = key.copy()
        leaf.value = value.copy()
        parent.children[leaf.key.child_key(self.page_size)] = leaf
        self.full_evictable += len(value)
        self._update_leaf(leaf)
        self._update_leaf(parent)
        self.version += 1
        if self.events is not None:
            self.events.record_store(leaf)
        return leaf

    def _stamp_path(self, node: TreeNode | None) -> None:
        """A match's stamp: ``node`` and its ancestors, each a little older than its child."""
        now = self._tick()
        while node is not None:
            node.last_access_time = now
            now -= 0.00001
            node = node.parent

    # ------------------------------------------------------------------ locks
    def inc_lock_ref(self, node: TreeNode) -> LockReceipt:
        """The FULL lock on the whole path (the root excluded), the component's as it scopes it;
        none at all on the root."""
        if node.value is None:
            raise ValueError(f"inc_lock_ref on deleted {node}")
        if node is self.root:
            return LockReceipt(node, None)
        cur = node
        while cur is not self.root:
            assert cur.parent is not None and cur.value is not None
            if cur.lock_ref == 0:
                self.full_evictable -= len(cur.value)
                self.full_protected += len(cur.value)
            cur.lock_ref += 1
            cur = cur.parent
        uuid = self.component.acquire_component_lock(node)
        self._update_leaf(node)
        return LockReceipt(node, uuid)

    def dec_lock_ref(self, receipt: LockReceipt, swa_released: bool = False) -> None:
        """Undo ``inc_lock_ref``: the component's lock (unless ``swa_released``: SWA let go of it
        early), then the FULL lock."""
        node = receipt.node
        if node is self.root:
            return
        if not swa_released:
            self.component.release_component_lock(receipt)
        cur = node
        while cur is not self.root:
            if cur.lock_ref <= 0:
                raise RuntimeError(f"unbalanced full lock release at {cur}")
            assert cur.value is not None and cur.parent is not None
            if cur.lock_ref == 1:
                self.full_evictable += len(cur.value)
                self.full_protected -= len(cur.value)
            cur.lock_ref -= 1
            if cur.lock_ref == 0:
                self._update_leaf(cur)
            cur = cur.parent
        self._update_leaf(node)

    # ------------------------------------------------------------------ eviction
    def evict(self, full_tokens: int, component: int = 0) -> tuple[int, int]:
        """The FULL phase for ``full_tokens`` tokens, then the component's for ``component`` of
        its units (SWA tokens, Mamba states), each counting what the other freed. Returns (full
        tokens, component units) freed. (SGLang's ``evict_for_alloc`` stops each phase once its
        pool gained the shortfall: here the same stop, as a pool gains exactly what is freed.)"""
        freed = [0, 0]
        if full_tokens > 0:
            self._evict_full(full_tokens, freed)
        if component > 0 and freed[1] < component:
            self.component.evict_component(component, freed)
        return freed[0], freed[1]

    def _evict_full(self, quota: int, freed: list[int]) -> None:
        """Delete the least recently used evictable leaf (``order``'s first) until ``quota`` full
        tokens are freed; a parent left a leaf joins the candidates."""
        if self.order is not None:
            while freed[0] < quota and self.leaves:
                self.delete_leaf(self.order(list(self.leaves))[0], freed)
            return
        heap = [(n.last_access_time, n) for n in self.leaves]
        heapq.heapify(heap)
        while freed[0] < quota and heap:
            _, leaf = heapq.heappop(heap)
            parent = leaf.parent
            self.delete_leaf(leaf, freed)
            if parent in self.leaves:
                assert parent is not None
                heapq.heappush(heap, (parent.last_access_time, parent))

    def delete_leaf(self, leaf: TreeNode, freed: list[int]) -> None:
        """Free an evictable leaf's KV, the component's and the full, and unlink it
        (``_delete_unbacked_device_leaf``), counting full tokens in ``freed[0]``."""
        assert leaf in self.leaves and leaf.value is not None and leaf.parent is not None
        self.component.on_delete_leaf(leaf, freed)
        self.free_full(leaf.value)
        freed[0] += len(leaf.value)
        self.full_evictable -= len(leaf.value)
        self.leaves.discard(leaf)
        leaf.value = None
        parent = leaf.parent
        removed = parent.children.pop(leaf.key.child_key(self.page_size))
        assert removed is leaf, f"{parent} does not file {leaf} under its child key"
        self.version += 1
        if self.events is not None:
            self.events.record_remove(leaf)
        self._update_leaf(parent)

    # ------------------------------------------------------------------ inspection
    def path_indices(self, node: TreeNode) -> SlotArray:
        """The full slots of the tokens from the root to the end of ``node``."""
        chunks = []
        while node is not self.root:
            assert node.value is not None and node.parent is not None
            chunks.append(node.value)
            node = node.parent
        return np.concatenate(chunks[::-1]) if chunks else EMPTY

    def iter_nodes(self) -> list[TreeNode]:
        return iter_nodes(self.root)

    def check(self) -> None:
        """AssertionError unless links, key lengths, the FULL sizes and locks, the evictable-leaf
        set and the component's own data agree."""
        fe = fp = 0
        leaves = set()
        for node in self.iter_nodes():
            parent = node.parent
            assert parent is not None and node.value is not None, f"{node} detached or deleted"
            assert len(node.value) == len(node.key) > 0 and len(node.key) % self.page_size == 0, (
                f"{node}: bad length"
            )
            assert parent.children.get(node.key.child_key(self.page_size)) is node, f"{node} misfiled"
            assert min(node.lock_ref, node.swa_lock, node.mamba_lock) >= 0, f"{node}: negative lock"
            if node.lock_ref:
                fp += len(node.value)
                assert parent is self.root or parent.lock_ref > 0, f"{node} locked, its parent not"
            else:
                fe += len(node.value)
            if self._is_device_leaf(node):
                leaves.add(node)
        assert (fe, fp) == (self.full_evictable, self.full_protected), f"full sizes drifted: {(fe, fp)}"
        assert self.leaves == leaves, "evictable leaf set is stale"
        self.component.check()
