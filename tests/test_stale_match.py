"""A stale match never leaves a request under-reserved (issue 29, item 4).

README's sequence is ``m = lookup(req)``, ``allocate(req, req.num_tokens - m.tokens, m)``, then
the caller writes the prompt's KV and commits. When the cache changed in between (other
activity evicted the match's pages, or cached more of the prefix), ``allocate`` revalidates
``m``; ``num_new_tokens`` count from the hit that still holds, as on every call from
``num_computed_tokens`` as allocate leaves it, so the room is exactly what the caller then
computes (hashchain publishes the blocks a reservation fills at allocation: room left
uncomputed would be served unwritten). A match that grew leaves less to compute and never
reaches past the request's tokens (it used to raise); a caller that computes past its room
anyway is refused at commit, with the reason, and nothing changes; or ``allocate`` returns
False and nothing has changed. The interleaving at random is a rule of the shadow-KV machine
(tests/test_stateful.py: ``admit_after_eviction``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import pytest

from prefixcache import CacheConfig, PrefixCache, Request, make_cache
from prefixcache.tiers import HostTierConfig
from tests.helpers import run_to_completion, tokens

PROMPT_PAGES = 4
CAPACITY_PAGES = 8  # page 0 reserved: 7 usable, the cached prompt takes 4 of them


def _cache(backend: str, page: int, **options: Any) -> Callable[[], PrefixCache]:
    return lambda: make_cache(backend, CacheConfig(CAPACITY_PAGES * page, page), **options)


# Every backend the base's allocate serves: the two designs at page sizes 1 and 16, and the
# radix tree's components and the host tiers (they only see the eviction below).
SWA = [("sliding_window", 4), ("full",)]
CASES: dict[str, tuple[Callable[[], PrefixCache], int]] = {
    "hashchain-p1": (_cache("hashchain", 1), 1),
    "hashchain-p16": (_cache("hashchain", 16), 16),
    "radix-p1": (_cache("radix", 1), 1),
    "radix-p16": (_cache("radix", 16), 16),
    "radix-swa-p1": (lambda: make_cache("radix", CacheConfig(64, 1, layout=SWA)), 1),
    "radix-mamba-p1": (lambda: make_cache("radix", CacheConfig(64, 1, layout=[("mamba", 2), ("full",)])), 1),
    "radix-hicache-p1": (lambda: make_cache("radix", CacheConfig(8, 1), host_tier=HostTierConfig()), 1),
    "hashchain-swa-p4": (lambda: make_cache("hashchain", CacheConfig(64, 4, layout=SWA)), 4),
    "hashchain-offload-p4": (
        lambda: make_cache("hashchain", CacheConfig(32, 4), host_tier=HostTierConfig()), 4
    ),
}
MAIN = ["hashchain-p1", "hashchain-p16", "radix-p1", "radix-p16"]


def state(cache: PrefixCache) -> tuple:
    live = {r.request_id: (tuple(cache.page_table(r)), cache.reserved_tokens(r), r.num_computed_tokens)
            for r in cache.live_requests}
    return (cache.usage(), live, dataclasses.astuple(cache.stats), cache._index_version())


def cached_prompt(case: str) -> tuple[PrefixCache, Request, int]:
    """A cache holding a finished request's prompt, and a request extending it by one token."""
    make, page = CASES[case]
    cache = make()
    prompt = tokens(PROMPT_PAGES * page, seed=3)
    run_to_completion(cache, Request("a", prompt))
    tier = cache.host_tier
    if tier is not None:  # a host tier's stores land (a step later, or once acknowledged)
        tier.advance_transfers()
        while tier.transfers_in_flight():
            tier.advance_transfers()
    return cache, Request("b", [*prompt, 7]), page


def admit_the_rest(cache: PrefixCache, req: Request) -> None:
    """Compute the room allocate made, commit, and allocate, compute and commit the rest."""
    req.num_computed_tokens = cache.reserved_tokens(req)
    cache.commit(req)
    if req.num_computed_tokens < req.num_tokens:
        assert cache.allocate(req, req.num_tokens - req.num_computed_tokens)
        req.num_computed_tokens = req.num_tokens
        cache.commit(req)
    cache.check_invariants()


