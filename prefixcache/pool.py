"""The page allocator that the radix and no-cache backends share (SGLang's paged allocator).

Pages are integer ids in ``[1, num_pages)``; page 0 is reserved and never handed out. The
free list is a numpy array consumed from the front; freed pages collect in a side list and are
merged back (sorted, so low ids are reused first) only when the front runs short, which is what
SGLang's ``PagedTokenToKVPoolAllocator`` does with ``need_sort``. The hashchain backend keeps
its own free queue (vLLM's ``FreeKVCacheBlockQueue``) over the same id space and size.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

PageIds = npt.NDArray[np.int64]


class PagePool:
    __slots__ = ("num_pages", "_free", "_head", "_released", "_num_released", "_is_free")

    def __init__(self, num_pages: int) -> None:
        if num_pages < 2:
            raise ValueError(f"a pool needs at least 2 pages (page 0 is reserved), got {num_pages}")
        self.num_pages = num_pages
        self._is_free = np.ones(num_pages, dtype=bool)
        self._is_free[0] = False  # the reserved page is never free, never allocated
        self._free: PageIds = np.arange(1, num_pages, dtype=np.int64)
        self._head = 0
        self._released: list[PageIds] = []
        self._num_released = 0

    @property
    def num_free(self) -> int:
        return len(self._free) - self._head + self._num_released

    def alloc(self, n: int) -> PageIds | None:
        """Take ``n`` free pages (lowest-numbered first after a merge); None if too few."""
        if n > self.num_free:
            return None
        if n > len(self._free) - self._head:
            self._merge_released()
        pages = self._free[self._head : self._head + n].copy()
        self._head += n
        self._is_free[pages] = False
        return pages

    def free(self, pages: npt.ArrayLike) -> None:
        """Return pages to the pool. Raises ValueError on page 0, unknown or already-free ids."""
        arr = np.asarray(pages, dtype=np.int64).reshape(-1)
        if arr.size == 0:
            return
        if arr.min() < 1 or arr.max() >= self.num_pages:
            raise ValueError(f"page ids must lie in [1, {self.num_pages}), got {arr.min()}..{arr.max()}")
        if self._is_free[arr].any() or len(np.unique(arr)) != arr.size:
            raise ValueError(f"double free of pages {arr[self._is_free[arr]].tolist()[:8]} (or repeated ids)")
        self._is_free[arr] = True
        self._released.append(arr.copy())
        self._num_released += arr.size

    def free_page_ids(self) -> PageIds:
        """All free page ids (for invariant checks; O(num_pages))."""
        return np.flatnonzero(self._is_free).astype(np.int64)

    def is_free(self, page: int) -> bool:
        return bool(self._is_free[page])

    def _merge_released(self) -> None:
        self._free = np.sort(np.concatenate([self._free[self._head :], *self._released]))
        self._head = 0
        self._released = []
        self._num_released = 0

    def check(self) -> None:
        """Free list and free flags agree (AssertionError otherwise)."""
        listed = np.concatenate([self._free[self._head :], *self._released]) if self.num_free else np.empty(0, np.int64)
        assert len(np.unique(listed)) == listed.size, "a page is listed free twice"
        assert listed.size == int(self._is_free.sum()), "free list and free flags disagree"
        assert bool(self._is_free[listed].all()), "a listed page is not flagged free"
        assert not self._is_free[0], "page 0 is reserved and must never be free"
