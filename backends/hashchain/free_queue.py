"""``FreeKVCacheBlockQueue``: the free blocks as a doubly linked list threaded through them.

Why not a deque: a cached block that gets hit again must leave the middle of the queue in O(1)
(``remove``), and the links live in the blocks, so no operation allocates a Python object.
Order: head = next to be allocated (and so evicted, LRU); tail = most recently freed.
"""

from __future__ import annotations

from collections.abc import Iterable

from prefixcache.backends.hashchain.block import KVCacheBlock


class FreeKVCacheBlockQueue:
    __slots__ = ("num_free_blocks", "fake_free_list_head", "fake_free_list_tail")

    def __init__(self, blocks: list[KVCacheBlock]) -> None:
        # Sentinels: every real block in the queue has both neighbours, so no edge branches.
        self.fake_free_list_head = KVCacheBlock(-1)
        self.fake_free_list_tail = KVCacheBlock(-1)
        self.fake_free_list_head.next_free_block = self.fake_free_list_tail
        self.fake_free_list_tail.prev_free_block = self.fake_free_list_head
        self.num_free_blocks = 0
        self.append_n(blocks)  # ascending block id at start

    def popleft(self) -> KVCacheBlock:
        first = self.fake_free_list_head.next_free_block
        if first is self.fake_free_list_tail or first is None:
            raise ValueError("No free blocks available")
        self._unlink(first)
        return first

    def popleft_n(self, n: int) -> list[KVCacheBlock]:
        """Pop the first ``n`` blocks in one pass, relinking the head once."""
        if n > self.num_free_blocks:
            raise ValueError(f"cannot pop {n} blocks: only {self.num_free_blocks} free")
        out: list[KVCacheBlock] = []
        curr = self.fake_free_list_head.next_free_block
        for _ in range(n):
            assert curr is not None
            out.append(curr)
            nxt = curr.next_free_block
            curr.prev_free_block = curr.next_free_block = None
            curr = nxt
        assert curr is not None
        self.fake_free_list_head.next_free_block = curr
        curr.prev_free_block = self.fake_free_list_head
        self.num_free_blocks -= n
        return out

    def remove(self, block: KVCacheBlock) -> None:
        """Take ``block`` out of the middle of the queue in O(1)."""
        if block.prev_free_block is None or block.next_free_block is None:
            raise ValueError(f"remove() of block {block.block_id}, which is not in the free queue")
        self._unlink(block)

    def append(self, block: KVCacheBlock) -> None:
        self.append_n((block,))

    def append_n(self, blocks: Iterable[KVCacheBlock]) -> None:
        """Link ``blocks`` at the tail, in the given order."""
        last = self.fake_free_list_tail.prev_free_block
        assert last is not None
        self._link_between(last, self.fake_free_list_tail, blocks)

    def prepend_n(self, blocks: Iterable[KVCacheBlock]) -> None:
        """Link ``blocks`` at the head, keeping their order (blocks[0] becomes the head)."""
        first = self.fake_free_list_head.next_free_block
        assert first is not None
        self._link_between(self.fake_free_list_head, first, blocks)

    def _link_between(self, prev: KVCacheBlock, after: KVCacheBlock, blocks: Iterable[KVCacheBlock]) -> None:
        """Link ``blocks``, in order, between the adjacent ``prev`` and ``after``."""
        count = 0
        for block in blocks:
            if block.prev_free_block is not None or block.next_free_block is not None:
                self._check_unlinked(block)  # raises
            prev.next_free_block = block
            block.prev_free_block = prev
            prev = block
            count += 1
        prev.next_free_block = after
        after.prev_free_block = prev
        self.num_free_blocks += count

    def get_all_free_blocks(self) -> list[KVCacheBlock]:
        """Head to tail (for tests and invariant checks; O(n))."""
        out: list[KVCacheBlock] = []
        curr = self.fake_free_list_head.next_free_block
        while curr is not None and curr is not self.fake_free_list_tail:
            out.append(curr)
            curr = curr.next_free_block
        return out

    def _unlink(self, block: KVCacheBlock) -> None:
        prev, nxt = block.prev_free_block, block.next_free_block
        assert prev is not None and nxt is not None
        prev.next_free_block = nxt
        nxt.prev_free_block = prev
        block.prev_free_block = block.next_free_block = None
        self.num_free_blocks -= 1

    @staticmethod
    def _check_unlinked(block: KVCacheBlock) -> None:
        # vLLM trusts its callers here; a double free would silently corrupt the list.
        if block.prev_free_block is not None or block.next_free_block is not None:
            raise ValueError(f"block {block.block_id} is already in the free queue")
