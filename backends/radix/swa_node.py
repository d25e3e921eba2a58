"""SWANode and SWALRU: a node of the hybrid SWA radix tree and the list of nodes holding SWA KV
(SGLang 0.5.23's ``UnifiedTreeNode`` with its FULL and SWA component data, and the SWA
component's ``LRUList``)."""

from __future__ import annotations

import numpy as np
from prefixcache.backends.radix.key import ChildKey, RadixKey
from prefixcache.backends.radix.tree import SlotArray

EMPTY: SlotArray = np.empty(0, dtype=np.int64)


class SWANode:
    __slots__ = (
        "children",
        "parent",
        "key",
        "value",
        "swa",
        "full_lock",
        "swa_lock",
        "swa_uuid",
        "last_access_time",
        "id",
        "lru_prev",
        "lru_next",
    )

    def __init__(self, node_id: int, now: float) -> None:
        self.children: dict[ChildKey, SWANode] = {}
        self.parent: SWANode | None = None
        self.key = RadixKey(EMPTY)
        self.value: SlotArray | None = EMPTY  # full-pool slots; None once deleted
        self.swa: SlotArray | None = None  # SWA-pool slots; None = tombstone
        self.full_lock = 0
        self.swa_lock = 0
        self.swa_uuid: int | None = None  # set on the node where an SWA lock's window ends
        self.last_access_time = now
        self.id = node_id
        self.lru_prev: SWANode | None = None
        self.lru_next: SWANode | None = None

    @property
    def tombstone(self) -> bool:
        return self.swa is None

    def __lt__(self, other: SWANode) -> bool:
        return self.last_access_time < other.last_access_time

    def __repr__(self) -> str:
        return (
            f"SWANode(id={self.id}, len={len(self.key)}, full_lock={self.full_lock}, "
            f"swa_lock={self.swa_lock}, tombstone={self.tombstone})"
        )


class SWALRU:
    """Doubly linked list of the nodes holding SWA KV, MRU after ``head``."""

    def __init__(self) -> None:
        self.head = SWANode(-1, 0.0)
        self.tail = SWANode(-2, 0.0)
        self.head.lru_next, self.tail.lru_prev = self.tail, self.head
        self.members: set[int] = set()

    def __contains__(self, node: SWANode | None) -> bool:
        return node is not None and node.id in self.members

    def _link_after(self, prev: SWANode, node: SWANode) -> None:
        nxt = prev.lru_next
        assert nxt is not None
        node.lru_prev, node.lru_next = prev, nxt
        nxt.lru_prev = node
        prev.lru_next = node

    def _unlink(self, node: SWANode) -> None:
        assert node.lru_prev is not None and node.lru_next is not None
        node.lru_prev.lru_next = node.lru_next
        node.lru_next.lru_prev = node.lru_prev
        node.lru_prev = node.lru_next = None

    def insert_mru(self, node: SWANode) -> None:
        assert node.id not in self.members
        self.members.add(node.id)
        self._link_after(self.head, node)

    def insert_after(self, prev: SWANode, node: SWANode) -> None:
        assert prev.id in self.members and node.id not in self.members
        self.members.add(node.id)
        self._link_after(prev, node)

    def remove(self, node: SWANode) -> None:
        self.members.remove(node.id)
        self._unlink(node)

    def refresh_window(self, node: SWANode, root: SWANode, span: int) -> None:
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

    def prev_unlocked(self, node: SWANode) -> SWANode | None:
        """``get_prev_no_lock``: the next node towards the MRU end with no SWA lock."""
        x = node.lru_prev
        assert x is not None
        while x is not self.head and x.swa_lock > 0:
            x = x.lru_prev
            assert x is not None
        return None if x is self.head else x

    def lru_unlocked(self) -> SWANode | None:
        return self.prev_unlocked(self.tail)

    def order(self) -> list[SWANode]:
        """MRU first (for checks)."""
        out, x = [], self.head.lru_next
        while x is not None and x is not self.tail:
            out.append(x)
            x = x.lru_next
        return out
