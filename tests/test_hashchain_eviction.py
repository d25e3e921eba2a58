"""Eviction through the cache (REFERENCE A3/A4): order, evict(), evict_blocks, reset, stats,
the two ablation switches, and a stateful run with invariants checked after every step."""

from __future__ import annotations

import contextlib
from typing import Any

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, precondition, rule

from prefixcache import Request
from tests.helpers import checked, run_to_completion, tokens

B = 4


def hc(num_blocks: int, **options: Any) -> Any:
    return checked("hashchain", num_blocks * B, B, **options)


def free_ids(cache: Any) -> list[int]:
    return [b.block_id for b in cache.cache.block_pool.free_block_queue.get_all_free_blocks()]


@pytest.mark.parametrize("groups", [None, [("full",), ("sliding_window", 8)]])
@pytest.mark.parametrize("option", [{"free_order": "backward"}, {"unhashed_first": 1}])
def test_bad_ablation_switches_are_refused_by_name_on_both_managers(
    groups: list[tuple[object, ...]] | None, option: dict[str, object]
) -> None:
    (name,) = option
    with pytest.raises(ValueError, match=name):
        hc(8, attention_groups=groups, **option)


def test_reuse_evicts_the_tail_of_a_freed_chain_first_so_its_start_survives() -> None:
    cache = hc(7)  # 6 usable
    prompt = tokens(13)  # blocks 1, 2, 3 full; 4 partial
    run_to_completion(cache, Request("a", prompt))
    assert free_ids(cache) == [4, 5, 6, 3, 2, 1]
    run_to_completion(cache, Request("c", tokens(16, seed=7)))  # pops 4 5 6 3
    assert cache.stats.evicted_tokens == B  # block 3 lost its hash when reused
    assert cache.lookup(Request("a2", prompt)).tokens == 8


def test_forward_free_order_ablation_evicts_the_head_of_the_chain_and_loses_the_prefix() -> None:
    cache = hc(7, free_order="forward")
    prompt = tokens(13)
    run_to_completion(cache, Request("a", prompt))
    assert free_ids(cache) == [4, 5, 6, 1, 2, 3]
    run_to_completion(cache, Request("c", tokens(16, seed=7)))
    assert cache.lookup(Request("a2", prompt)).tokens == 0  # block 1 went first: the chain is broken


@pytest.mark.parametrize("unhashed_first, expected_hit", [(True, 8), (False, 4)])
def test_unhashed_blocks_are_reused_before_cached_ones_unless_the_ablation_turns_it_off(
    unhashed_first: bool, expected_hit: int
) -> None:
    cache = hc(5, unhashed_first=unhashed_first)  # 4 usable
    x = tokens(8)
    run_to_completion(cache, Request("x", x))  # blocks 1, 2 cached; queue 3 4 2 1
    run_to_completion(cache, Request("y", tokens(3, seed=2)))  # block 3, never full
    assert free_ids(cache) == ([3, 4, 2, 1] if unhashed_first else [4, 2, 1, 3])
    run_to_completion(cache, Request("z", tokens(8, seed=3)))  # takes 2 blocks from the head
    assert cache.lookup(Request("x2", x + [1])).tokens == expected_hit


def test_evict_drops_cached_blocks_from_the_lru_end_and_returns_whole_blocks() -> None:
    cache = hc(16)
    a, b = tokens(8, seed=1), tokens(8, seed=2)
    ra, rb = Request("a", a), Request("b", b)
    assert cache.allocate(ra, 8) and cache.allocate(rb, 8)
    for r in (ra, rb):  # a freed first: least recently used
        r.num_computed_tokens = 8
        cache.commit(r)
        cache.release(r)
    assert cache.evict(1) == B  # rounds up to one block: a's tail
    assert cache.lookup(Request("a2", a + [0])).tokens == 4
    assert cache.lookup(Request("b2", b + [0])).tokens == 8
    assert cache.evict(5) == 2 * B  # a's head, then b's tail
    assert cache.lookup(Request("b3", b + [0])).tokens == 4
    assert cache.evict(100) == B and cache.evict(4) == 0
    assert cache.usage().evictable == 0
    assert cache.stats.evicted_tokens == 16


def test_evict_never_touches_blocks_in_use() -> None:
    cache = hc(8)
    live = Request("live", tokens(12))
    assert cache.allocate(live, 12)
    assert cache.evict(100) == 0
    assert cache.lookup(Request("twin", tokens(12) + [1])).tokens == 12


