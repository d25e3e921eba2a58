"""``FreeKVCacheBlockQueue``: the free blocks as a doubly linked list threaded through them.

Why not a deque: a cached block that gets hit again must leave the middle of the queue in O(1)
(``remove``), and the links live in the blocks, so no operation allocates a Python object.
Order: head = next to be allocated (and so evicted, LRU); tail = most recently freed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import overload

from prefixcache.backends.hashchain.block import KVCacheBlock


class LazyBlocks:
    """The pool's blocks by id, each created on first use: vLLM preallocates one object per
    block, which at 10^8 tokens is seconds and gigabytes before the first request. A block
    never handed out is fresh (no hash, no holder, free), which is what a new one is."""

    __slots__ = ("_blocks", "make_block")

    def __init__(self, num_blocks: int, make_block: Callable[[int], KVCacheBlock] = KVCacheBlock) -> None:
        """``make_block(block_id)``: a fresh block (a ranked pool's carry its policy's fields)."""
        try:
            self._blocks: list[KVCacheBlock | None] = [None] * num_blocks
        except MemoryError:
            raise ValueError(f"a pool of {num_blocks} blocks does not fit in this machine's memory") from None
        self.make_block = make_block

    def __len__(self) -> int:
        return len(self._blocks)

    @overload
    def __getitem__(self, index: int) -> KVCacheBlock: ...
    @overload
    def __getitem__(self, index: slice) -> list[KVCacheBlock]: ...
    def __getitem__(self, index: int | slice) -> KVCacheBlock | list[KVCacheBlock]:
        if isinstance(index, slice):
            start, stop, step = index.indices(len(self._blocks))
            if step == 1:
                return self.run(start, stop)
            return [self[i] for i in range(start, stop, step)]
        block = self._blocks[index]
        if block is None:
            block = self._blocks[index] = self.make_block(index % len(self._blocks))
        return block

    def run(self, lo: int, hi: int) -> list[KVCacheBlock]:
        """Blocks ``lo`` to ``hi - 1``, creating those not yet used (one pass, no per-block call
        through ``__getitem__``: a fresh run hands out thousands at a time). A run of which
        none is made yet, the usual case, is made by one ``map`` (tests/bench times the pair)."""
        blocks, make_block = self._blocks, self.make_block
        out = blocks[lo:hi]
        if out.count(None) == len(out):
            out = blocks[lo:hi] = list(map(make_block, range(lo, lo + len(out))))
            return out  # type: ignore[return-value]
        for k, block in enumerate(out):
            if block is None:
                out[k] = blocks[lo + k] = make_block(lo + k)
        return out  # type: ignore[return-value]  # every None was replaced

    def __iter__(self) -> Iterator[KVCacheBlock]:
        """Every block (creating those not yet used: for checks and tests)."""
        return (self[i] for i in range(len(self._blocks)))

    def created(self) -> list[KVCacheBlock]:
        """The blocks created so far (the others are fresh)."""
        return [b for b in self._blocks if b is not None]


class _FreshRun(KVCacheBlock):
    """A queue entry standing for the never-used blocks ``[lo, hi)`` in ascending order: they
    sit together where the queue began (freed blocks are linked before or after them, never
    among them), so one entry keeps vLLM's order without an object per block."""

    __slots__ = ("lo", "hi", "blocks")

    def __init__(self, blocks: LazyBlocks) -> None:
        super().__init__(-2)
        self.blocks = blocks
        self.lo, self.hi = 0, len(blocks)

    def take(self, n: int) -> list[KVCacheBlock]:
        out = self.blocks.run(self.lo, min(self.lo + n, self.hi))
        self.lo += len(out)
        return out


class FreeKVCacheBlockQueue:
    __slots__ = ("num_free_blocks", "fake_free_list_head", "fake_free_list_tail")

    def __init__(self, blocks: list[KVCacheBlock] | LazyBlocks) -> None:
        # Sentinels: every real block in the queue has both neighbours, so no edge branches.
        self.fake_free_list_head = KVCacheBlock(-1)
        self.fake_free_list_tail = KVCacheBlock(-1)
        self.fake_free_list_head.next_free_block = self.fake_free_list_tail
        self.fake_free_list_tail.prev_free_block = self.fake_free_list_head
        self.num_free_blocks = 0
        if isinstance(blocks, LazyBlocks):  # ascending block id at start, as one fresh run
            run = _FreshRun(blocks)
            self._link_between(self.fake_free_list_head, self.fake_free_list_tail, (run,))
            self.num_free_blocks = len(blocks)
        else:
            self.append_n(blocks)  # ascending block id at start

    def popleft(self) -> KVCacheBlock:
        if self.num_free_blocks == 0:
            raise ValueError("No free blocks available")
        return self.popleft_n(1)[0]

    def popleft_n(self, n: int) -> list[KVCacheBlock]:
        """Pop the first ``n`` blocks in one pass, relinking the head once."""
        if n > self.num_free_blocks:
            raise ValueError(f"cannot pop {n} blocks: only {self.num_free_blocks} free")
        out: list[KVCacheBlock] = []
        append = out.append
        curr = self.fake_free_list_head.next_free_block
        left = n
        while left:
            assert curr is not None
            nxt = curr.next_free_block
            if type(curr) is _FreshRun:
                taken = curr.take(left)
                out += taken
                left -= len(taken)
                if curr.lo < curr.hi:
                    break  # the run goes on: it stays the head
            else:
                append(curr)
                left -= 1
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

    @staticmethod
    def blocks_of(entry: KVCacheBlock) -> list[KVCacheBlock]:
        """The blocks a queue entry stands for: itself, or a fresh run's blocks."""
        return entry.blocks[entry.lo : entry.hi] if isinstance(entry, _FreshRun) else [entry]

    def get_all_free_blocks(self) -> list[KVCacheBlock]:
        """Head to tail (for tests and invariant checks; O(n); creates the fresh blocks)."""
        out: list[KVCacheBlock] = []
        curr = self.fake_free_list_head.next_free_block
        while curr is not None and curr is not self.fake_free_list_tail:
            out += self.blocks_of(curr)
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
