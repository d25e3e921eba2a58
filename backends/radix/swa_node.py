"""SWALRU: the list of nodes holding SWA KV (SGLang 0.5.23's SWA component ``LRUList``), linked
through the nodes' ``lru_prev`` / ``lru_next`` (tree.py)."""

from __future__ import annotations

from prefixcache.backends.radix.tree import TreeNode as SWANode


class SWALRU:
    """Doubly linked list of the nodes holding SWA KV, MRU after ``head``."""

    def __init__(self) -> None:
        self.head, self.tail = SWANode(0.0), SWANode(0.0)
        self.head.id, self.tail.id = -1, -2  # sentinels, never members
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
