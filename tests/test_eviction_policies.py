"""One eviction vocabulary for both designs (prefixcache.eviction): names, the order each
policy evicts in hashchain (free cached leaf blocks) and radix (leaves), the vLLM default
left alone, and orphaned blocks counted."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from prefixcache.backends.hashchain.block_pool import BlockPool
from prefixcache.backends.hashchain.eviction import FreeQueueLRU, RankedEviction, make_eviction_order

from prefixcache import CacheConfig, Request, eviction_policies, make_cache
from prefixcache.capabilities import BACKENDS_WITH_POLICIES
from prefixcache.eviction import (
    CAPACITY_POLICIES,
    LOOKUP_POLICIES,
    POLICIES,
    make_policy,
    note_eviction,
)
from tests.helpers import DIRECT_REQUEST, checked, keyed, run_to_completion
from tests.test_hashchain_block_pool import h

PAGE = 4
# Three one-block prompts (4 tokens + 1 computed): each caches one page, so a radix leaf and a
# hashchain block hold the same thing. Arrivals A B C, then hits A A C: holders A=3 B=1 C=2,
# last use A, A, C (LRU order B, A, C), creation order A, B, C.
PROMPTS = {"A": [1, 1, 1, 1, 0], "B": [2, 2, 2, 2, 0], "C": [3, 3, 3, 3, 0]}
EXPECTED = {
    "lru": "BAC",
    "mru": "CAB",
    "fifo": "ABC",
    "filo": "CBA",
    "lfu": "BCA",
    "priority": "BAC",  # every page is a prompt page of equal priority: LRU
    "slru": "BAC",  # B probationary (held once), then A, C protected by time
    "wlfu": "BCA",  # equal lengths: LFU
    "gdsf": "BCA",  # no eviction before: inflation 0, LFU's order
    "tlru": "BAC",  # every block ends within the slack of its request's end: all excess, LRU
    "wa": "BAC",  # B's category (held once) decays from the oldest stamp; A, C by age
    "arc": "BAC",  # B alone in T1 (seen once), larger than p = 0; then T2 by LRU
    "s3fifo": "BAC",  # B alone in S (1 >= 10% of 3); then M by LRU
}
NAMES = [*POLICIES, *(p for p in CAPACITY_POLICIES if p not in LOOKUP_POLICIES)]


def cached_after_evicting(backend: str, policy: str, pages: int) -> set[str]:
    """The prompts still cached after the scenario and ``pages`` one-page evictions (probed
    once at the end: a radix match stamps access times, so probing between evictions would
    change the order it measures)."""
    # A counter for radix's stamps, not wall time: a loaded machine must not reorder ties.
    clock = {"clock": itertools.count().__next__} if backend == "radix" else {}
    cache = checked(backend, 16 * PAGE, PAGE, eviction_policy=policy, **clock)
    for i, name in enumerate("ABCAAC"):
        run_to_completion(cache, Request(f"{name}{i}", PROMPTS[name]))
    for _ in range(pages):
        assert cache.evict(PAGE) == PAGE  # one page per call
    return {n for n, p in PROMPTS.items() if cache.lookup(Request("probe", p)).tokens}


def eviction_order(backend: str, policy: str) -> str:
    order, before = "", set(PROMPTS)
    for pages in range(1, len(PROMPTS) + 1):
        after = cached_after_evicting(backend, policy, pages)
        (gone,) = before - after
        order, before = order + gone, after
    return order


@pytest.mark.parametrize("backend", BACKENDS_WITH_POLICIES)
@pytest.mark.parametrize("policy", sorted(NAMES))
def test_each_policy_evicts_in_the_same_order_in_both_designs(backend: str, policy: str) -> None:
    assert eviction_order(backend, policy) == EXPECTED[policy]


def test_every_policy_has_an_expected_order_and_both_backends_list_them_all() -> None:
    assert set(EXPECTED) == set(NAMES)
    assert eviction_policies("radix") == [*POLICIES, "arc", "s3fifo", "lrp"]
    # and hashchain's ranked LRU, whose "lru" is vLLM's free queue (the decomposition's switch)
    assert eviction_policies("hashchain") == [*POLICIES, "arc", "s3fifo", "lrp", "leaf-lru"]
    for backend in BACKENDS_WITH_POLICIES:
        for name in eviction_policies(backend):
            make_cache(backend, CacheConfig(64, PAGE), eviction_policy=name.upper())  # any case


def test_lrp_where_nothing_feeds_it_is_a_clear_error() -> None:
    """lrp learns from each request's admission and release; SGLang's HiCache tree (and a bare
    RadixCache whose owner does not feed it) refuses it rather than run it blind."""
    from prefixcache.backends.radix.radix_cache import RadixCache

    from prefixcache.tiers import HostTierConfig

    with pytest.raises(ValueError, match="learns from each request's lookup, which this cache does not feed"):
        make_cache("radix", CacheConfig(64, PAGE), eviction_policy="lrp",
                   host_tier=HostTierConfig(capacity_tokens=64 * PAGE))
    with pytest.raises(ValueError, match="does not feed"):
        RadixCache(PAGE, eviction_policy="lrp", capacity=8)


def test_a_backend_without_policies_and_an_unknown_policy_are_clear_errors() -> None:
    with pytest.raises(ValueError, match="takes no eviction_policy; those that do: hashchain, radix"):
        eviction_policies("none")
    for backend in BACKENDS_WITH_POLICIES:
        listed = "unknown eviction policy 'clock' .* takes: eviction_policy: lru, lfu"
        with pytest.raises(ValueError, match=listed):
            make_cache(backend, CacheConfig(64, PAGE), eviction_policy="clock")


def test_hashchain_lru_is_vllms_free_queue_and_other_names_rank_leaves() -> None:
    def order(**kw: Any) -> type:
        return type(make_cache("hashchain", CacheConfig(64, PAGE), **kw).block_pool.eviction)

    assert order() is order(eviction_policy="lru") is FreeQueueLRU
    assert order(eviction_policy="lfu") is RankedEviction
    with pytest.raises(ValueError, match="unhashed_first=True"):
        make_cache("hashchain", CacheConfig(64, PAGE), eviction_policy="lfu", unhashed_first=False)


@pytest.mark.parametrize("policy", ["mru", "fifo"])
def test_a_ranked_policy_evicts_a_chain_from_its_end(policy: str) -> None:
    """MRU and FIFO would pick the chain's head (most recent / oldest); ranking leaves only
    takes the deepest block first, so the rest of the chain still hits."""
    cache = checked("hashchain", 16 * PAGE, PAGE, eviction_policy=policy)
    prompt = list(range(3 * PAGE + 1))
    run_to_completion(cache, Request("r", prompt))
    for expected in (2 * PAGE, PAGE, 0):
        cache.evict(PAGE)
        assert cache.lookup(Request("probe", prompt)).tokens == expected
    assert cache.stats.orphaned_tokens == 0


def test_evicting_a_block_in_the_middle_of_a_chain_counts_its_child_as_orphaned() -> None:
    pool = BlockPool(8, eviction=make_eviction_order("lfu", 7, PAGE))
    blocks = pool.get_new_blocks(3)
    pool.cache_full_blocks(DIRECT_REQUEST, keyed([h(i) for i in range(3)], 0), blocks, 0, 3)
    assert pool.evict_blocks({blocks[1].block_id}) == 1  # vLLM's KV-connector hook, in use
    assert isinstance(pool.eviction, RankedEviction) and pool.eviction.num_orphaned_blocks == 1
    pool.free_blocks(reversed(blocks))
    pool.check_invariants()  # block 2 (orphaned) and block 0 (now childless) are both leaves
    assert len(pool.eviction) == 2


def test_hashchain_lrp_learns_from_the_ghost_of_evicted_blocks() -> None:
    """A prompt evicted and then asked again: its lookup reaches the ghost, so it counts as
    reuse of the class its blocks were freed under, and the request is classed as one the
    cache would have hit in full."""
    cache = checked("hashchain", 16 * PAGE, PAGE, eviction_policy="lrp")
    learner = cache.cache.block_pool.eviction.learner
    prompt = list(range(3 * PAGE + 1))
    run_to_completion(cache, Request("first", prompt))
    first_class = learner.current
    assert first_class == (0, 0, 0)  # nothing seen: hit fraction 0, short prompt, no output
    assert cache.evict(3 * PAGE) == 3 * PAGE
    assert len(learner.ghost) == 3
    reuses_before = learner.reuses.get(first_class, 0.5)
    again = Request("again", prompt)
    match = cache.lookup(again)
    assert match.tokens == 0 and cache.allocate(again, again.num_tokens, match)
    assert cache.cache.block_pool.eviction.seen_fraction["again"] == 1.0
    assert learner.reuses[first_class] == reuses_before + 3 and not learner.ghost
    again.num_computed_tokens = again.num_tokens
    cache.commit(again)
    cache.release(again)
    assert learner.current == (3, 0, 0)  # classed as a request the cache would have hit in full
    assert "again" not in cache.cache.block_pool.eviction.seen_fraction
    blocks = [b for b in cache.cache.block_pool.blocks if b.block_hash is not None]
    assert len(blocks) == 3 and all(b.reuse_class == (3, 0, 0) for b in blocks)


def test_hashchain_lrp_state_kept_for_a_request_not_live_fails_the_orders_check() -> None:
    """What lrp learns of a request lives in its eviction order until the request is released;
    the order's check_requests (called by the backend's check_invariants) refuses any left over."""
    from prefixcache.invariants import InvariantError

    order = make_eviction_order("lrp", 7, PAGE)
    order.admitted(Request("gone", list(range(PAGE + 1))), [], lambda request: [])
    order.check_requests({"gone"})
    with pytest.raises(InvariantError, match="not live"):
        order.check_requests(set())
    order.released(Request("gone", list(range(PAGE + 1))))
    order.check_requests(set())


@pytest.mark.parametrize("page", [1, PAGE])
def test_radix_lrp_learns_from_the_ghost_of_evicted_edges(page: int) -> None:
    """The radix form of the test above: the ghost remembers an evicted edge by (parent node,
    first page) and carries the edge's own node, so a prompt evicted edge by edge (a chain of
    three turns' prefixes) is walked again through the ghost in full; its reuse is credited
    to the class its nodes were unlocked under."""
    cache = checked("radix", 16 * PAGE, page, eviction_policy="lrp")
    tree = cache.cache.tree
    learner = tree.learner
    base = list(range(1000, 1000 + PAGE))
    turns = [base + list(range(2000, 2000 + k * PAGE)) + [7] for k in (1, 2, 3)]  # nested prefixes
    for i, prompt in enumerate(turns):
        run_to_completion(cache, Request(f"turn{i}", prompt))
    first_class = learner.current
    assert first_class[0] >= 1  # the later turns hit their earlier turn's prefix
    assert cache.evict(16 * PAGE) > 0 and tree.evictable_size() == 0
    assert len(learner.ghost) >= 2  # edge by edge: the path split at each turn's end
    reuses_before, ghost_before = sum(learner.reuses.values()), len(learner.ghost)
    again = Request("again", turns[-1])
    match = cache.lookup(again)
    assert match.tokens == 0 and cache.allocate(again, again.num_tokens, match)
    assert cache.cache._live["again"].state.seen == 1.0  # the ghost held all of its aligned prompt
    # each ghost edge on its path is taken and credited once; the earlier turns' own tails
    # (the branches it does not take) stay
    taken = ghost_before - len(learner.ghost)
    assert taken >= 2 and sum(learner.reuses.values()) == reuses_before + taken
    again.num_computed_tokens = again.num_tokens
    cache.commit(again)
    cache.release(again)
    assert learner.current == (3, 0, 0)  # classed as a request the cache would have hit in full
    nodes = tree.iter_nodes()
    assert nodes and all(n.reuse_class == (3, 0, 0) for n in nodes)


def test_radix_lrp_credits_hits_and_classes_only_what_a_release_unlocks() -> None:
    """A hit credits the class each hit node was unlocked under, once per node; a release
    gives its class to the nodes it alone still locked, not to those another request holds."""
    cache = checked("radix", 32 * PAGE, PAGE, eviction_policy="lrp")
    tree, learner = cache.cache.tree, cache.cache.tree.learner
    shared = list(range(100, 100 + 2 * PAGE))
    run_to_completion(cache, Request("a", shared + [1]))
    a_class = learner.current
    hit_nodes = [n for n in tree.iter_nodes() if n.reuse_class == a_class]
    before = learner.reuses.get(a_class, 0.5)
    b = Request("b", shared + list(range(500, 500 + PAGE)) + [2], max_new_tokens=3)
    match = cache.lookup(b)
    assert match.tokens == 2 * PAGE and cache.allocate(b, b.num_tokens - match.tokens, match)
    assert learner.reuses[a_class] == before + len(hit_nodes)  # one credit per hit node
    c = Request("c", shared + [3])  # shares b's locked prefix, then releases before b
    run_to_completion(cache, c)
    c_class = learner.current
    assert c_class != a_class  # c hit its whole prompt: another hit-fraction class
    shared_nodes = [n for n in tree.iter_nodes() if n.lock_ref > 0]  # b still holds them
    assert shared_nodes and all(n.reuse_class == a_class for n in shared_nodes)


def test_gdsf_ages_frequency_where_lfu_never_forgets() -> None:
    """Keys are kept as computed: after an eviction at key 3, a new entry used once (key 1 + 3)
    outranks an old entry used three times (key 3, computed before), where LFU keeps the old."""
    from types import SimpleNamespace

    gdsf, lfu = make_policy("gdsf"), make_policy("lfu")
    old = SimpleNamespace(hit_count=3, last_access_time=1.0)
    old_key = gdsf.priority(old)
    assert old_key == (3, 1.0)
    note_eviction(gdsf, (3, 0.5))  # evicted an entry keyed 3: the inflation is now 3
    new = SimpleNamespace(hit_count=1, last_access_time=2.0)
    assert gdsf.priority(new) == (4, 2.0) > old_key
    assert lfu.priority(new) < lfu.priority(old)
    note_eviction(gdsf, (1, 0.0))  # a smaller victim key never lowers the inflation
    assert gdsf.priority(new) == (4, 2.0)


def test_a_ranked_pool_hands_out_unhashed_free_blocks_before_evicting() -> None:
    pool = BlockPool(8, eviction=make_eviction_order("lfu", 7, PAGE))
    blocks = pool.get_new_blocks(2)
    pool.cache_full_blocks(DIRECT_REQUEST, keyed([h(0), h(1)], 0), blocks, 0, 2)
    pool.free_blocks(reversed(blocks))  # 2 cached free blocks, 5 unhashed free ones
    taken = pool.get_new_blocks(5)
    assert all(b.block_hash is None for b in taken) and pool.num_evicted_blocks == 0
    assert pool.get_new_blocks(1) == [blocks[1]] and pool.num_evicted_blocks == 1  # then the leaf
    pool.check_invariants()
