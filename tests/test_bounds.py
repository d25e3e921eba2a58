"""Bounds: Belady against brute force, the one-pass LRU curve against point replays."""

from __future__ import annotations

import itertools
import random

import pytest
from prefixcache.experiments.analysis.bounds import (
    BlockTrace,
    belady_hits,
    block_trace,
    infinite_cache_hits,
    lru_hit_curve,
    lru_hits,
)


def random_trace(seed: int, n_requests: int = 4, page: int = 2) -> BlockTrace:
    """Requests drawn from a tiny tree of prefixes, so they share and diverge."""
    rng = random.Random(seed)
    roots = [[rng.randrange(3) for _ in range(2 * page)] for _ in range(2)]
    prompts = []
    for _ in range(n_requests):
        p = list(rng.choice(roots))
        p += [rng.randrange(2) for _ in range(rng.randrange(1, 3) * page)] + [9]
        prompts.append(p)
    return block_trace(prompts, page)


def brute_force_best(trace: BlockTrace, capacity: int) -> int:
    """Max total hit blocks over every choice of what to keep after each request."""
    best = 0

    def go(r: int, cache: frozenset[int], total: int) -> None:
        nonlocal best
        if r == len(trace.lookups):
            best = max(best, total)
            return
        k = 0
        while k < len(trace.lookups[r]) and trace.lookups[r][k] in cache:
            k += 1
        pool = sorted(cache | set(trace.inserts[r]))
        for size in range(min(capacity, len(pool)) + 1):
            for keep in itertools.combinations(pool, size):
                go(r + 1, frozenset(keep), total + k)

    go(0, frozenset(), 0)
    return best * trace.page_size


def belady_by_ranking(trace: BlockTrace, capacity: int) -> list[int]:
    """The optimum's rule written plainly: after each request rank every cached block by
    (next lookup, depth, key) and keep the ``capacity`` smallest, dropping never-again ones."""
    never = float("inf")
    uses: dict[int, list[int]] = {}
    for r, look in enumerate(trace.lookups):
        for key in look:
            uses.setdefault(key, []).append(r)
    cache: dict[int, int] = {}
    out = []
    for r, (look, ins) in enumerate(zip(trace.lookups, trace.inserts, strict=True)):
        k = 0
        while k < len(look) and look[k] in cache:
            k += 1
        out.append(k * trace.page_size)
        cache.update((key, depth) for depth, key in enumerate(ins))
        ranked = sorted((min((u for u in uses.get(key, ()) if u > r), default=never), depth, key)
                        for key, depth in cache.items())
        cache = {key: depth for nxt, depth, key in ranked[:capacity] if nxt != never}
    return out


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("capacity", [1, 2, 3])
def test_belady_equals_brute_force_optimum_on_tiny_cases(seed: int, capacity: int) -> None:
    trace = random_trace(seed)
    assert sum(belady_hits(trace, capacity)) == brute_force_best(trace, capacity)
    assert belady_by_ranking(trace, capacity) == belady_hits(trace, capacity)


@pytest.mark.parametrize("seed", range(12))
def test_heap_belady_equals_ranking_every_block_after_every_request(seed: int) -> None:
    trace = random_trace(seed, n_requests=60, page=1)
    for capacity in (0, 1, 2, 3, 5, 8, 13, 40):
        assert belady_hits(trace, capacity) == belady_by_ranking(trace, capacity)


@pytest.mark.parametrize("seed", range(10))
def test_one_pass_lru_curve_equals_point_replays(seed: int) -> None:
    trace = random_trace(seed, n_requests=30, page=1)
    caps = [0, 1, 2, 3, 5, 8, 13, 40]
    assert lru_hit_curve(trace, caps) == [sum(lru_hits(trace, c)) for c in caps]


def test_bounds_are_ordered_lru_le_belady_le_infinite() -> None:
    trace = random_trace(3, n_requests=40, page=1)
    inf = sum(infinite_cache_hits(trace))
    for cap in (2, 5, 10):
        assert sum(lru_hits(trace, cap)) <= sum(belady_hits(trace, cap)) <= inf
    assert sum(belady_hits(trace, 10_000)) == inf == sum(lru_hits(trace, 10_000))


def test_infinite_cache_hit_by_hand_caps_at_n_minus_1_and_whole_pages() -> None:
    trace = block_trace([[1, 2, 3, 4, 5], [1, 2, 3, 4, 5], [1, 2, 3, 4]], page_size=2)
    # second: 4 of its first n-1 = 4 tokens; third: n-1 = 3 tokens -> one whole page
    assert infinite_cache_hits(trace) == [0, 4, 2]