@pytest.mark.parametrize("case", CASES)
def test_the_readme_sequence_after_an_eviction_reserves_from_the_hit_that_holds(case: str) -> None:
    cache, b, _ = cached_prompt(case)
    m = cache.lookup(b)
    told = m.tokens + m.host_tokens
    assert told > 0
    assert cache.evict(1 << 30) > 0  # other activity: every unpinned cached page goes
    if cache.host_tier is not None:  # (and a step passes: vLLM's offload of what was evicted lands)
        cache.host_tier.advance_transfers()
    n = b.num_tokens - told
    assert cache.allocate(b, n, m)
    hit = b.num_computed_tokens
    assert hit <= told and cache.reserved_tokens(b) == hit + n
    if hit < told:  # computing the prompt's rest now would pass the room: refused, with why
        b.num_computed_tokens = b.num_tokens
        before = state(cache)
        with pytest.raises(ValueError, match="beyond the .* a stale match is admitted from the hit"):
            cache.commit(b)
        assert state(cache) == before
        b.num_computed_tokens = hit
    admit_the_rest(cache, b)
    assert b.num_computed_tokens == b.num_tokens
    assert len(cache.page_table(b)) * cache.page_size >= b.num_tokens


@pytest.mark.parametrize("case", MAIN)
def test_a_match_stale_after_another_admission_evicted_it_reserves_from_the_hit_that_holds(case: str) -> None:
    """The issue's scenario: another request's allocation evicts the matched pages."""
    cache, b, page = cached_prompt(case)
    m = cache.lookup(b)
    assert m.tokens >= (PROMPT_PAGES - 1) * page
    c = Request("c", tokens(5 * page, seed=11))
    assert cache.allocate(c, c.num_tokens)  # five of the seven usable pages: evicts a's
    cache.release(c)  # (c computed nothing: its pages hold no cache)
    fresh = cache.lookup(b).tokens
    assert fresh < m.tokens
    assert cache.allocate(b, b.num_tokens - fresh, m)  # counted from the hit that holds
    assert b.num_computed_tokens == fresh and cache.reserved_tokens(b) == b.num_tokens
    b.num_computed_tokens = b.num_tokens
    cache.commit(b)
    cache.check_invariants()


@pytest.mark.parametrize("case", MAIN)
def test_a_chunk_after_a_stale_match_is_room_for_exactly_that_chunk_so_no_block_is_served_unwritten(
    case: str,
) -> None:
    """The engine's convention (num_computed_tokens advanced by the chunk asked for) computes
    all of the room: a block published at allocation always holds its KV by the next lookup."""
    cache, b, page = cached_prompt(case)
    m = cache.lookup(b)
    cache.evict(1 << 30)
    assert cache.allocate(b, page, m)
    assert b.num_computed_tokens == 0 and cache.reserved_tokens(b) == page
    b.num_computed_tokens += page
    cache.commit(b)
    twin = Request("twin", list(b.all_token_ids))
    assert cache.lookup(twin).tokens <= b.num_computed_tokens, "a block was published before its KV"
    cache.check_invariants()


@pytest.mark.parametrize("case", ["hashchain-p1", "hashchain-p16"])
def test_a_match_that_grew_since_leaves_only_the_rest_of_the_prompt(case: str) -> None:
    """Hashchain's revalidation also finds blocks cached since: asking for the whole prompt
    from the old, empty match reserves just the rest (it used to reach past the request's
    tokens, a ValueError)."""
    make, page = CASES[case]
    cache = make()
    prompt = tokens(PROMPT_PAGES * page, seed=3)
    b = Request("b", [*prompt, 7])
    m = cache.lookup(b)
    assert m.tokens == 0
    run_to_completion(cache, Request("a", prompt))
    assert cache.allocate(b, b.num_tokens, m)
    assert b.num_computed_tokens == PROMPT_PAGES * page
    assert cache.reserved_tokens(b) == b.num_tokens
    b.num_computed_tokens = b.num_tokens  # README: the rest of the prompt
    cache.commit(b)
    cache.check_invariants()


@pytest.mark.parametrize("case", MAIN)
def test_a_stale_match_with_no_room_is_refused_and_changes_nothing(case: str) -> None:
    cache, b, page = cached_prompt(case)
    m = cache.lookup(b)
    pin = Request("pin", tokens(3 * page, seed=12))  # pins 3 pages: 4 left, the prompt needs 5
    assert cache.allocate(pin, pin.num_tokens)
    cache.evict(1 << 30)
    before = state(cache)
    assert not cache.allocate(b, b.num_tokens, m)
    assert not cache.is_live(b) and b.num_computed_tokens == 0
    got = state(cache)
    assert got[:2] == before[:2] and got[3] == before[3]
    cache.check_invariants()
