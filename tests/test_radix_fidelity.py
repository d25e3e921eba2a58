"""The radix backend drives its pool and tree as SGLang 0.5.23 does, decision for decision.

Eviction demands come from ``mem_cache/allocation.py``; the release and commit sequence from
``RadixCache.checkpoint`` and ``common.release_kv_cache``; the allocator modes from
``mem_cache/allocator/`` (see tests/test_radix_pool.py). tests/test_upstream_fixtures.py checks
the sum of it against SGLang's own code; these name each piece.
"""

from __future__ import annotations

import itertools

import pytest
from prefixcache.backends.radix import request_key

from prefixcache import CacheConfig, Request, make_cache
from tests.helpers import tokens


def radix(capacity: int, page: int, **options: object):  # type: ignore[no-untyped-def]
    return make_cache("radix", CacheConfig(capacity, page), **options)


def serve(cache, req: Request) -> None:  # type: ignore[no-untyped-def]
    assert cache.allocate(req, req.num_tokens - cache.lookup(req).tokens)
    req.num_computed_tokens = cache.reserved_tokens(req)
    cache.commit(req)


def test_radix_defaults_to_sglangs_default_allocator_mode() -> None:
    assert radix(64, 4).pool.need_sort is False
    assert radix(64, 4, need_sort=True).pool.need_sort is True
    cache = radix(64, 4, need_sort=True)
    cache.reset()
    assert cache.pool.need_sort is True, "reset keeps the mode"


def test_paged_extend_evicts_for_its_tokens_plus_a_page() -> None:
    # alloc_paged_token_slots_extend evicts for extend_num_tokens + bs * page_size
    cache = radix(13 * 4, 4)  # 12 usable pages
    a = Request("a", tokens(8, seed=1))
    serve(cache, a)
    cache.release(a)  # a 2-page leaf, 10 pages free
    b = Request("b", tokens(40, seed=2))
    assert cache.allocate(b, 40)  # 10 pages would fit; SGLang evicts for 44 tokens anyway
    assert cache.stats.evicted_tokens == 8
    assert tuple(cache.usage()) == (2, 0, 10)


def test_paged_decode_evicts_for_a_page_and_page_1_for_the_exact_tokens() -> None:
    cache = radix(13 * 4, 4)
    a = Request("a", tokens(8, seed=1))
    serve(cache, a)
    cache.release(a)
    b = Request("b", tokens(37, seed=2))
    assert cache.allocate(b, 37)  # 10 pages; demand 41 > 40 free tokens: a's leaf goes
    assert cache.stats.evicted_tokens == 8
    # page size 1: alloc_token_slots evicts exactly the shortfall
    cache1 = radix(13, 1)
    a1 = Request("a", tokens(2, seed=1))
    serve(cache1, a1)
    cache1.release(a1)
    b1 = Request("b", tokens(10, seed=2))
    assert cache1.allocate(b1, 10) and cache1.stats.evicted_tokens == 0


def test_allocation_that_cannot_fit_evicts_nothing() -> None:
    cache = radix(7 * 4, 4)  # 6 usable pages
    a = Request("a", tokens(8, seed=1))
    serve(cache, a)
    cache.release(a)
    x = Request("x", tokens(8, seed=4))
    assert cache.allocate(x, 8)  # live: 2 pages pinned, 2 evictable, 2 free
    b = Request("b", tokens(20, seed=2))
    assert not cache.allocate(b, 20)  # 5 pages > 2 free + 2 evictable: SGLang would evict, then fail
    assert cache.stats.evicted_tokens == 0 and tuple(cache.usage()) == (2, 2, 2)


def test_commit_stamps_the_path_even_when_nothing_new_is_cached() -> None:
    clock = itertools.count(1)
    cache = radix(64 * 4, 4, clock=lambda: float(next(clock)))
    a, b = Request("a", tokens(8, seed=1)), Request("b", tokens(8, seed=2))
    for r in (a, b):
        serve(cache, r)
        cache.release(r)
    leaf_a, leaf_b = (cache.tree.match_prefix(request_key(r)).last_node for r in (a, b))
    c = Request("c", a.all_token_ids + [7, 7])  # hits all of a; its 2 new tokens make no page
    d = Request("d", b.all_token_ids + [7, 7])
    assert cache.allocate(c, 2) and cache.allocate(d, 2)  # d's match stamps b after c's stamps a
    c.num_computed_tokens = 10
    cache.commit(c)  # checkpoint inserts (and re-matches) a's 8 tokens: a is newer than b again
    assert leaf_a.last_access_time > leaf_b.last_access_time


@pytest.mark.parametrize("page", [1, 4])
def test_release_reinserts_the_prompt_with_priority_plus_one(page: int) -> None:
    # checkpoint(split_prompt=True): the prompt's whole pages are re-inserted with priority + 1,
    # splitting the leaf at the prompt boundary, so eviction drops the output first.
    cache = radix(64 * page, page, eviction_policy="priority")
    r = Request("r", tokens(2 * page, seed=3))
    assert cache.allocate(r, r.num_tokens)
    r.num_computed_tokens = r.num_tokens  # never committed: the release inserts it all
    r.append_output_token_ids([5] * (2 * page))
    assert cache.allocate(r, 2 * page - 1)
    r.num_computed_tokens = r.num_tokens - 1
    cache.release(r)
    prompt = cache.tree.root_node.children[next(iter(cache.tree.root_node.children))]
    assert len(prompt.key) == 2 * page and prompt.priority == 1
    (output,) = prompt.children.values()
    assert len(output.key) == (2 * page - 1) // page * page and output.priority == 0
    assert cache.evict(1) == len(output.key), "the output leaf goes first, the prompt stays"
