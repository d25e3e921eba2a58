"""The page allocator that the radix and no-cache backends share (SGLang's KV allocators).

Pages are integer ids in ``[1, num_pages)``; page 0 is reserved and never handed out (SGLang's
padding slot). Allocation always takes pages from the front of the free list. What happens to
freed pages follows SGLang 0.5.23's two modes (``mem_cache/allocator/``):

``need_sort=False`` (SGLang's default; it sets ``need_sort`` only under prefill/decode
disaggregation, ``kv_cache_configurator.py``):
    page size 1 (``TokenToKVPoolAllocator.free``): freed pages are **appended** at the tail in
    the order given, so the pool is FIFO: the longest-free page is reused first;
    page size > 1 (``PagedTokenToKVPoolAllocator._release_page_ids``): each free call's pages
    are **prepended** as a block in the order given, so the most recently freed pages are
    reused first. (SGLang's backends free through ``free_segment``/``free_page_ids``, which
    keep the given order; only its ``free()`` sorts a call's pages via ``torch.unique``.)
``need_sort=True``:
    freed pages are staged (``release_pages`` / ``staged_pages``) and merged into the free
    list, which is then sorted, only when an allocation finds the front too short:
    ``merge_and_sort_free``. The caller may give a larger ``merge_if_over`` than it allocates,
    because ``alloc_extend`` tests an over-estimate (``extend_num_tokens // page_size + bs +
    1``) and ``alloc_decode`` tests ``bs``, not the exact page count.

A free group (``group_begin`` / ``group_end``, SGLang's ``free_group_begin`` /
``free_group_end``, which its scheduler opens around a batch's checkpoints and releases and
around ``maybe_evict_swa``) holds the frees made inside it and returns them to the list as one
call, in the order they were made: at page size > 1 that is one prepended block instead of
one block per call (which reverses the order across calls). Pages freed in a group count as
free at once (SGLang's count catches up at ``group_end``; nothing allocates inside a group
there); an allocation inside a group returns them first.

The free list lives in a numpy buffer of twice the pool size: appends write after the live
region, prepends before it (paged mode keeps the region's end fixed, so a prepend always
fits), so no operation loops over pages in Python. The hashchain backend keeps its own free
queue (vLLM's ``FreeKVCacheBlockQueue``) over the same id space and size.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt

PageIds = npt.NDArray[np.int64]
HELD = -1  # PagePool._free_mark of a page that is not free


class PageUsage(NamedTuple):
    """Where the usable pages are, of every cache's pool (``PrefixCache.usage``) and of a host
    tier's (``HostTier.usage``); for a cache the three add up to ``num_usable_pages()``.

    free:      hold nothing reusable.
    evictable: hold cached KV that no running request pins (reclaimable on demand).
    in_use:    pinned by at least one running request.
    """

    free: int
    evictable: int
    in_use: int


class PagePool:
    __slots__ = (
        "num_pages", "need_sort", "append_freed", "_buf", "_head", "_tail",
        "_released", "_num_released", "_free_mark", "_positions", "_group", "_num_grouped",
    )

    def __init__(self, num_pages: int, *, need_sort: bool = False, page_size: int = 1) -> None:
        if num_pages < 2:
            raise ValueError(f"a pool needs at least 2 pages (page 0 is reserved), got {num_pages}")
        if page_size < 1:
            raise ValueError(f"page_size must be >= 1, got {page_size}")
        self.num_pages = num_pages
        self.need_sort = need_sort
        # SGLang's token allocator (page size 1) appends freed slots; its paged one prepends.
        self.append_freed = page_size == 1
        try:
            # A page's free flag and the repeated-id check's scratch in one array (_flag_freed):
            # HELD (-1) while held, >= 0 while free. int32 where positions fit: half the memory
            # that a free's random reads and writes touch.
            index = np.int32 if num_pages <= np.iinfo(np.int32).max else np.int64
            self._free_mark = np.zeros(num_pages, dtype=index)
            self._buf: PageIds = np.empty(2 * num_pages, dtype=np.int64)
            self._positions = np.arange(0, dtype=index)  # 0, 1, 2, ...: grown as frees need
        except MemoryError:
            gib = num_pages * 24 / 2**30  # bytes a page: 4 (free mark) + 16 (free list) + 4 (positions)
            raise ValueError(
                f"a pool of {num_pages} pages needs about {gib:.1f} GiB of bookkeeping, more than "
                "this machine can allocate; lower the capacity (or raise the page size)"
            ) from None
        self._free_mark[0] = HELD  # the reserved page is never free, never allocated
        self._head = self._tail = 0
        self._place(np.arange(1, num_pages, dtype=np.int64))
        self._released: list[PageIds] = []
        self._num_released = 0
        self._group: list[PageIds] | None = None  # frees held by an open group, in call order
        self._num_grouped = 0

    @property
    def num_free(self) -> int:
        return self._tail - self._head + self._num_released + self._num_grouped

    @property
    def in_group(self) -> bool:
        return self._group is not None

    def group_begin(self) -> None:
        """Hold the frees from here to ``group_end`` (groups do not nest)."""
        if self._group is not None:
            raise RuntimeError("free groups cannot be nested")
        self._group = []

    def group_end(self) -> None:
        """Return the held frees to the free list as one call, in the order they were made."""
        if self._group is None:
            raise RuntimeError("group_end without group_begin")
        self._return_grouped()
        self._group = None

    def end_group(self) -> None:
        """End the open group, if any."""
        if self._group is not None:
            self.group_end()

    def _return_grouped(self) -> None:
        if self._group:
            held = np.concatenate(self._group)
            self._group.clear()
            self._num_grouped = 0
            self._put(held)

    @property
    def num_ready(self) -> int:
        """Free pages in the free list proper (not staged for a merge)."""
        return self._tail - self._head

    def alloc(self, n: int, *, merge_if_over: int | None = None) -> PageIds | None:
        """Take ``n`` pages from the front of the free list; None (nothing changed) if fewer
        than ``n`` are free. With ``need_sort``, staged pages are merged in and the list sorted
        first when ``max(n, merge_if_over)`` exceeds the pages in the list (SGLang's test).
        ``n`` may be 0: only the merge test runs (SGLang's ``alloc_extend`` runs it even when
        the extend fits in the request's last page)."""
        if n > self.num_free:
            return None  # SGLang raises out-of-memory here; we change nothing instead
        self._return_grouped()
        if self.would_merge(n, merge_if_over):
            self._merge_released()
        pages = self._buf[self._head : self._head + n].copy()
        self._head += n
        self._free_mark[pages] = HELD
        return pages

    def would_merge(self, n: int, merge_if_over: int | None = None) -> bool:
        """Whether ``alloc(n, merge_if_over=...)`` merges the staged pages in first."""
        return self.need_sort and max(n, merge_if_over or 0) > self._tail - self._head

    def free(self, pages: npt.ArrayLike) -> None:
        """Return pages to the pool, in the given order (which decides reuse order unless
        ``need_sort``). Raises ValueError on page 0, unknown or already-free ids."""
        arr = np.asarray(pages, dtype=np.int64).reshape(-1)
        if arr.size == 0:
            return
        self._flag_freed(arr)
        if self._group is not None:
            self._group.append(arr.copy())
            self._num_grouped += arr.size
        else:
            self._put(arr)

    def free_each(self, runs: Sequence[PageIds]) -> None:
        """``free(run)`` for each of ``runs`` in turn, each its own free call (a leaf-by-leaf
        eviction's), checked and placed at once: the pool ends exactly as after the calls
        (paged mode prepends each call's block, so the last call's pages come first)."""
        if len(runs) <= 1:
            if runs:
                self.free(runs[0])
            return
        arr = np.concatenate(runs)
        if arr.size == 0:
            return
        self._flag_freed(arr)
        if self._group is not None:  # a group, staging and appending keep the calls' order
            self._group.append(arr)
            self._num_grouped += arr.size
        elif self.need_sort or self.append_freed:
            self._put(arr)
        else:
            self._put(np.concatenate(runs[::-1]))

    def _flag_freed(self, arr: PageIds) -> None:
        """Mark ``arr`` free; ValueError (nothing changed) on page 0, unknown, free or repeated ids.

        Marking writes each page's position in ``arr`` under it, which is also the check for a
        repeated id, in O(len(arr)) (np.unique would sort): a repeated id keeps only one of its
        positions (whichever numpy writes last), so reading back cannot give every position."""
        try:
            marks = self._free_mark[arr]  # IndexError past the last page
        except IndexError:
            marks = None
        if marks is None or arr.min() < 1:
            raise ValueError(f"page ids must lie in [1, {self.num_pages}), got {arr.min()}..{arr.max()}")
        if marks.max() != HELD:
            raise ValueError(f"double free of pages {arr[marks != HELD].tolist()[:8]}")
        if arr.size == 1:
            self._free_mark[arr] = 0
            return
        positions = self._positions_for(arr.size)
        self._free_mark[arr] = positions
        if (self._free_mark[arr] != positions).any():
            self._free_mark[arr] = HELD  # as it was: every one was held
            ids, counts = np.unique(arr, return_counts=True)
            raise ValueError(f"double free of pages {ids[counts > 1].tolist()[:8]} (repeated in one call)")

    def _put(self, arr: PageIds) -> None:
        """Place freed (already flagged) pages as one free call of SGLang's allocator."""
        if self.need_sort:
            self._released.append(arr.copy())
            self._num_released += arr.size
        elif self.append_freed:
            if self._tail + arr.size > len(self._buf):  # shift the live region to the start
                live = self._tail - self._head
                self._buf[:live] = self._buf[self._head : self._tail]
                self._head, self._tail = 0, live
            self._buf[self._tail : self._tail + arr.size] = arr
            self._tail += arr.size
        else:
            # The region ends at len(buf) and holds < num_pages ids, so there is always room.
            self._buf[self._head - arr.size : self._head] = arr
            self._head -= arr.size

    def _place(self, ids: PageIds) -> None:
        """Make ``ids`` the whole free list, at the end of the buffer that its mode grows from."""
        start = 0 if self.append_freed else len(self._buf) - ids.size
        self._buf[start : start + ids.size] = ids
        self._head, self._tail = start, start + ids.size

    def _positions_for(self, n: int) -> npt.NDArray[Any]:
        """0, 1, ..., n - 1 (a view of one array, grown by doubling)."""
        if n > self._positions.size:
            self._positions = np.arange(max(n, 2 * self._positions.size), dtype=self._free_mark.dtype)
        return self._positions[:n]

    def free_page_ids(self) -> PageIds:
        """All free page ids (for invariant checks; O(num_pages))."""
        return np.flatnonzero(self._free_mark != HELD).astype(np.int64)

    def free_list(self) -> PageIds:
        """The free list in allocation order, then the staged pages (a copy; for tests); a
        group's held frees where its ``group_end`` will put them."""
        listed = self._buf[self._head : self._tail]
        held = self._group or []
        if not held or self.need_sort or self.append_freed:
            return np.concatenate([listed, *self._released, *held])
        return np.concatenate([*held, listed])

    def is_free(self, page: int) -> bool:
        return bool(self._free_mark[page] != HELD)

    def _merge_released(self) -> None:
        """SGLang's ``merge_and_sort_free``: staged pages join the list, which is sorted. By a
        stable sort (timsort), which merges ascending runs as it finds them: the list is one
        (with ``need_sort`` every free is staged and allocations take its front), and a freed
        request's pages mostly are, as they were taken from the sorted list."""
        if self._released:
            merged = self.free_list()  # a new array: the list, then the staged pages
            merged.sort(kind="stable")
            self._place(merged)
            self._released = []
            self._num_released = 0

    def check(self) -> None:
        """Free list and free flags agree (AssertionError otherwise)."""
        listed = self.free_list()
        assert len(np.unique(listed)) == listed.size, "a page is listed free twice"
        assert listed.size == int((self._free_mark != HELD).sum()), "free list and free flags disagree"
        assert bool((self._free_mark[listed] != HELD).all()), "a listed page is not flagged free"
        assert self._free_mark[0] == HELD, "page 0 is reserved and must never be free"


class PageTable:
    """A request's page ids in token order: a list-like growable array.

    Behaves like the ``list[int]`` it replaces where the backends use one (``len``, iteration,
    slice assignment of equal length, and slices that are copies, never views, so a slice
    taken before an overwrite keeps the old ids), while conversions to slots and frees to
    the pool stay numpy operations instead of a Python step per page.
    """

    __slots__ = ("_buf", "_n")

    def __init__(self, pages: npt.ArrayLike = ()) -> None:
        arr = np.asarray(pages, dtype=np.int64).reshape(-1)
        self._buf: PageIds = arr.copy()
        self._n = arr.size

    def __len__(self) -> int:
        return self._n

    def __iter__(self) -> Iterator[int]:
        return iter(self.tolist())

    def __getitem__(self, idx: slice) -> PageIds:
        if not isinstance(idx, slice):
            raise TypeError(f"PageTable takes slices only, got {idx!r}")
        return self._buf[: self._n][idx].copy()

    def __setitem__(self, idx: slice, pages: npt.ArrayLike) -> None:
        view = self._buf[: self._n][idx]
        arr = np.asarray(pages, dtype=np.int64).reshape(-1)
        if arr.size != view.size:
            raise ValueError(f"page table slice of {view.size} pages assigned {arr.size} ids")
        view[:] = arr

    def extend(self, pages: PageIds) -> None:
        """Append ``pages``; the buffer doubles when full, so decode appends amortise to O(1)."""
        end = self._n + len(pages)
        if end > len(self._buf):
            grown = np.empty(max(end, 2 * len(self._buf)), dtype=np.int64)
            grown[: self._n] = self._buf[: self._n]
            self._buf = grown
        self._buf[self._n : end] = pages
        self._n = end

    def append(self, page: int) -> None:
        """Append one page id (a decode step's page: a scalar store, not a slice copy)."""
        n = self._n
        if n == len(self._buf):
            self.extend(np.array([page], dtype=np.int64))
            return
        self._buf[n] = page
        self._n = n + 1

    def array(self) -> PageIds:
        """A read-only view of the ids (valid until the next extend or assignment)."""
        view = self._buf[: self._n]
        view.flags.writeable = False
        return view

    def tolist(self) -> list[int]:
        return self._buf[: self._n].tolist()  # type: ignore[no-any-return]

    def __repr__(self) -> str:
        return f"PageTable({self.tolist()!r})"
