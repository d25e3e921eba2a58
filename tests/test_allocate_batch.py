"""``allocate_batch`` (the engine's batched decode step, issue 28) against ``allocate`` one
request after another, on a copy of the same cache: the same requests get room, the same ones
evict, and every page, reservation, stat, index version and the free list's order are equal.
Pools are tight so that batches open pages, evict and stop short; every backend and both pool
modes run it."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prefixcache import CacheConfig, PrefixCache, Request, make_cache
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

    @settings(max_examples=100, deadline=None, database=None, derandomize=True)  # coverage asserted below
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
        reqs = _decoders(cache, prompts, kept, shared)
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


def _decoders(cache: PrefixCache, prompts: list[int], kept: list[bool], shared: int) -> list[Request]:
    """Requests with ``prompts`` tokens after ``shared`` common ones, admitted and prefilled
    while they fit; those not ``kept`` finish at once (their KV stays as cache a step may
    evict). Returns the kept ones, each ready to decode."""
    page, capacity_pages = cache.page_size, cache.config.num_pages
    base = list(range(100, 100 + shared))
    reqs = []
    for i, n in enumerate(prompts):
        req = Request(f"r{i}", base + [i * 1000 + t for t in range(n)])
        if -(-req.num_tokens // page) >= capacity_pages - 1:
            continue  # could never fit
        if not cache.allocate(req, req.num_tokens - cache.lookup(req).tokens):
            continue
        req.num_computed_tokens = req.num_tokens
        cache.commit(req)
        if kept[i]:
            reqs.append(req)
        else:
            cache.release(req)
    return reqs


PAGE_RUN_CASES = [(b, p, o) for b in ("none", "radix") for p in (1, 4) for o in ({}, {"need_sort": True})]


@pytest.mark.parametrize(("backend", "page", "options"), PAGE_RUN_CASES,
                         ids=[_label(*c) for c in PAGE_RUN_CASES])
def test_a_page_run_taken_at_once_leaves_what_one_allocate_after_another_leaves(
    backend: str, page: int, options: dict
) -> None:
    """The engine's deferred decoders whose step opens a page (at page size 1 every step):
    ``take_decode_pages`` takes their pages in one call and each take-up (``advance_in_place``
    by one) reserves its step. Together they leave exactly what ``allocate`` one request after
    another leaves on a copy; a refusal changes nothing and comes only where one by one evicts,
    stops or merges staged pages (the engine then steps them so, as ``allocate_batch`` here)."""
    label = _label(backend, page, options)
    SEEN[label] = set()

    @settings(max_examples=60, deadline=None, database=None, derandomize=True)  # coverage asserted below
    @given(
        pages=st.lists(st.integers(1, 3), min_size=2, max_size=8),
        kept=st.lists(st.booleans(), min_size=8, max_size=8),
        capacity_pages=st.integers(4, 16),
        rounds=st.lists(st.lists(st.integers(0, 7), min_size=1, max_size=8, unique=True),
                        min_size=1, max_size=40),
        shared=st.integers(0, 2),
    )
    def run(pages: list[int], kept: list[bool], capacity_pages: int, rounds: list[list[int]],
            shared: int) -> None:
        cache = make_cache(backend, CacheConfig(capacity_pages * page, page), **options)
        assert cache.decode_takes_pages()
        # whole pages of prompt: each request's first decode step opens a page
        prompts = [max(n * page - shared * page // 2, 1) for n in pages]
        reqs = _decoders(cache, prompts, kept, shared * page // 2)
        for round_ in rounds:
            limit = (capacity_pages - 1) * page
            # whose next token opens a page (the engine's openers; the others step in place)
            batch = [reqs[i] for i in round_ if i < len(reqs) and reqs[i].num_tokens < limit
                     and len(cache.page_table(reqs[i])) * page == reqs[i].num_computed_tokens]
            if not batch:
                continue
            for req in batch:
                req.append_output_token_ids(7)
            twin, done, evicted = one_by_one(cache, batch)
            staged = cache.pool.num_free - cache.pool.num_ready  # type: ignore[attr-defined]
            before = full_state(cache)
            if cache.take_decode_pages(batch):
                SEEN[label].add("taken several" if len(batch) > 1 else "taken")
                assert (done, evicted) == (len(batch), [])
                for req in batch:
                    cache.advance_in_place(req, 1)
            else:
                SEEN[label].add("refused")
                assert full_state(cache) == before
                assert evicted or done < len(batch) or staged
                assert cache.allocate_batch(batch, 1).done == done
            assert full_state(cache) == full_state(twin)
            for req in batch[:done]:
                req.num_computed_tokens += 1
            cache.commit_batch(batch[:done])
            for req in batch[done:]:
                cache.release(req)
                reqs.remove(req)
            cache.check_invariants()

    run()
    assert {"taken several", "refused"} <= SEEN[label], f"{label}: the runs only {sorted(SEEN[label])}"


@pytest.mark.parametrize("backend", ["none", "radix"])
def test_a_page_run_past_the_ready_pages_is_refused_though_staged_pages_would_cover_it(backend: str) -> None:
    """need_sort: freed pages are staged, and one allocation after another merges them in only
    when the ready ones run out, mid-run: one allocation of the whole run would merge first and
    hand out other pages. So the run is refused, changing nothing, and stepped one by one."""
    cache = make_cache(backend, CacheConfig(9, 1), need_sort=True)
    gone = Request("gone", [1, 2, 3])
    assert cache.allocate(gone, 3)
    cache.release(gone)  # preempted before it computed: its 3 pages staged (none cached)
    run = [Request(f"d{i}", [10 * i + 1]) for i in range(3)]
    for req in run:
        assert cache.allocate(req, 1)
        req.num_computed_tokens = 1
        cache.commit(req)
        req.append_output_token_ids(7)
    pool = cache.pool  # type: ignore[attr-defined]
    assert (pool.num_ready, pool.num_free) == (2, 5)  # 8 usable: 3 held, 3 staged, 2 ready
    twin, done, evicted = one_by_one(cache, run)
    before = full_state(cache)
    assert not cache.take_decode_pages(run)
    assert full_state(cache) == before
    assert cache.allocate_batch(run, 1).done == done == 3 and not evicted
    assert full_state(cache) == full_state(twin)


def test_a_page_run_is_refused_where_a_step_does_more_than_take_a_page() -> None:
    """ValueError, changing nothing: a cache whose decode step does more (hashchain publishes
    the block the step before filled), a request not live, one still prefilling."""
    vllm_like = make_cache("hashchain", CacheConfig(64, 4))
    a = Request("a", [1, 2, 3, 4])
    assert vllm_like.allocate(a, 4) and not vllm_like.decode_takes_pages()
    a.num_computed_tokens = 4
    with pytest.raises(ValueError, match="does more than take a page"):
        vllm_like.take_decode_pages([a])
    cache = make_cache("radix", CacheConfig(64, 1))
    b, c = Request("b", [1, 2, 3, 4]), Request("c", [5, 6])
    assert cache.allocate(b, 2)  # a first chunk of its prompt
    b.num_computed_tokens = 2
    cache.commit(b)
    before = full_state(cache)
    with pytest.raises(ValueError, match="not decoding"):
        cache.take_decode_pages([b])
    with pytest.raises(ValueError, match="not live"):
        cache.take_decode_pages([c])
    assert full_state(cache) == before


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