def test_evict_blocks_drops_the_named_cached_blocks_and_counts_them_as_evicted() -> None:
    cache = hc(16)
    prompt = tokens(12)
    live = Request("live", prompt)
    assert cache.allocate(live, 12)  # 1, 2, 3 cached and in use
    assert cache.evict_blocks({3, 9}) == B  # 9 holds nothing
    assert cache.usage().in_use == 3  # still pinned by live
    assert cache.lookup(Request("twin", prompt + [1])).tokens == 8
    assert cache.stats.evicted_tokens == B
    finish = live
    finish.num_computed_tokens = 12
    cache.commit(finish)
    cache.release(finish)
    assert free_ids(cache)[0] == 3  # lost its hash: freed to the head like any unhashed block


def test_reset_drops_every_cached_block_and_the_stats() -> None:
    cache = hc(16)
    run_to_completion(cache, Request("a", tokens(13)))
    assert cache.reset() is True
    assert cache.usage() == (15, 0, 0)
    assert all(b.block_hash is None for b in cache.cache.block_pool.blocks)
    assert cache.lookup(Request("a2", tokens(13))).tokens == 0
    assert cache.stats.requests == 0 and cache.stats.evicted_tokens == 0


def test_preempted_request_is_counted_apart_from_first_admissions() -> None:
    cache = hc(16)
    r = Request("r", tokens(9))
    assert cache.allocate(r, 9)
    r.num_computed_tokens = 9
    cache.commit(r)
    cache.release(r)
    r.num_computed_tokens, r.num_preemptions = 0, 1
    assert cache.allocate(r, r.num_tokens - cache.lookup(r).tokens)
    s = cache.stats
    assert (s.requests, s.queries, s.hits) == (1, 9, 0)
    assert (s.preempted_requests, s.preempted_queries, s.preempted_hits) == (1, 9, 8)


# ---------------------------------------------------------------- stateful
PREFIXES = [tokens(6, seed=100), tokens(9, seed=101), []]


class HashChainMachine(RuleBasedStateMachine):
    """Random admissions, chunked prefill, decode, releases, evictions and resets on a small
    pool; ``checked`` runs check_invariants after every call."""

    def __init__(self) -> None:
        super().__init__()
        self.cache = hc(10, hash_fn="xxhash")
        self.live: list[Request] = []
        self.count = 0

    @rule(prefix=st.sampled_from(range(len(PREFIXES))), tail=st.integers(1, 12), chunk=st.integers(1, 20))
    def admit(self, prefix: int, tail: int, chunk: int) -> None:
        self.count += 1
        req = Request(f"r{self.count}", PREFIXES[prefix] + tokens(tail, seed=tail % 3))
        hit = self.cache.lookup(req).tokens
        n = min(chunk, req.num_tokens - hit)
        try:
            ok = self.cache.allocate(req, n)
        except ValueError:  # larger than the whole pool
            return
        if ok:
            assert req.num_computed_tokens == hit
            self.live.append(req)

    @precondition(lambda self: self.live)
    @rule(i=st.integers(0, 50), n=st.integers(1, 8), decode=st.booleans())
    def step(self, i: int, n: int, decode: bool) -> None:
        req = self.live[i % len(self.live)]
        req.num_computed_tokens = self.cache.reserved_tokens(req)
        self.cache.commit(req)
        if req.num_computed_tokens == req.num_tokens or decode:
            req.append_output_token_ids(7)
        n = min(n, req.num_tokens - req.num_computed_tokens)
        if n > 0:
            with contextlib.suppress(ValueError):  # the request outgrew the whole pool
                self.cache.allocate(req, n)

    @precondition(lambda self: self.live)
    @rule(i=st.integers(0, 50))
    def release(self, i: int) -> None:
        self.cache.release(self.live.pop(i % len(self.live)))

    @rule(n=st.integers(0, 40))
    def evict(self, n: int) -> None:
        self.cache.evict(n)

    @rule(ids=st.sets(st.integers(0, 9), max_size=3))
    def evict_blocks(self, ids: set[int]) -> None:
        self.cache.cache.evict_blocks(ids)
        self.cache.check_invariants()

    @rule()
    def reset(self) -> None:
        assert self.cache.reset() is (not self.live)


TestHashChainStateful = HashChainMachine.TestCase
