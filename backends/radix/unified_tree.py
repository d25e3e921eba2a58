"""The tree core SGLang 0.5.23's ``UnifiedRadixCache`` shares between its components
(``unified_cache/unified_tree_core.py``): one node type with the FULL component's data and each
other component's, one split, one full-lock walk, one path stamp. The hybrid trees (swa_tree.py:
FULL + SWA; mamba_tree.py: FULL + MAMBA) add their component on top of it.

Time is SGLang's ``get_and_increase_time_counter``: a counter, two ticks per new node (its
last_access_time and creation_time), one per stamp.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import numpy as np
from prefixcache.backends.radix.events import RadixEventRecorder
from prefixcache.backends.radix.key import ChildKey, RadixKey
from prefixcache.backends.radix.tree import SlotArray, iter_nodes

EMPTY: SlotArray = np.empty(0, dtype=np.int64)


class UnifiedTreeNode:
    """``value``: full-pool slots (None once deleted). SWA component: ``swa`` (SWA-pool slots;
    None = tombstone), ``swa_lock``, ``swa_uuid`` (where an SWA lock's window ends) and the
    SWA LRU links. MAMBA component: ``mamba`` (one state slot; None = tombstone), ``mamba_lock``."""

    __slots__ = (
        "children",
        "parent",
        "key",
        "value",
        "full_lock",
        "last_access_time",
        "id",
        "swa",
        "swa_lock",
        "swa_uuid",
        "lru_prev",
        "lru_next",
        "mamba",
        "mamba_lock",
    )

    def __init__(self, node_id: int, now: float) -> None:
        self.children: dict[ChildKey, UnifiedTreeNode] = {}
        self.parent: UnifiedTreeNode | None = None
        self.key = RadixKey(EMPTY)
        self.value: SlotArray | None = EMPTY
        self.full_lock = 0
        self.last_access_time = now
        self.id = node_id
        self.swa: SlotArray | None = None
        self.swa_lock = 0
        self.swa_uuid: int | None = None
        self.lru_prev: UnifiedTreeNode | None = None
        self.lru_next: UnifiedTreeNode | None = None
        self.mamba: int | None = None
        self.mamba_lock = 0

    @property
    def tombstone(self) -> bool:
        return self.swa is None

    def __lt__(self, other: UnifiedTreeNode) -> bool:
        return self.last_access_time < other.last_access_time

    def __repr__(self) -> str:
        return (
            f"UnifiedTreeNode(id={self.id}, len={len(self.key)}, full_lock={self.full_lock}, "
            f"swa_lock={self.swa_lock}, mamba={self.mamba}, mamba_lock={self.mamba_lock})"
        )


class MatchWalk(NamedTuple):
    values: list[SlotArray]  # full slots of each node walked, in order
    best: UnifiedTreeNode  # deepest node the components' validator accepted (the root for none)
    best_nodes: int  # nodes of ``values`` up to ``best``
    length: int  # tokens whose full KV matched (``full_kv_hit_length``)
    last: UnifiedTreeNode  # deepest node walked

    def indices(self) -> SlotArray:
        """The full slots of the accepted part, in token order."""
        chunks = self.values[: self.best_nodes]
        return np.concatenate(chunks) if chunks else EMPTY


class UnifiedTreeCore:
    """What every component mix shares. Subclasses call ``reset`` (which builds the root) at the
    end of their ``__init__`` and add their component's sizes in ``reset``."""

    def __init__(self, page_size: int, events: RadixEventRecorder | None = None) -> None:
        self.page_size = page_size
        # SGLang's ``kv_events`` recorder (None: off), a tree observer: BlockStored for each new
        # leaf, BlockRemoved for each deleted node, AllBlocksCleared at every reset (events.py).
        self.events = events
        # Ours, as RadixCache.version: changes whenever a match could change. It keeps counting
        # across resets: a match taken before one must never find its version again.
        self.version = 0
        self._time = 0.0
        # Node ids, as SGLang's counter, never restart: a node of before a reset (a stale
        # match's) must never share one with a new node.
        self._next_id = 0

    def reset(self) -> None:
        self.version += 1
        self.root = self._new_node()
        self.full_evictable = self.full_protected = 0
        if self.events is not None:
            self.events.record_all_cleared()

    @property
    def root_node(self) -> UnifiedTreeNode:
        """The root, by SGLang's name for it."""
        return self.root

    def _tick(self) -> float:
        """SGLang's ``get_and_increase_time_counter``."""
        t = self._time
        self._time += 1.0
        return t

    def _new_node(self) -> UnifiedTreeNode:
        node = UnifiedTreeNode(self._next_id, self._tick())
        self._tick()  # creation_time takes the next tick, as SGLang's node constructor
        self._next_id += 1
        return node

    def _split(self, child: UnifiedTreeNode, n: int) -> UnifiedTreeNode:
        """parent -> new[:n] -> child[n:]: the new upper node takes the full lock and the first
        n full slots; each component redistributes its own data (``redistribute_on_node_split``)."""
        assert child.parent is not None and child.value is not None and 0 < n < len(child.key)
        new = self._new_node()
        new.parent = child.parent
        new.key, child.key = child.key[:n], child.key[n:]
        new.children = {child.key.child_key(self.page_size): child}
        new.full_lock = child.full_lock
        new.value, child.value = child.value[:n].copy(), child.value[n:].copy()
        child.parent = new
        new.parent.children[new.key.child_key(self.page_size)] = new
        self.redistribute_on_node_split(new, child)
        child.last_access_time = self._tick()
        self._update_leaf(new)
        self._update_leaf(child)
        return new

    def redistribute_on_node_split(self, new: UnifiedTreeNode, child: UnifiedTreeNode) -> None:
        """The components' part of a split (none in the core)."""

    def _update_leaf(self, node: UnifiedTreeNode) -> None:
        """Re-file ``node`` in an evictable-leaf index, for a tree that keeps one."""

    # ------------------------------------------------------------------ the walks
    def _match_walk(self, key: RadixKey, accept: Callable[[UnifiedTreeNode], bool]) -> MatchWalk:
        """Walk ``key`` down, splitting where it ends inside a node; ``accept`` (the components'
        ``create_match_validator``) is asked of each node in order whether a match may end there."""
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
        return MatchWalk(values, best, best_nodes, pos, node)

    def _insert_walk(
        self, key: RadixKey, overlap: Callable[[UnifiedTreeNode, int, int], None]
    ) -> tuple[UnifiedTreeNode, int]:
        """An insert's walk: the root and each node walked stamped, a split where ``key`` ends
        inside a node, ``overlap(node, start, n)`` (``update_component_on_insert_overlap``) for
        each node's ``n`` tokens from ``start``. Returns the last node and the tokens walked."""
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
            overlap(child, pos, n)
            node, pos = child, pos + n
        return node, pos

    def _add_leaf(self, parent: UnifiedTreeNode, key: RadixKey, value: SlotArray) -> UnifiedTreeNode:
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

    def _unlink(self, node: UnifiedTreeNode) -> None:
        """Take a deleted leaf out of its parent (its parent link is kept, as SGLang's)."""
        parent = node.parent
        assert parent is not None and not node.children
        removed = parent.children.pop(node.key.child_key(self.page_size))
        assert removed is node, f"{parent} does not file {node} under its child key"
        self.version += 1
        if self.events is not None:
            self.events.record_remove(node)
        self._update_leaf(parent)

    def _stamp_path(self, node: UnifiedTreeNode | None) -> None:
        """A match's stamp: ``node`` and its ancestors, each a little older than its child."""
        now = self._tick()
        while node is not None:
            node.last_access_time = now
            now -= 0.00001
            node = node.parent

    def _lock_full(self, node: UnifiedTreeNode) -> None:
        """The FULL component's lock: the whole path from ``node`` up (the root excluded)."""
        while node is not self.root:
            assert node.parent is not None and node.value is not None
            if node.full_lock == 0:
                self.full_evictable -= len(node.value)
                self.full_protected += len(node.value)
            node.full_lock += 1
            node = node.parent

    def _unlock_full(self, node: UnifiedTreeNode) -> list[UnifiedTreeNode]:
        """Undo ``_lock_full``; returns the nodes whose full lock reached 0."""
        freed = []
        while node is not self.root:
            if node.full_lock <= 0:
                raise RuntimeError(f"unbalanced full lock release at {node}")
            assert node.value is not None and node.parent is not None
            if node.full_lock == 1:
                self.full_evictable += len(node.value)
                self.full_protected -= len(node.value)
                freed.append(node)
            node.full_lock -= 1
            node = node.parent
        return freed

    def path_indices(self, node: UnifiedTreeNode) -> SlotArray:
        """The full slots of the tokens from the root to the end of ``node``."""
        chunks = []
        while node is not self.root:
            assert node.value is not None and node.parent is not None
            chunks.append(node.value)
            node = node.parent
        return np.concatenate(chunks[::-1]) if chunks else EMPTY

    def iter_nodes(self) -> list[UnifiedTreeNode]:
        return iter_nodes(self.root)

    def _check_full(self) -> None:
        """AssertionError unless links, key lengths and the FULL component's sizes and locks
        agree (each component checks its own part after this)."""
        fe = fp = 0
        for node in self.iter_nodes():
            parent = node.parent
            assert parent is not None and node.value is not None, f"{node} detached or deleted"
            assert len(node.value) == len(node.key) > 0 and len(node.key) % self.page_size == 0, (
                f"{node}: bad length"
            )
            assert parent.children.get(node.key.child_key(self.page_size)) is node, f"{node} misfiled"
            assert min(node.full_lock, node.swa_lock, node.mamba_lock) >= 0, f"{node}: negative lock"
            if node.full_lock:
                fp += len(node.value)
                assert parent is self.root or parent.full_lock > 0, f"{node} locked, its parent not"
            else:
                fe += len(node.value)
        assert (fe, fp) == (self.full_evictable, self.full_protected), f"full sizes drifted: {(fe, fp)}"
