"""The tree core SGLang 0.5.23's ``UnifiedRadixCache`` shares between its components
(``unified_cache/unified_tree_core.py``): one split, one full-lock walk, one path stamp, over
the one node type (tree.py's ``TreeNode``, which holds every component's data). The hybrid
trees (swa_tree.py: FULL + SWA; mamba_tree.py: FULL + MAMBA) add their component on top of it.

Time is SGLang's ``get_and_increase_time_counter``: a counter, two ticks per new node (its
last_access_time and creation_time), one per stamp.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import numpy as np
from prefixcache.backends.radix.events import RadixEventRecorder
from prefixcache.backends.radix.key import RadixKey
from prefixcache.backends.radix.tree import SlotArray, TreeNode, iter_nodes

EMPTY: SlotArray = np.empty(0, dtype=np.int64)


class MatchWalk(NamedTuple):
    values: list[SlotArray]  # full slots of each node walked, in order
    best: TreeNode  # deepest node the components' validator accepted (the root for none)
    best_nodes: int  # nodes of ``values`` up to ``best``
    length: int  # tokens whose full KV matched (``full_kv_hit_length``)
    last: TreeNode  # deepest node walked

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

    def reset(self) -> None:
        self.version += 1
        self.root = self._new_node()
        self.full_evictable = self.full_protected = 0
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

    def _split(self, child: TreeNode, n: int) -> TreeNode:
        """parent -> new[:n] -> child[n:]: the new upper node takes the full lock and the first
        n full slots; each component redistributes its own data (``redistribute_on_node_split``)."""
        assert child.parent is not None and child.value is not None and 0 < n < len(child.key)
        new = self._new_node()
        new.parent = child.parent
        new.key, child.key = child.key[:n], child.key[n:]
        new.children = {child.key.child_key(self.page_size): child}
        new.lock_ref = child.lock_ref
        new.value, child.value = child.value[:n].copy(), child.value[n:].copy()
        child.parent = new
        new.parent.children[new.key.child_key(self.page_size)] = new
        self.redistribute_on_node_split(new, child)
        child.last_access_time = self._tick()
        self._update_leaf(new)
        self._update_leaf(child)
        return new

    def redistribute_on_node_split(self, new: TreeNode, child: TreeNode) -> None:
        """The components' part of a split (none in the core)."""

    def _update_leaf(self, node: TreeNode) -> None:
        """Re-file ``node`` in an evictable-leaf index, for a tree that keeps one."""

    # ------------------------------------------------------------------ the walks
    def _match_walk(self, key: RadixKey, accept: Callable[[TreeNode], bool]) -> MatchWalk:
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
        self, key: RadixKey, overlap: Callable[[TreeNode, int, int], None]
    ) -> tuple[TreeNode, int]:
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

    def _unlink(self, node: TreeNode) -> None:
        """Take a deleted leaf out of its parent (its parent link is kept, as SGLang's)."""
        parent = node.parent
        assert parent is not None and not node.children
        removed = parent.children.pop(node.key.child_key(self.page_size))
        assert removed is node, f"{parent} does not file {node} under its child key"
        self.version += 1
        if self.events is not None:
            self.events.record_remove(node)
        self._update_leaf(parent)

    def _stamp_path(self, node: TreeNode | None) -> None:
        """A match's stamp: ``node`` and its ancestors, each a little older than its child."""
        now = self._tick()
        while node is not None:
            node.last_access_time = now
            now -= 0.00001
            node = node.parent

    def _lock_full(self, node: TreeNode) -> None:
        """The FULL component's lock: the whole path from ``node`` up (the root excluded)."""
        while node is not self.root:
            assert node.parent is not None and node.value is not None
            if node.lock_ref == 0:
                self.full_evictable -= len(node.value)
                self.full_protected += len(node.value)
            node.lock_ref += 1
            node = node.parent

    def _unlock_full(self, node: TreeNode) -> list[TreeNode]:
        """Undo ``_lock_full``; returns the nodes whose full lock reached 0."""
        freed = []
        while node is not self.root:
            if node.lock_ref <= 0:
                raise RuntimeError(f"unbalanced full lock release at {node}")
            assert node.value is not None and node.parent is not None
            if node.lock_ref == 1:
                self.full_evictable += len(node.value)
                self.full_protected -= len(node.value)
                freed.append(node)
            node.lock_ref -= 1
            node = node.parent
        return freed

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
            assert min(node.lock_ref, node.swa_lock, node.mamba_lock) >= 0, f"{node}: negative lock"
            if node.lock_ref:
                fp += len(node.value)
                assert parent is self.root or parent.lock_ref > 0, f"{node} locked, its parent not"
            else:
                fe += len(node.value)
        assert (fe, fp) == (self.full_evictable, self.full_protected), f"full sizes drifted: {(fe, fp)}"
