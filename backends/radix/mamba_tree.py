"""MambaRadixTree: SGLang 0.5.23's ``UnifiedRadixCache`` with components (FULL, MAMBA), python
tree core (``unified_cache/unified_tree_core.py``, ``components/full.py``, ``components/mamba.py``),
page size 1, no HiCache, no sessions.

A node holds full-attention KV slots (``value``) and at most one recurrent-state slot
(``mamba``; None = tombstone: the KV is kept, the state at the node's end is not). The state of
a node is the model's recurrent state after exactly the tokens from the root to its end.

- match: walk the key, split where it ends inside a node; the hit is cut back to the deepest
  node holding a state (the recurrent state is exact only there). Stamps ``last_access_time`` on
  that node and its ancestors only, and moves only that node's state to the Mamba MRU end.
- locks: the full lock covers node -> root, the Mamba lock the node only.
- insert: a new leaf takes the state; an existing tombstone adopts it; an existing state wins
  (``mamba_exist``: the caller frees its slot). A split leaves the upper part a tombstone.
- evict(full n, mamba m), full first: the full phase deletes the least recently used unlocked
  leaves (with their state); the Mamba phase walks the Mamba LRU from its old end, skipping
  Mamba-locked nodes: an evictable leaf is deleted (KV and state), any other node tombstoned.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import NamedTuple

from prefixcache.backends.radix.events import RadixEventRecorder
from prefixcache.backends.radix.key import RadixKey
from prefixcache.backends.radix.tree import SlotArray
from prefixcache.backends.radix.tree import TreeNode as MambaNode
from prefixcache.backends.radix.unified_tree import UnifiedTreeCore


class MambaMatch(NamedTuple):
    length: int  # tokens up to ``node``: the reusable hit (device_prefix_len)
    indices: SlotArray  # KV slots of those tokens
    node: MambaNode  # deepest node on the path holding a state (the root for none)
    full_length: int  # tokens the full KV alone would match (full_kv_hit_length)
    last_visited: MambaNode  # deepest node the walk reached


class MambaInsert(NamedTuple):
    prefix_len: int  # tokens already cached (the caller's slots there were freed as duplicates)
    node: MambaNode  # the node the insert ended on
    mamba_exist: bool  # that node already had a state: the caller's state slot was not taken


EvictionOrder = Callable[[list[MambaNode]], list[MambaNode]]


class MambaRadixTree(UnifiedTreeCore):
    """free_slots / free_state: called with what eviction and duplicate inserts free.
    order: None for SGLang's LRU (full: least recent ``last_access_time`` leaf first; Mamba: its
    LRU list); else a function putting eviction candidates in eviction order (Marconi)."""

    def __init__(
        self,
        free_slots: Callable[[SlotArray], None],
        free_state: Callable[[int], None],
        order: EvictionOrder | None = None,
        events: RadixEventRecorder | None = None,
    ) -> None:
        super().__init__(1, events)
        self.free_slots = free_slots
        self.free_state = free_state
        self.order = order
        self.reset()

    def reset(self) -> None:
        super().reset()
        self.mamba_evictable = self.mamba_protected = 0
        # Mamba LRU: every node holding a state, least recently used first.
        self.lru: OrderedDict[int, MambaNode] = OrderedDict()

    # ------------------------------------------------------------------ helpers
    def _set_state(self, node: MambaNode, slot: int) -> None:
        assert node.mamba is None
        node.mamba = slot
        self.lru[node.id] = node  # MRU end
        if node.mamba_lock:
            self.mamba_protected += 1
        else:
            self.mamba_evictable += 1

    def _drop_state(self, node: MambaNode) -> None:
        assert node.mamba is not None and node.mamba_lock == 0
        self.free_state(node.mamba)
        node.mamba = None
        del self.lru[node.id]
        self.mamba_evictable -= 1

    def is_evictable_leaf(self, node: MambaNode) -> bool:
        """SGLang's D-leaf: not the root, no child, no lock of either kind on the node."""
        return node is not self.root and not node.children and node.lock_ref == 0 and node.mamba_lock == 0

    # ------------------------------------------------------------------ match / insert
    def match_prefix(self, key: RadixKey) -> MambaMatch:
        """The split leaves its new upper part a Mamba tombstone (its state, at its own end,
        was never computed)."""
        walk = self._match_walk(key, lambda node: node.mamba is not None)
        if walk.best.mamba is not None:
            self.lru.move_to_end(walk.best.id)
        self._stamp_path(walk.best)  # the best node and its ancestors only
        indices = walk.indices()
        return MambaMatch(len(indices), indices, walk.best, walk.length, walk.last)

    def insert(
        self, key: RadixKey, value: SlotArray, mamba: int | None, prev_prefix_len: int = 0
    ) -> MambaInsert:
        """Cache ``key`` with KV slots ``value`` and the state ``mamba`` at its end (None: KV
        only, ours for Marconi's admission; SGLang always passes one). Our slots in
        [prev_prefix_len, already cached) are duplicates and are freed here, in walk order."""
        if len(value) != len(key):
            raise ValueError(f"insert of {len(key)} tokens with {len(value)} slots")

        def overlap(child: MambaNode, start: int, n: int) -> None:
            dup_start = max(0, prev_prefix_len - start)
            if dup_start < n:
                self.free_slots(value[start + dup_start : start + n])

        node, pos = self._insert_walk(key, overlap)
        if pos < len(key):
            leaf = self._add_leaf(node, key[pos:], value[pos:])
            if mamba is not None:
                self._set_state(leaf, mamba)
            return MambaInsert(pos, leaf, False)
        if node is self.root or mamba is None:
            return MambaInsert(pos, node, node.mamba is not None)
        if node.mamba is None:
            self._set_state(node, mamba)
            node.last_access_time = self._tick()
            self.version += 1  # a match can now reach further
            return MambaInsert(pos, node, False)
        self.lru.move_to_end(node.id)
        node.last_access_time = self._tick()
        return MambaInsert(pos, node, True)

    # ------------------------------------------------------------------ locks
    def inc_lock_ref(self, node: MambaNode) -> None:
        """The full lock on the path, the Mamba lock on the node only (none on the root)."""
        if node is self.root:
            return
        if node.mamba_lock == 0 and node.mamba is not None:
            self.mamba_evictable -= 1
            self.mamba_protected += 1
        node.mamba_lock += 1
        self._lock_full(node)

    def dec_lock_ref(self, node: MambaNode) -> None:
        if node is self.root:
            return
        if node.mamba_lock <= 0:
            raise RuntimeError(f"unbalanced dec_lock_ref on {node}")
        if node.mamba_lock == 1 and node.mamba is not None:
            self.mamba_evictable += 1
            self.mamba_protected -= 1
        node.mamba_lock -= 1
        self._unlock_full(node)

    # ------------------------------------------------------------------ eviction
    def _delete_leaf(self, leaf: MambaNode) -> tuple[int, int]:
        """Free a leaf's KV and state and unlink it; (tokens, states) freed."""
        assert self.is_evictable_leaf(leaf) and leaf.parent is not None
        self.free_slots(leaf.value)
        states = 0
        if leaf.mamba is not None:
            self._drop_state(leaf)
            states = 1
        self.full_evictable -= len(leaf.value)
        self._unlink(leaf)
        return len(leaf.value), states

    def evictable_leaves(self) -> list[MambaNode]:
        return [n for n in self.iter_nodes() if self.is_evictable_leaf(n)]

    def evict(self, num_tokens: int, num_states: int = 0) -> tuple[int, int]:
        """Full phase for ``num_tokens`` tokens, then Mamba phase for ``num_states`` states
        (each counting what the other freed). Returns (tokens, states) freed."""
        tokens = states = 0
        if num_tokens > 0:
            leaves = self.evictable_leaves()
            while tokens < num_tokens and leaves:
                if self.order is None:
                    leaf = min(leaves, key=lambda n: n.last_access_time)
                else:
                    leaf = self.order(leaves)[0]
                leaves.remove(leaf)
                parent = leaf.parent
                t, s = self._delete_leaf(leaf)
                tokens, states = tokens + t, states + s
                assert parent is not None
                if self.is_evictable_leaf(parent):
                    leaves.append(parent)
        if states < num_states:
            holders = list(self.lru.values())
            if self.order is not None:
                holders = self.order([n for n in holders if not n.mamba_lock])
            for node in holders:
                if states >= num_states:
                    break
                if node.id not in self.lru or node.mamba_lock:
                    continue
                if self.is_evictable_leaf(node):
                    t, s = self._delete_leaf(node)
                    tokens, states = tokens + t, states + s
                else:
                    self._drop_state(node)  # internal (or full-locked): tombstone
                    self.version += 1
                    states += 1
        return tokens, states

    # ------------------------------------------------------------------ inspection
    def check(self) -> None:
        """AssertionError unless sizes, links, locks and the Mamba LRU agree."""
        self._check_full()
        me = mp = 0
        holders = set()
        for node in self.iter_nodes():
            assert node.lock_ref >= node.mamba_lock, f"{node}: Mamba lock without the full lock"
            if node.mamba is not None:
                holders.add(node.id)
                if node.mamba_lock:
                    mp += 1
                else:
                    me += 1
        assert self.root.mamba is None and not self.root.lock_ref, "the root holds no state, no lock"
        assert (me, mp) == (self.mamba_evictable, self.mamba_protected), f"mamba sizes drifted {me, mp}"
        assert holders == set(self.lru), "Mamba LRU != nodes holding a state"
