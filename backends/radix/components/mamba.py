"""The MAMBA component (SGLang 0.5.23's ``unified_cache/components/mamba.py``, Python tree core),
page size 1, no HiCache, no sessions.

A node holds full-attention KV slots (``value``) and at most one recurrent-state slot
(``mamba``; None = tombstone: the KV is kept, the state at the node's end is not). The state of
a node is the model's recurrent state after exactly the tokens from the root to its end.

- match: the hit is cut back to the deepest node holding a state (the recurrent state is exact
  only there); only that node's state moves to the Mamba MRU end.
- locks: the full lock covers node -> root, the Mamba lock the node only.
- insert: a new leaf takes the state; an existing tombstone adopts it; an existing state wins
  (``exist``: the caller frees its slot). A split leaves the upper part a tombstone.
- eviction, after the core's FULL phase: walk the Mamba LRU from its old end (``order``'s, with
  one), skipping Mamba-locked nodes: an evictable leaf is deleted (KV and state), any other node
  tombstoned.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from collections.abc import Callable

from prefixcache.backends.radix.events import RadixEventRecorder
from prefixcache.backends.radix.radix_cache import (
    EvictionOrder,
    InsertParams,
    LockReceipt,
    RadixCache,
    TreeComponent,
)
from prefixcache.backends.radix.tree import SlotArray, TreeNode


def mamba_tree(
    free_slots: Callable[[list[SlotArray]], None],
    mamba: MambaComponent,
    order: EvictionOrder | None = None,
    events: RadixEventRecorder | None = None,
) -> RadixCache:
    """The FULL + MAMBA tree (page size 1): ``free_slots`` takes the KV slots eviction and
    duplicate inserts free; ``order`` as ``RadixCache``'s (Marconi). Time counts walks."""
    return RadixCache(
        1, free_slots=free_slots, clock=itertools.count().__next__, events=events, component=mamba,
        order=order,
    )


class MambaComponent(TreeComponent):
    def __init__(self, free_state: Callable[[int], None]) -> None:
        self.free_state = free_state

    def reset(self) -> None:
        self.evictable = self.protected = 0
        # Mamba LRU: every node holding a state, least recently used first.
        self.lru: OrderedDict[int, TreeNode] = OrderedDict()

    def _set_state(self, node: TreeNode, slot: int) -> None:
        assert node.mamba is None
        node.mamba = slot
        self.lru[node.id] = node  # MRU end
        if node.mamba_lock:
            self.protected += 1
        else:
            self.evictable += 1

    def _drop_state(self, node: TreeNode) -> None:
        assert node.mamba is not None and node.mamba_lock == 0
        self.free_state(node.mamba)
        node.mamba = None
        del self.lru[node.id]
        self.evictable -= 1

    # ------------------------------------------------------------------ match / insert
    def create_match_validator(self) -> Callable[[TreeNode], bool]:
        return lambda node: node.mamba is not None

    def refresh_lru(self, node: TreeNode) -> None:
        if node.mamba is not None:
            self.lru.move_to_end(node.id)

    def redistribute_on_node_split(self, new: TreeNode, child: TreeNode) -> None:
        """Nothing moves: the upper part is a tombstone (the state is the child's end's)."""

    def check_insert(self, params: InsertParams) -> None:
        """Any state slot (or none) is taken."""

    def update_component_on_insert_overlap(
        self, node: TreeNode, start: int, incoming: SlotArray, params: InsertParams
    ) -> None:
        """The inserter's slots past its own prefix are duplicates: freed, in walk order."""
        dup_start = max(0, params.prev_prefix_len - start)
        if dup_start < len(incoming):
            self.tree.free_slots([incoming[dup_start:]])

    def commit_insert_component_data(
        self, node: TreeNode, start: int, end: int, params: InsertParams, fresh: bool
    ) -> bool:
        """The state ``params.mamba`` (None: KV only, ours for Marconi's admission; SGLang always
        passes one) goes to a new leaf or a tombstone; an existing state wins."""
        mamba = params.mamba
        if fresh:
            if mamba is not None:
                self._set_state(node, mamba)
            return False
        if node is self.tree.root_node or mamba is None:
            return node.mamba is not None
        if node.mamba is None:  # (the insert's walk stamped it, as SGLang's commit does)
            self._set_state(node, mamba)
            self.tree.version += 1  # a match can now reach further
            return False
        self.lru.move_to_end(node.id)
        return True

    # ------------------------------------------------------------------ locks
    def acquire_component_lock(self, node: TreeNode) -> int | None:
        """The node only."""
        if node.mamba_lock == 0 and node.mamba is not None:
            self.evictable -= 1
            self.protected += 1
        node.mamba_lock += 1
        return None

    def release_component_lock(self, receipt: LockReceipt) -> None:
        node = receipt.node
        if node.mamba_lock <= 0:
            raise RuntimeError(f"unbalanced dec_lock_ref on {node}")
        if node.mamba_lock == 1 and node.mamba is not None:
            self.evictable += 1
            self.protected -= 1
        node.mamba_lock -= 1

    # ------------------------------------------------------------------ eviction
    def on_delete_leaf(self, leaf: TreeNode, freed: list[int]) -> None:
        if leaf.mamba is not None:
            self._drop_state(leaf)
            freed[1] += 1

    def evict_component(self, amount: int, freed: list[int]) -> None:
        holders = list(self.lru.values())
        if self.tree.order is not None:
            holders = self.tree.order([n for n in holders if not n.mamba_lock])
        for node in holders:
            if freed[1] >= amount:
                break
            if node.id not in self.lru or node.mamba_lock:
                continue
            if self.tree.in_leaf_index(node):
                self.tree.delete_leaf(node, freed)
            else:
                self._drop_state(node)  # internal (or full-locked): tombstone
                self.tree.version += 1
                freed[1] += 1

    # ------------------------------------------------------------------ inspection
    def check(self) -> None:
        me = mp = 0
        holders = set()
        for node in self.tree.iter_nodes():
            assert node.lock_ref >= node.mamba_lock, f"{node}: Mamba lock without the full lock"
            if node.mamba is not None:
                holders.add(node.id)
                if node.mamba_lock:
                    mp += 1
                else:
                    me += 1
        root = self.tree.root_node
        assert root.mamba is None and not root.mamba_lock, "the root holds no state, no Mamba lock"
        assert (me, mp) == (self.evictable, self.protected), f"mamba sizes drifted {me, mp}"
        assert holders == set(self.lru), "Mamba LRU != nodes holding a state"
