"""The page allocator that the radix and no-cache backends share (SGLang's paged allocator).

Pages are integer ids in ``[1, num_pages)``; page 0 is reserved and never handed out. The
free list is a numpy array consumed from the front; freed pages collect in a side list and are
merged back (sorted, so low ids are reused first) only when the front runs short, which is what
SGLang's ``PagedTokenToKVPoolAllocator`` does with ``need_sort``. The hashchain backend keeps
its own free queue (vLLM's ``FreeKVCacheBlockQueue``) over the same id space and size.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import numpy.typing as npt

PageIds = npt.NDArray[np.int64]


class PagePool:
    __slots__ = ("num_pages", "_free", "_head", "_released", "_num_released", "_is_free", "_mark")

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
        # Scratch for the repeated-id check in free(); its contents never matter between calls.
        self._mark = np.zeros(num_pages, dtype=np.int64)

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
        if self._is_free[arr].any() or self._has_repeats(arr):
            raise ValueError(f"double free of pages {arr[self._is_free[arr]].tolist()[:8]} (or repeated ids)")
        self._is_free[arr] = True
        self._released.append(arr.copy())
        self._num_released += arr.size

    def _has_repeats(self, arr: PageIds) -> bool:
        """Whether an id occurs twice in ``arr``, in O(len(arr)) (np.unique would sort): write
        each position under its id; a repeated id keeps only one of its positions (whichever
        numpy writes last), so reading back cannot give every position."""
        positions = np.arange(arr.size, dtype=np.int64)
        self._mark[arr] = positions
        return not np.array_equal(self._mark[arr], positions)

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
        listed = np.concatenate([self._free[self._head :], *self._released])
        assert len(np.unique(listed)) == listed.size, "a page is listed free twice"
        assert listed.size == int(self._is_free.sum()), "free list and free flags disagree"
        assert bool(self._is_free[listed].all()), "a listed page is not flagged free"
        assert not self._is_free[0], "page 0 is reserved and must never be free"


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

    def array(self) -> PageIds:
        """A read-only view of the ids (valid until the next extend or assignment)."""
        view = self._buf[: self._n]
        view.flags.writeable = False
        return view

    def tolist(self) -> list[int]:
        return self._buf[: self._n].tolist()  # type: ignore[no-any-return]

    def __repr__(self) -> str:
        return f"PageTable({self.tolist()!r})"
