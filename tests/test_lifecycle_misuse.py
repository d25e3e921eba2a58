"""Every misuse of the request lifecycle is a clear ValueError that changes nothing.

One row per misuse: what it sets up (a live request, a released one, a waiting one with a
current match, a second cache), the call, and the words its error must say. After the error
the cache is exactly as before (usage, every live request's pages, reservation and computed
tokens, the stats, the index version, the free list's order) and its invariants hold. Rows
marked "was:" raised something else before issue 29 (an AttributeError, an assertion deep in
a backend) or were accepted silently.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, NamedTuple

import pytest

from prefixcache import CacheConfig, PrefixCache, Request, make_cache
from tests.helpers import run_to_completion, tokens

PAGES = 16


class Ctx(NamedTuple):
    cache: PrefixCache
    other: PrefixCache  # a second cache of the same kind
    live: Request  # live, its prompt computed and committed (decoding next)
    done: Request  # ran to completion and was released
    waiting: Request  # never admitted; shares ``done``'s cached (unpinned) prompt
    match: Any  # the current match of ``waiting``
    page: int


def setup(backend: str, page: int) -> Ctx:
    config = CacheConfig(PAGES * page, page)
    cache, other = make_cache(backend, config), make_cache(backend, config)
    prompt = tokens(3 * page, seed=1)
    done = Request("done", prompt)
    run_to_completion(cache, done)
    live = Request("live", tokens(4 * page, seed=2))  # pins nothing of ``done``'s prompt
    m = cache.lookup(live)
    assert cache.allocate(live, live.num_tokens - m.tokens, m)
    live.num_computed_tokens = live.num_tokens
    cache.commit(live)
    waiting = Request("w", prompt + tokens(2, seed=3))
    return Ctx(cache, other, live, done, waiting, cache.lookup(waiting), page)


def state(c: Ctx) -> tuple:
    cache = c.cache
    pool = getattr(cache, "block_pool", None)
    if pool is not None:
        free = [b.block_id for b in pool.free_block_queue.get_all_free_blocks()]
    else:
        free = cache.pool.free_list().tolist()  # type: ignore[attr-defined]
    live = {r.request_id: (tuple(cache.page_table(r)), cache.reserved_tokens(r), r.num_computed_tokens)
            for r in cache.live_requests}
    reqs = [(r.num_tokens, r.num_computed_tokens) for r in (c.live, c.done, c.waiting)]
    return cache.usage(), live, dataclasses.astuple(cache.stats), cache._index_version(), free, reqs


Call = Callable[[], object]
Undo = Callable[[], None] | None


def next_token(c: Ctx) -> Request:
    """``live`` with one more token to decode (nothing reserved for it yet)."""
    c.live.append_output_token_ids(7)
    return c.live


def step_token(c: Ctx) -> Request:
    """``live`` with one more token and room for it, not yet computed."""
    c.live.append_output_token_ids(7)
    assert c.cache.allocate(c.live, 1)
    return c.live


def computed_past_room(c: Ctx) -> tuple[Request, Undo]:
    """``live`` with one more token computed than it has room for (the caller's bug)."""
    r = c.live
    r.append_output_token_ids(7)
    r.num_computed_tokens += 1

    def undo() -> None:
        r.num_computed_tokens -= 1

    return r, undo


def stale_length(c: Ctx) -> Call:
    c.waiting.append_output_token_ids(5)  # grew since its lookup (a resumed request would)
    return lambda: c.cache.allocate(c.waiting, 1, c.match)


def stale_and_past_known(c: Ctx) -> Call:
    assert c.cache.evict(1 << 30) > 0  # the match goes stale: revalidated to nothing
    return lambda: c.cache.allocate(c.waiting, c.waiting.num_tokens + 1, c.match)


def commit_beyond(c: Ctx) -> tuple[Call, Undo]:
    r, undo = computed_past_room(c)
    return (lambda: c.cache.commit(r)), undo


def commit_backwards(c: Ctx) -> tuple[Call, Undo]:
    r = c.live
    r.num_computed_tokens -= 1

    def undo() -> None:
        r.num_computed_tokens += 1

    return (lambda: c.cache.commit(r)), undo


def allocate_past_room(c: Ctx) -> tuple[Call, Undo]:
    r, undo = computed_past_room(c)
    return (lambda: c.cache.allocate(r, 1)), undo


def batch_past_room(c: Ctx) -> tuple[Call, Undo]:
    r, undo = computed_past_room(c)
    return (lambda: c.cache.allocate_batch([r], 1)), undo


def commit_batch_with_a_stranger(c: Ctx) -> Call:
    r = step_token(c)
    r.num_computed_tokens += 1  # computed, so committing it would publish its KV
    return lambda: c.cache.commit_batch([r, c.waiting])


def impostor(c: Ctx) -> Request:
    return Request("live", list(c.live.all_token_ids))  # same id, another object


class Row(NamedTuple):
    name: str  # the misuse
    make: Callable[[Ctx], Any]  # sets it up; returns the call (or the call and an undo)
    message: str  # what the ValueError must say


def no_request(method: str, call: Callable[[Ctx], object], was: str = " (was: AttributeError)") -> Row:
    return Row(f"{method} of something that is no Request{was}",
               lambda c: lambda: call(c), r"expected a Request, got str")


BIG = 10**5
NOT_LIVE = "which is not live"
PAST = r"up to token \d+ reaches past its \d+ known tokens"
TAKEN = r"another live request already has id 'live'"
PAST_ROOM = r"allocate for 'live' at num_computed_tokens=\d+, beyond the \d+ tokens allocated to it"
ROWS: list[Row] = [
    Row("allocate num_new_tokens=0",
        lambda c: lambda: c.cache.allocate(c.waiting, 0, c.match), r"num_new_tokens must be >= 1, got 0"),
    Row("allocate num_new_tokens<0",
        lambda c: lambda: c.cache.allocate(c.waiting, -3, c.match), r"num_new_tokens must be >= 1, got -3"),
    Row("allocate num_new_tokens=True",
        lambda c: lambda: c.cache.allocate(c.waiting, True, c.match), r"must be an int, got bool True"),
    Row("allocate num_new_tokens=1.0",
        lambda c: lambda: c.cache.allocate(c.waiting, 1.0, c.match), r"must be an int, got float 1.0"),
    Row("allocate num_new_tokens='1'",
        lambda c: lambda: c.cache.allocate(c.waiting, "1", c.match), r"must be an int, got str '1'"),
    Row("allocate a live request 0 tokens",
        lambda c: lambda: c.cache.allocate(c.live, 0), r"num_new_tokens must be >= 1, got 0"),
    Row("allocate past the known tokens (first call)",
        lambda c: lambda: c.cache.allocate(c.waiting, c.waiting.num_tokens - c.match.tokens + 1, c.match),
        rf"'w' {PAST}"),
    Row("allocate past the known tokens (live)",
        lambda c: lambda: c.cache.allocate(c.live, 1), rf"'live' {PAST}"),
    Row("allocate past the known tokens with a stale match (was: counted as a revalidation)",
        stale_and_past_known, rf"'w' {PAST}"),
    Row("allocate with a match from another cache",
        lambda c: lambda: c.cache.allocate(c.waiting, 1, c.other.lookup(c.waiting)),
        r"match of 'w' was taken from another cache"),
    Row("allocate with another request's match",
        lambda c: lambda: c.cache.allocate(Request("x", tokens(8, seed=4)), 1, c.match),
        r"match of 'w' was handed to allocate for 'x'"),
    Row("allocate with a match of a stale length",
        stale_length, r"match of 'w' was taken at \d+ tokens; it has \d+ now: look it up again"),
    Row("allocate with a match that is no Match",
        lambda c: lambda: c.cache.allocate(c.waiting, 1, "m"), r"match must be a Match from lookup, got str"),
    Row("allocate a live request with a match",
        lambda c: (lambda m: lambda: c.cache.allocate(c.live, 1, m))(c.cache.lookup(c.live)),
        r"a match is for the first allocate only; 'live' is live"),
    Row("allocate a request too big for the pool",
        lambda c: lambda: c.cache.allocate(Request("big", tokens(BIG)), BIG),
        r"request 'big' needs 100000 tokens .*but the whole cache holds"),
    Row("allocate a live request after computing past its room (was: accepted / InvariantError)",
        allocate_past_room, PAST_ROOM),
    Row("revalidate a match from another cache",
        lambda c: lambda: c.cache.revalidate(c.other.lookup(c.waiting)),
        r"match of 'w' was taken from another cache"),
    Row("revalidate something that is no Match",
        lambda c: lambda: c.cache.revalidate(5), r"match must be a Match from lookup, got int"),
    Row("commit a request never admitted",
        lambda c: lambda: c.cache.commit(c.waiting), f"commit of 'w', {NOT_LIVE}"),
    Row("commit a released request",
        lambda c: lambda: c.cache.commit(c.done), f"commit of 'done', {NOT_LIVE}"),
    Row("commit beyond the reservation",
        commit_beyond, r"commit of 'live' at num_computed_tokens=\d+ beyond the \d+ tokens allocated"),
    Row("commit with computed tokens gone back (was: accepted / radix AssertionError)",
        commit_backwards, r"commit of 'live' at num_computed_tokens=\d+, below the \d+ it had computed"),
    Row("commit_batch with a request not live", commit_batch_with_a_stranger, f"commit of 'w', {NOT_LIVE}"),
    Row("release twice", lambda c: lambda: c.cache.release(c.done), f"release of 'done', {NOT_LIVE}"),
    Row("release a request never admitted",
        lambda c: lambda: c.cache.release(c.waiting), f"release of 'w', {NOT_LIVE}"),
    Row("page_table of a request not live",
        lambda c: lambda: c.cache.page_table(c.done), f"page_table of 'done', {NOT_LIVE}"),
    Row("page_tables of a request not live",
        lambda c: lambda: c.cache.page_tables(c.waiting), f"page_tables? of 'w', {NOT_LIVE}"),
    Row("allocate_batch with a request not live",
        lambda c: (lambda r: lambda: c.cache.allocate_batch([r, c.waiting], 1))(next_token(c)),
        f"allocate_batch of 'w', {NOT_LIVE}"),
    Row("allocate_batch with a released request",
        lambda c: lambda: c.cache.allocate_batch([c.done], 1), f"allocate_batch of 'done', {NOT_LIVE}"),
    Row("allocate_batch num_new_tokens=0",
        lambda c: lambda: c.cache.allocate_batch([c.live], 0), r"num_new_tokens must be >= 1, got 0"),
    Row("allocate_batch past the known tokens",
        lambda c: lambda: c.cache.allocate_batch([c.live], 1), rf"'live' {PAST}"),
    Row("allocate_batch after computing past the room (was: accepted / InvariantError)",
        batch_past_room, PAST_ROOM),
    Row("a live id reused: allocate", lambda c: lambda: c.cache.allocate(impostor(c), 1), TAKEN),
    Row("a live id reused: lookup", lambda c: lambda: c.cache.lookup(impostor(c)), TAKEN),
    Row("a live id reused: commit", lambda c: lambda: c.cache.commit(impostor(c)), TAKEN),
    Row("a live id reused: release", lambda c: lambda: c.cache.release(impostor(c)), TAKEN),
    Row("a live id reused: page_table", lambda c: lambda: c.cache.page_table(impostor(c)), TAKEN),
    Row("a live id reused: allocate_batch",
        lambda c: lambda: c.cache.allocate_batch([impostor(c)], 1), TAKEN),
    Row("advance_in_place of a request not live",
        lambda c: lambda: c.cache.advance_in_place(c.waiting, 1), f"advance_in_place of 'w', {NOT_LIVE}"),
    Row("advance_in_place by 0 steps",
        lambda c: lambda: c.cache.advance_in_place(c.live, 0), r"num_steps must be >= 1, got 0"),
    Row("advance_in_place past the known tokens",
        lambda c: lambda: c.cache.advance_in_place(c.live, 1),
        r"advance_in_place of 'live' by 1 steps; only 0 change nothing"),
    Row("evict a negative count", lambda c: lambda: c.cache.evict(-1), r"num_tokens must be >= 0, got -1"),
    Row("evict a float", lambda c: lambda: c.cache.evict(1.5), r"num_tokens must be an int, got float 1.5"),
    no_request("lookup", lambda c: c.cache.lookup("live"), was=""),
    no_request("allocate", lambda c: c.cache.allocate("live", 1)),
    no_request("allocate_batch", lambda c: c.cache.allocate_batch(["live"], 1)),
    no_request("commit", lambda c: c.cache.commit("live")),
    no_request("commit_batch", lambda c: c.cache.commit_batch([c.live, "live"])),
    no_request("release", lambda c: c.cache.release("live")),
    no_request("page_table", lambda c: c.cache.page_table("live")),
    no_request("is_live", lambda c: c.cache.is_live("live")),
    no_request("reserved_tokens", lambda c: c.cache.reserved_tokens("live")),
    no_request("decode_steps_in_place", lambda c: c.cache.decode_steps_in_place("live")),
]
CASES = [("hashchain", 4), ("radix", 1), ("radix", 4)]


@pytest.mark.parametrize(("backend", "page"), CASES, ids=[f"{b}-p{p}" for b, p in CASES])
@pytest.mark.parametrize("row", ROWS, ids=[row.name for row in ROWS])
def test_a_lifecycle_misuse_is_a_clear_value_error_and_changes_nothing(
    backend: str, page: int, row: Row
) -> None:
    c = setup(backend, page)
    made = row.make(c)
    call, undo = made if isinstance(made, tuple) else (made, None)
    before = state(c)
    with pytest.raises(ValueError, match=row.message):
        call()
    assert state(c) == before, f"{row.name}: the refused call changed the cache"
    if undo is not None:
        undo()  # the setup's own edit of the request (the misuse), not the cache's doing
    c.cache.check_invariants()


def test_every_row_names_a_distinct_misuse() -> None:
    names = [row.name for row in ROWS]
    assert len(names) == len(set(names))
