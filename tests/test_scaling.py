"""No operation does more work in a bigger cache (issue 8: no accidental O(cache size) path).

Work is counted, not timed: the Python and C function calls of an operation
(``bench.count_calls``), which are deterministic. In a pool full of evictable entries, an
admission that has to evict and an explicit ``evict`` make the same calls, on average over a
few operations, whether the pool holds 2^7 or 2^13 pages. A traversal that grows with the pool
(SGLang's leaf collection before each evict, a walk of the free list) multiplies the calls and
fails here. Allowed: a few percent for amortised upkeep (the radix leaf index is a SortedList,
which now and then splits a sublist: O(log n)). Not seen here: an O(n) loop inside one C call
(a list scan); ``make bench``'s wall times are where that would show.
"""

from __future__ import annotations

import random
from functools import partial
from typing import Any

import pytest
from prefixcache.experiments.bench.ops import count_calls, cycle, fill, random_tokens

from prefixcache import CacheConfig, Request, make_cache

REQUEST_TOKENS = 64
VARIANTS = [("hashchain", 16, {}), ("hashchain", 16, {"hash_fn": "xxhash"}), ("radix", 1, {}),
            ("radix", 16, {})]


def mean_calls(
    backend: str, page: int, options: dict[str, Any], pages: int, rounds: int = 8
) -> tuple[float, float]:
    """Mean calls of an evicting admission and of evict(one request) in a full pool."""
    rng = random.Random(7)
    cache = make_cache(backend, CacheConfig(pages * page, page), **options)
    fill(cache, rng, REQUEST_TOKENS)
    admit = evict = 0
    for i in range(rounds):
        assert cache.usage().evictable * page >= REQUEST_TOKENS, "the pool must be full of cache"
        admit += count_calls(partial(cycle, cache, Request(f"admit{i}", random_tokens(rng, REQUEST_TOKENS))))
        evict += count_calls(partial(cache.evict, REQUEST_TOKENS))
        cycle(cache, Request(f"refill{i}", random_tokens(rng, REQUEST_TOKENS)))
    cache.check_invariants()
    return admit / rounds, evict / rounds


@pytest.mark.parametrize(("backend", "page", "options"), VARIANTS)
def test_an_evicting_admission_and_an_evict_do_the_same_work_in_a_64x_bigger_pool(
    backend: str, page: int, options: dict[str, Any]
) -> None:
    small_admit, small_evict = mean_calls(backend, page, options, 2**7)
    for pages in (2**10, 2**13):
        admit, evict = mean_calls(backend, page, options, pages)
        assert admit <= 1.05 * small_admit, (pages, admit, small_admit)
        assert evict <= 1.05 * small_evict, (pages, evict, small_evict)
        if backend == "hashchain":  # no amortised structure at all: exactly equal
            assert (admit, evict) == (small_admit, small_evict)


def test_count_calls_counts_the_work_of_a_python_loop() -> None:
    """The probe itself: n iterations of one call each count n (plus the loop's own)."""
    def loop(n: int) -> None:
        for _ in range(n):
            abs(-1)

    assert count_calls(partial(loop, 100)) - count_calls(partial(loop, 0)) == 100


def test_count_calls_does_not_count_a_garbage_collection() -> None:
    """Finalizers and gc.callbacks belong to whatever left the garbage, not to the operation."""
    import gc

    def make_cycles() -> None:
        for _ in range(2000):  # far past gc's first threshold: a collection would run here
            a: list[object] = []
            a.append(a)

    gc.callbacks.append(lambda phase, info: None)  # a Python call at every collection
    try:
        with_callback = count_calls(make_cycles)
    finally:
        gc.callbacks.pop()
    assert with_callback == count_calls(make_cycles)
