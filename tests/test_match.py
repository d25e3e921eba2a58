"""The match is a value: ``lookup`` returns it, the first ``allocate`` consumes it.

A match carries its backend's index version. These tests pin down that every change that
could alter a lookup moves the version, that a match taken before such a change is
revalidated (never pinning a page that now holds other KV), and that a match handed to the
wrong request, cache or call is refused. The interleaving itself is a rule of the shadow-KV
state machine (tests/test_stateful.py: ``look_up`` then ``admit_with_match``).
"""

from __future__ import annotations

from typing import Any

import pytest
from prefixcache.backends.hashchain.block import KVCacheBlock
from prefixcache.backends.hashchain.block_pool import BlockHashToBlockMap, BlockPool
from prefixcache.backends.hashchain.hashing import BlockHash, make_block_hash_with_group_id

from prefixcache import CacheConfig, Engine, Match, Request, available_backends, make_cache
from tests.helpers import DIRECT_REQUEST, checked, keyed, run_to_completion, tokens

B = 4
REUSING = [b for b in available_backends() if b != "none"]


def key(i: int) -> bytes:
    return make_block_hash_with_group_id(BlockHash(i.to_bytes(32, "big")), 0)


# ---------------------------------------------------------------- the hashchain index version
def test_every_change_a_lookup_could_see_moves_the_version_and_a_duplicate_does_not() -> None:
    m = BlockHashToBlockMap()
    blocks = [KVCacheBlock(i) for i in range(6)]
    m.insert_many([key(0), key(1)], blocks[:2])
    assert m.version == 2
    m.insert_many([key(1)], blocks[2:3])  # a duplicate: get_one_block still answers blocks[1]
    assert m.version == 2 and m.num_duplicated_keys == 1
    assert m.pop(key(9), 0) is None and m.version == 2  # nothing there: nothing changed
    assert m.pop(key(0), blocks[0].block_id) is blocks[0] and m.version == 3
    blocks[1].block_hash = key(1)  # type: ignore[assignment]
    blocks[2].block_hash = key(1)  # type: ignore[assignment]
    assert m.evict_hashed([blocks[2], blocks[4]]) == 1  # the duplicate's second block
    assert m.version == 4 and blocks[2].block_hash is None and m.num_duplicated_keys == 0
    assert m.get_one_block(key(1)) is blocks[1]
    m.clear()
    assert m.version == 5 and len(m) == 0


def test_evicting_the_first_block_of_a_duplicated_key_promotes_the_second() -> None:
    pool = BlockPool(8)
    first, second = pool.get_new_blocks(2)
    pool.cache_full_blocks(DIRECT_REQUEST, keyed([BlockHash(b"x" * 32)], 0), [first], 0, 1)
    pool.cache_full_blocks(DIRECT_REQUEST, keyed([BlockHash(b"x" * 32)], 0), [second], 0, 1)
    pool.free_blocks([first, second])
    pool.check_invariants()
    version = pool.cached_block_hash_to_block.version
    pool.get_new_blocks(5)  # the five unhashed blocks first; the cached two stay
    assert pool.cached_block_hash_to_block.version == version
    (popped,) = pool.get_new_blocks(1)  # the head of the hashed ones: `first`
    assert popped is first and first.block_hash is None
    assert second.block_hash is not None
    assert pool.cached_block_hash_to_block.get_one_block(second.block_hash) is second
    assert pool.cached_block_hash_to_block.version == version + 1
    assert pool.num_evicted_blocks == 1
    pool.check_invariants()


# ---------------------------------------------------------------- stale matches, every backend
def cached_prompt(backend: str, pages: int = 8) -> tuple[Any, list[int]]:
    cache = checked(backend, pages * B, B)
    prompt = tokens(4 * B, seed=3)
    run_to_completion(cache, Request("a", prompt))
    return cache, prompt


@pytest.mark.parametrize("backend", REUSING)
def test_a_match_taken_before_an_eviction_is_revalidated_and_pins_only_what_still_holds(backend: str) -> None:
    cache, prompt = cached_prompt(backend)
    b = Request("b", prompt + [7])
    match = cache.lookup(b)
    assert match.tokens == 4 * B
    c = Request("c", tokens(5 * B, seed=11))
    assert cache.allocate(c, c.num_tokens)  # needs five of the seven pages: evicts a's
    cache.release(c)  # (c computed nothing: its pages hold no cache)
    fresh = cache.lookup(b).tokens
    assert fresh < 4 * B
    revalidated = cache.revalidate(match)
    assert revalidated is not match and revalidated.tokens == fresh
    assert cache.allocate(b, b.num_tokens - fresh, match)  # the stale one, revalidated inside
    assert b.num_computed_tokens == fresh
    assert cache.stats.revalidated_matches == 2


@pytest.mark.parametrize("backend", REUSING)
def test_a_match_taken_before_a_reset_is_revalidated_to_nothing(backend: str) -> None:
    cache, prompt = cached_prompt(backend)
    b = Request("b", prompt + [7])
    match = cache.lookup(b)
    assert match.tokens == 4 * B and cache.reset()
    assert cache.revalidate(match).tokens == 0
    assert cache.allocate(b, b.num_tokens, match) and b.num_computed_tokens == 0


