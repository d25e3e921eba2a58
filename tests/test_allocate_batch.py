"""``allocate_batch`` (the engine's batched decode step, issue 28) against ``allocate`` one
request after another, on a copy of the same cache: the same requests get room, the same ones
evict, and every page, reservation, stat, index version and the free list's order are equal.
Pools are tight so that batches open pages, evict and stop short; every backend and both pool
modes run it."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prefixcache import CacheConfig, Request, make_cache
from tests.test_stateful import full_state, one_by_one

CASES = [("none", 4, {}), ("hashchain", 4, {}), ("hashchain", 16, {}), ("radix", 1, {}),
         ("radix", 4, {}), ("radix", 16, {}), ("radix", 4, {"need_sort": True}),
         ("radix", 1, {"need_sort": True})]
SEEN: dict[str, set[str]] = {}  # what the batches did, per case (the comparison is not vacuous)


def _label(backend: str, page: int, options: dict) -> str:
    return f"{backend}-p{page}" + "".join(f"-{k}" for k in options)


@pytest.mark.parametrize(("backend", "page", "options"), CASES, ids=[_label(*c) for c in CASES])
def test_a_batch_leaves_what_one_allocate_after_another_leaves(
    backend: str, page: int, options: dict
) -> None:
    label = _label(backend, page, options)
    SEEN[label] = set()

    @settings(max_examples=60, deadline=None, database=None, derandomize=True)  # coverage asserted below
    @given(
        prompts=st.lists(st.integers(1, 3 * page), min_size=2, max_size=8),
        kept=st.lists(st.booleans(), min_size=8, max_size=8),
        capacity_pages=st.integers(4, 16),
        rounds=st.lists(st.lists(st.integers(0, 7), min_size=1, max_size=8, unique=True),
                        min_size=1, max_size=40),
        shared=st.integers(0, 2 * page),
    )
    def run(prompts: list[int], kept: list[bool], capacity_pages: int, rounds: list[list[int]],
            shared: int) -> None:
        cache = make_cache(backend, CacheConfig(capacity_pages * page, page), **options)
        base = list(range(100, 100 + shared))
        reqs = []
        for i, n in enumerate(prompts):  # admitted and prefilled while they fit
            req = Request(f"r{i}", base + [i * 1000 + t for t in range(n)])
            if -(-req.num_tokens // page) >= capacity_pages - 1:
                continue  # could never fit
            if not cache.allocate(req, req.num_tokens - cache.lookup(req).tokens):
                continue
            req.num_computed_tokens = req.num_tokens
            cache.commit(req)
            if kept[i]:
                reqs.append(req)
            else:  # finished: its KV stays as cache that a batch may evict
                cache.release(req)
        for round_ in rounds:
            limit = (capacity_pages - 1) * page  # a step past the pool is a ValueError (contract tests)
            batch = [reqs[i] for i in round_ if i < len(reqs) and reqs[i].num_tokens < limit]
            if not batch:
                continue
            for req in batch:
                req.append_output_token_ids(7)
            twin, done, evicted = one_by_one(cache, batch)
            tables = [len(cache.page_table(r)) for r in batch]
            result = cache.allocate_batch(batch, 1)
            assert (result.done, list(result.evicted)) == (done, evicted)
            assert full_state(cache) == full_state(twin)
            opened = [len(cache.page_table(r)) - n for r, n in zip(batch[:done], tables, strict=False)]
            SEEN[label] |= {"several" if done > 1 else "one", "opened" if any(opened) else "in page",
                            "stopped" if done < len(batch) else "all", "evicted" if evicted else "no evict"}
            for req in batch[:done]:
                req.num_computed_tokens += 1
            cache.commit_batch(batch[:done])
            for req in batch[done:]:  # no room: released, as the engine preempts
                cache.release(req)
                reqs.remove(req)
            cache.check_invariants()

    run()
    expected = {"several", "opened", "stopped", "all"} | ({"evicted"} if backend != "none" else set())
    assert expected <= SEEN[label], f"{label}: the batches never {sorted(expected - SEEN[label])}"


def test_a_batch_checks_every_request_before_it_changes_anything() -> None:
    cache = make_cache("radix", CacheConfig(64, 4))
    a, b = Request("a", [1, 2, 3]), Request("b", [4, 5, 6])
    assert cache.allocate(a, 3)
    a.num_computed_tokens = 3
    a.append_output_token_ids(9)
    before = full_state(cache)
    with pytest.raises(ValueError, match="not live"):
        cache.allocate_batch([a, b], 1)
    assert full_state(cache) == before
    with pytest.raises(ValueError, match="num_new_tokens"):
        cache.allocate_batch([a], 0)
    assert cache.allocate_batch([], 1).done == 0


@pytest.mark.parametrize(("backend", "page", "options"), CASES, ids=[_label(*c) for c in CASES])
def test_a_batched_step_past_the_whole_pool_is_refused_and_changes_nothing(
    backend: str, page: int, options: dict
) -> None:
    """A request that fills every usable page and then decodes asks for one token more than
    the cache can ever hold: ``allocate_batch`` raises, as ``allocate`` does, before anything
    changes (its check skips the call for totals within the pool's bound, never past it)."""
    cache = make_cache(backend, CacheConfig(6 * page, page), **options)
    req = Request("big", list(range(1, cache.num_usable_pages() * page + 1)))
    assert cache.allocate(req, req.num_tokens)
    req.num_computed_tokens = req.num_tokens
    cache.commit(req)
    req.append_output_token_ids(7)
    before = full_state(cache)
    with pytest.raises(ValueError, match="but the whole cache holds"):
        cache.allocate_batch([req], 1)
    assert full_state(cache) == before
