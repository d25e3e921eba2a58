"""The PrefixCache contract, run on every registered backend (a new backend joins by registering)."""

from __future__ import annotations

import pytest

from prefixcache import CacheConfig, Request, available_backends, make_cache
from tests.helpers import checked, run_to_completion, tokens

BACKENDS = available_backends()
PAGE = 4


def reuses(name: str) -> bool:
    return name != "none"


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def snapshot(cache) -> tuple:
    return (
        cache.usage(),
        {r.request_id: (cache.page_table(r), r.num_computed_tokens) for r in cache.live_requests},
        (cache.stats.requests, cache.stats.queries, cache.stats.hits),
    )


def test_empty_cache_never_hits(backend: str) -> None:
    cache = checked(backend, 256, PAGE)
    assert cache.lookup(Request("a", tokens(20))).tokens == 0


def test_repeat_prompt_hits_whole_pages_below_last_token(backend: str) -> None:
    cache = checked(backend, 256, PAGE)
    prompt = tokens(23)
    assert run_to_completion(cache, Request("a", prompt)) == 0
    expected = (23 - 1) // PAGE * PAGE if reuses(backend) else 0
    assert cache.lookup(Request("b", prompt)).tokens == expected


def test_full_prompt_hit_is_capped_at_n_minus_1(backend: str) -> None:
    cache = checked(backend, 256, PAGE)
    prompt = tokens(4 * PAGE)
    run_to_completion(cache, Request("a", prompt))
    b = Request("b", prompt)
    hit = cache.lookup(b).tokens
    assert hit <= b.num_tokens - 1
    assert hit == (3 * PAGE if reuses(backend) else 0)