@pytest.mark.parametrize("backend", available_backends())
def test_an_unchanged_index_keeps_the_match_as_it_is(backend: str) -> None:
    cache, prompt = cached_prompt(backend)
    b = Request("b", prompt + [7])
    match = cache.lookup(b)
    other = Request("x", tokens(3, seed=5))
    cache.lookup(other)  # a lookup changes nothing a match depends on
    assert cache.revalidate(match) is match
    assert cache.allocate(b, b.num_tokens - match.tokens, match)
    assert b.num_computed_tokens == match.tokens and cache.stats.revalidated_matches == 0


def test_hashchain_revalidation_also_finds_blocks_cached_since() -> None:
    cache = checked("hashchain", 32 * B, B)
    prompt = tokens(4 * B, seed=3)
    a, b = Request("a", prompt + [1]), Request("b", prompt + [2])
    match = cache.lookup(b)
    assert match.tokens == 0
    assert cache.allocate(a, a.num_tokens)  # vLLM caches a's full blocks at allocation
    assert cache.allocate(b, b.num_tokens - 4 * B, match)
    assert b.num_computed_tokens == 4 * B
    assert cache.page_table(b)[:4] == cache.page_table(a)[:4]


@pytest.mark.parametrize("backend", available_backends())
def test_a_match_for_another_request_cache_or_length_is_refused(backend: str) -> None:
    cache, prompt = cached_prompt(backend)
    b, d = Request("b", prompt + [7]), Request("d", prompt + [8])
    match = cache.lookup(b)
    with pytest.raises(ValueError, match="handed to allocate for 'd'"):
        cache.allocate(d, 1, match)
    other = make_cache(backend, CacheConfig(8 * B, B))
    with pytest.raises(ValueError, match="another cache"):
        other.allocate(b, 1, match)
    b.append_output_token_ids(3)
    with pytest.raises(ValueError, match="look it up again"):
        cache.allocate(b, 1, match)
    with pytest.raises(ValueError, match="must be a Match"):
        cache.allocate(d, 1, 4)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="must be a Match"):
        cache.revalidate(4)  # type: ignore[arg-type]
    assert not cache.is_live(b) and not cache.is_live(d)


@pytest.mark.parametrize("backend", available_backends())
def test_a_live_request_takes_no_match(backend: str) -> None:
    cache, prompt = cached_prompt(backend)
    b = Request("b", prompt + [7] * 3)
    match = cache.lookup(b)
    assert cache.allocate(b, 1, match)
    with pytest.raises(ValueError, match="first allocate only"):
        cache.allocate(b, 1, cache.lookup(b))


# ---------------------------------------------------------------- one match per decision
class CountingEngine(Engine):
    """Counts, per (step, request), the backend's own matches (its ``_match`` hook) and the
    admission decisions (an allocate handed a match: first admissions, resumptions and
    failed tries alike)."""

    def __init__(self, cache: Any, *args: Any, **kwargs: Any) -> None:
        super().__init__(cache, *args, **kwargs)
        self.steps = 0  # step() calls (step_count skips steps that computed nothing)
        self.matches: dict[tuple[int, str], int] = {}
        self.decisions: dict[tuple[int, str], int] = {}
        match = cache._match

        def counted(req: Request) -> Match:
            at = (self.steps, req.request_id)
            self.matches[at] = self.matches.get(at, 0) + 1
            return match(req)  # type: ignore[no-any-return]

        cache._match = counted

    def step(self) -> int:
        self.steps += 1
        return super().step()

    def _allocate(self, req: Request, n: int, match: Match | None = None) -> bool:
        if match is not None:
            at = (self.steps, req.request_id)
            self.decisions[at] = self.decisions.get(at, 0) + 1
        return super()._allocate(req, n, match)


@pytest.mark.parametrize("backend", available_backends())
@pytest.mark.parametrize("scheduler", ["fcfs", "lpm"])
def test_an_engine_run_matches_each_request_once_per_scheduling_decision(
    backend: str, scheduler: str
) -> None:
    from prefixcache.experiments.inputs.workloads import make_workload

    cache = make_cache(backend, CacheConfig(64 * B, B))
    engine = CountingEngine(cache, scheduler, token_budget=48, check_invariants=True)
    reqs = make_workload(
        "shared-doc-qa", seed=1, num_docs=4, doc_len=40, num_requests=32, output_len=4
    ).generate()
    engine.run(reqs)
    assert engine.num_finished == len(reqs)
    assert engine.decisions and set(engine.decisions.values()) == {1}
    assert set(engine.matches.values()) == {1}, "a request was matched twice in one step"
    if scheduler == "fcfs":
        # FCFS looks a request up only right before it tries to admit it.
        assert engine.matches == engine.decisions
    else:
        # lpm orders the queue by every waiting request's match; the engine admits with those.
        assert set(engine.decisions) <= set(engine.matches)
    admitted = sum(1 for rec in engine.records.values() if rec.admission_step is not None)
    assert cache.stats.requests == admitted
