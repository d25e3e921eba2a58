"""PagePool reproduces SGLang 0.5.23's KV allocators in both of their modes.

need_sort=False (SGLang's default): page size 1 appends freed slots (allocator/token.py
``free``), page size > 1 prepends each call's pages (allocator/paged.py ``_release_page_ids``).
need_sort=True (PD disaggregation): freed pages are staged and merged+sorted only when an
allocation finds the front short (allocator/base.py ``merge_and_sort_free``), tested against
the caller's over-estimate where SGLang tests one (paged ``alloc_extend``, ``alloc_decode``).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from prefixcache.pool import PagePool


def ids(pages: object) -> list[int]:
    return [int(p) for p in np.asarray(pages).tolist()]


def test_default_token_allocator_reuses_the_longest_free_slot_first() -> None:
    pool = PagePool(8, page_size=1)  # TokenToKVPoolAllocator, need_sort=False
    assert ids(pool.alloc(5)) == [1, 2, 3, 4, 5]
    pool.free([4, 2])
    pool.free([1])
    # freed slots go to the tail in the order given: 6, 7 first, then 4, 2, 1
    assert ids(pool.free_list()) == [6, 7, 4, 2, 1]
    assert ids(pool.alloc(4)) == [6, 7, 4, 2]
    pool.check()


def test_default_paged_allocator_reuses_the_last_freed_pages_first() -> None:
    pool = PagePool(8, page_size=4)  # PagedTokenToKVPoolAllocator, need_sort=False
    assert ids(pool.alloc(5)) == [1, 2, 3, 4, 5]
    pool.free([4, 2])
    pool.free([5, 1])
    # each call's pages go to the front as a block, in the order given (free_segment keeps it)
    assert ids(pool.free_list()) == [5, 1, 4, 2, 6, 7]
    assert ids(pool.alloc(3)) == [5, 1, 4]
    pool.check()


def test_need_sort_allocator_merges_and_sorts_only_when_the_front_runs_short() -> None:
    for page_size in (1, 4):
        pool = PagePool(8, need_sort=True, page_size=page_size)
        assert ids(pool.alloc(5)) == [1, 2, 3, 4, 5]
        pool.free([4, 2])
        assert ids(pool.alloc(2)) == [6, 7], "the front still had two pages: no merge"
        pool.free([5, 1])
        assert pool.num_ready == 0 and pool.num_free == 4
        assert ids(pool.alloc(3)) == [1, 2, 4], "short: staged pages merged in and sorted"
        pool.check()


def test_need_sort_merge_test_uses_the_callers_over_estimate() -> None:
    pool = PagePool(8, need_sort=True, page_size=4)
    pool.alloc(5)
    pool.free([3])
    # alloc_extend tests extend_num_tokens // page_size + bs + 1 > len(free_pages): with two
    # pages in front, a 1-page extend of 4 tokens tests 3 > 2 and merges before taking page 3.
    assert ids(pool.alloc(1, merge_if_over=4 // 4 + 1 + 1)) == [3]
    assert ids(pool.free_list()) == [6, 7]
    # and a 0-page extend still runs the test (and merges)
    pool.free([1])
    assert ids(pool.alloc(0, merge_if_over=2)) == []
    assert ids(pool.free_list()) == [6, 7, 1]  # 2 > 2 is false: no merge
    assert ids(pool.alloc(0, merge_if_over=3)) == []
    assert ids(pool.free_list()) == [1, 6, 7]


@pytest.mark.parametrize("need_sort", [False, True])
@pytest.mark.parametrize("page_size", [1, 4])
def test_failed_alloc_changes_nothing(need_sort: bool, page_size: int) -> None:
    pool = PagePool(6, need_sort=need_sort, page_size=page_size)
    pool.alloc(4)
    pool.free([3, 1])
    before = ids(pool.free_list())
    assert pool.alloc(4, merge_if_over=9) is None
    assert ids(pool.free_list()) == before
    pool.check()


def test_free_rejects_reserved_unknown_and_double_frees() -> None:
    for need_sort in (False, True):
        pool = PagePool(6, need_sort=need_sort, page_size=4)
        pool.alloc(3)
        for bad in ([0], [6], [4], [1, 1]):
            with pytest.raises(ValueError):
                pool.free(bad)
        for runs in ([[1], [1]], [[2], [0]], [[3], [4]]):  # repeated across runs, reserved, free
            with pytest.raises(ValueError):
                pool.free_each([np.array(run, dtype=np.int64) for run in runs])
        pool.check()
        assert pool.num_free == 2, "a refused free_each changed the pool"


class ListModel:
    """SGLang's allocators written out with Python lists, straight from their source."""

    def __init__(self, num_pages: int, need_sort: bool, page_size: int) -> None:
        self.free_pages = list(range(1, num_pages))
        self.staged: list[int] = []
        self.need_sort, self.page_size = need_sort, page_size

    def alloc(self, n: int, merge_if_over: int) -> list[int] | None:
        if n > len(self.free_pages) + len(self.staged):
            return None
        if self.need_sort and max(n, merge_if_over) > len(self.free_pages):
            self.free_pages = sorted(self.free_pages + self.staged)
            self.staged = []
        out, self.free_pages = self.free_pages[:n], self.free_pages[n:]
        return out

    def free(self, pages: list[int]) -> None:
        if self.need_sort:
            self.staged += pages
        elif self.page_size == 1:
            self.free_pages = self.free_pages + pages
        else:
            self.free_pages = pages + self.free_pages


@given(
    need_sort=st.booleans(),
    page_size=st.sampled_from([1, 4]),
    steps=st.lists(st.tuples(st.booleans(), st.integers(0, 6), st.integers(0, 9), st.randoms()), max_size=40),
)
def test_pool_agrees_with_a_list_model_of_sglangs_allocators(
    need_sort: bool, page_size: int, steps: list[tuple[bool, int, int, object]]
) -> None:
    pool, model = PagePool(12, need_sort=need_sort, page_size=page_size), ListModel(12, need_sort, page_size)
    held: list[int] = []
    for is_alloc, n, over, rnd in steps:
        if is_alloc or not held:
            got, want = pool.alloc(n, merge_if_over=over), model.alloc(n, over)
            assert (None if got is None else ids(got)) == want
            held += want or []
        else:
            rnd.shuffle(held)  # type: ignore[attr-defined]
            k = 1 + n % len(held)
            pages, held = held[:k], held[k:]
            if over % 2:  # one free call
                pool.free(np.array(pages))
                model.free(pages)
            else:  # a free call per run, made at once (a radix eviction's leaves)
                cut = sorted({0, k, *(rnd.randrange(k + 1) for _ in range(over // 2))})  # type: ignore[attr-defined]
                runs = [pages[a:b] for a, b in zip(cut[:-1], cut[1:], strict=True)]
                pool.free_each([np.array(run, dtype=np.int64) for run in runs])
                for run in runs:
                    model.free(run)
        assert ids(pool.free_list()) == model.free_pages + model.staged
        assert pool.num_free == len(model.free_pages) + len(model.staged)
        pool.check()