def test_first_allocate_sets_computed_tokens_to_hit_and_counts_stats(backend: str) -> None:
    cache = checked(backend, 256, PAGE)
    prompt = tokens(18)
    run_to_completion(cache, Request("a", prompt))
    b = Request("b", prompt + tokens(5, seed=9))
    hit = cache.lookup(b).tokens
    assert cache.allocate(b, b.num_tokens - hit)
    assert b.num_computed_tokens == hit
    assert (cache.stats.requests, cache.stats.queries, cache.stats.hits) == (2, 18 + 23, hit)
    assert len(cache.page_table(b)) == -(-b.num_tokens // PAGE)


def test_lookup_is_pure_pins_nothing_counts_nothing(backend: str) -> None:
    cache = checked(backend, 256, PAGE)
    run_to_completion(cache, Request("a", tokens(30)))
    before = (cache.usage(), cache.stats.requests, cache.stats.queries)
    for _ in range(3):
        cache.lookup(Request("b", tokens(30)))
    assert (cache.usage(), cache.stats.requests, cache.stats.queries) == before


def test_page_zero_is_never_handed_out_and_live_tables_are_disjoint_beyond_shared_hits(backend: str) -> None:
    cache = checked(backend, 40 * PAGE, PAGE)
    shared = tokens(3 * PAGE, seed=1)
    run_to_completion(cache, Request("warm", shared + [7]))
    reqs = [Request(f"r{i}", shared + tokens(2 * PAGE + i, seed=10 + i)) for i in range(4)]
    for r in reqs:
        assert cache.allocate(r, r.num_tokens - cache.lookup(r).tokens)
    tables = [cache.page_table(r) for r in reqs]
    for t in tables:
        assert 0 not in t
    own = [set(t[r.num_computed_tokens // PAGE :]) for t, r in zip(tables, reqs, strict=True)]
    for i in range(len(own)):
        for j in range(i + 1, len(own)):
            assert not own[i] & own[j], "two live requests write into the same page"


def test_allocate_without_room_returns_false_and_changes_nothing(backend: str) -> None:
    cache = checked(backend, 9 * PAGE, PAGE)  # 8 usable pages
    a = Request("a", tokens(6 * PAGE))
    assert cache.allocate(a, a.num_tokens)
    b = Request("b", tokens(3 * PAGE, seed=5))
    before = snapshot(cache)
    assert not cache.allocate(b, b.num_tokens)
    assert snapshot(cache) == before
    assert b.num_computed_tokens == 0 and not cache.is_live(b)
    # Extending a live request past the room also fails cleanly.
    c = Request("c", tokens(PAGE, seed=7))
    assert cache.allocate(c, c.num_tokens)  # 1 page left free
    a.append_output_token_ids(tokens(2 * PAGE, seed=6))
    a.num_computed_tokens = 6 * PAGE
    before = snapshot(cache)
    assert not cache.allocate(a, 2 * PAGE)
    assert snapshot(cache) == before


def test_release_keeps_kv_as_cache_and_evict_drops_it(backend: str) -> None:
    cache = checked(backend, 64 * PAGE, PAGE)
    prompt = tokens(10 * PAGE)
    run_to_completion(cache, Request("a", prompt))
    if reuses(backend):
        assert cache.usage().evictable > 0
        freed = cache.evict(10 * PAGE)
        assert freed >= 9 * PAGE
    else:
        assert cache.evict(10 * PAGE) == 0
    assert cache.usage().evictable == 0
    assert cache.lookup(Request("b", prompt)).tokens == 0


def test_reset_is_refused_while_a_request_is_live(backend: str) -> None:
    cache = checked(backend, 64 * PAGE, PAGE)
    run_to_completion(cache, Request("a", tokens(5 * PAGE)))
    live = Request("b", tokens(3 * PAGE, seed=3))
    assert cache.allocate(live, live.num_tokens)
    before = snapshot(cache)
    assert cache.reset() is False
    assert snapshot(cache) == before
    cache.release(live)
    assert cache.reset() is True
    assert cache.usage().evictable == 0 and cache.usage().in_use == 0
    assert cache.stats.requests == 0
    assert cache.lookup(Request("c", tokens(5 * PAGE))).tokens == 0


def test_preempted_request_is_counted_apart_and_hits_its_own_kv(backend: str) -> None:
    cache = checked(backend, 64 * PAGE, PAGE)
    r = Request("r", tokens(6 * PAGE + 1))
    assert cache.allocate(r, r.num_tokens)
    r.num_computed_tokens = r.num_tokens
    cache.commit(r)
    r.append_output_token_ids(tokens(PAGE, seed=2))
    cache.release(r)  # preempted: the engine resets computed tokens and counts the preemption
    r.num_computed_tokens = 0
    r.num_preemptions += 1
    hit = cache.lookup(r).tokens
    assert cache.allocate(r, r.num_tokens - hit)
    assert cache.stats.requests == 1 and cache.stats.preempted_requests == 1
    assert cache.stats.preempted_hits == hit
    assert hit == (6 * PAGE if reuses(backend) else 0)


def test_decode_extends_one_token_at_a_time(backend: str) -> None:
    cache = checked(backend, 64 * PAGE, PAGE)
    r = Request("r", tokens(PAGE + 2))
    assert cache.allocate(r, r.num_tokens)
    for step in range(2 * PAGE):
        r.num_computed_tokens = r.num_tokens
        cache.commit(r)
        r.append_output_token_ids(step)
        assert cache.allocate(r, 1)
        assert len(cache.page_table(r)) == -(-r.num_tokens // PAGE)
    cache.release(r)


def test_allocate_within_the_reservation_is_a_no_op_that_succeeds(backend: str) -> None:
    cache = checked(backend, 64 * PAGE, PAGE)
    r = Request("r", tokens(5 * PAGE))
    assert cache.allocate(r, r.num_tokens)  # room for every token
    r.num_computed_tokens = 2 * PAGE
    cache.commit(r)
    before = snapshot(cache)
    assert cache.allocate(r, PAGE)  # the next chunk is already inside the reservation
    assert snapshot(cache) == before and cache.reserved_tokens(r) == 5 * PAGE


# ------------------------------------------------------------------ bad input


@pytest.mark.parametrize(
    "prompt, message",
    [([], "empty prompt"), ([1, -2], "negative"), ([1, 2.5], "not an integer"), ([True], "not an integer")],
)
def test_bad_prompt_is_a_clear_error(prompt: list, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Request("x", prompt)


@pytest.mark.parametrize(
    "capacity, page, message",
    [
        (0, 16, "positive"),
        (64, 0, "positive"),
        (-1, 16, "positive"),
        (16, 16, "page 0 is reserved"),
        (8, 16, "at least 2"),
        (64.0, 16, "int"),
    ],
)
def test_bad_config_is_a_clear_error(capacity, page, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        CacheConfig(capacity, page)


def test_unknown_backend_lists_the_valid_ones() -> None:
    with pytest.raises(ValueError, match="valid: .*hashchain"):
        make_cache("lru-magic", CacheConfig(64, 16))


def test_bad_calls_raise_and_change_nothing(backend: str) -> None:
    cache = checked(backend, 16 * PAGE, PAGE)
    run_to_completion(cache, Request("warm", tokens(5 * PAGE)))
    live = Request("live", tokens(2 * PAGE, seed=4))
    assert cache.allocate(live, live.num_tokens)
    stranger = Request("stranger", tokens(3))
    before = snapshot(cache)
    bad_calls = [
        (lambda: cache.allocate(Request("huge", tokens(16 * PAGE, seed=99)), 16 * PAGE), "whole cache"),
        (lambda: cache.allocate(stranger, 0), ">= 1"),
        (lambda: cache.allocate(stranger, 4), "past its"),
        (lambda: cache.allocate(stranger, 1.5), "int"),
        (lambda: cache.release(stranger), "not live"),
        (lambda: cache.commit(stranger), "not live"),
        (lambda: cache.page_table(stranger), "not live"),
        (lambda: cache.allocate(Request("live", tokens(3)), 1), "another live request"),
        (lambda: cache.evict(-1), ">= 0"),
    ]
    for call, message in bad_calls:
        with pytest.raises(ValueError, match=message):
            call()
        assert snapshot(cache) == before
    live.num_computed_tokens = live.num_tokens + 1
    with pytest.raises(ValueError, match="beyond"):
        cache.cache.commit(live)  # unwrapped: the test itself broke the request's state
    live.num_computed_tokens = 0
    assert snapshot(cache) == before
    cache.release(live)
    with pytest.raises(ValueError, match="not live"):
        cache.release(live)
