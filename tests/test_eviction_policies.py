"""One eviction vocabulary for both designs (prefixcache.eviction): names, the order each
policy evicts in hashchain (free cached leaf blocks) and radix (leaves), the vLLM default
left alone, and orphaned blocks counted."""

from __future__ import annotations

import pytest
from prefixcache.backends.hashchain.block_pool import BlockPool

from prefixcache import CacheConfig, Request, eviction_policies, make_cache
from prefixcache.eviction import BACKENDS_WITH_POLICIES, POLICIES
from tests.helpers import checked, keyed, run_to_completion
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
}


def cached_after_evicting(backend: str, policy: str, pages: int) -> set[str]:
    """The prompts still cached after the scenario and ``pages`` one-page evictions (probed
    once at the end: a radix match stamps access times, so probing between evictions would
    change the order it measures)."""
    cache = checked(backend, 16 * PAGE, PAGE, eviction_policy=policy)
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
@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_each_policy_evicts_in_the_same_order_in_both_designs(backend: str, policy: str) -> None:
    assert eviction_order(backend, policy) == EXPECTED[policy]


def test_every_policy_has_an_expected_order_and_both_backends_list_them_all() -> None:
    assert set(EXPECTED) == set(POLICIES)
    for backend in BACKENDS_WITH_POLICIES:
        assert eviction_policies(backend) == list(POLICIES)
        make_cache(backend, CacheConfig(64, PAGE), eviction_policy="SLRU")  # case-insensitive


def test_a_backend_without_policies_and_an_unknown_policy_are_clear_errors() -> None:
    with pytest.raises(ValueError, match="takes no eviction_policy; those that do: hashchain, radix"):
        eviction_policies("none")
    for backend in BACKENDS_WITH_POLICIES:
        with pytest.raises(ValueError, match="valid: lru, lfu"):
            make_cache(backend, CacheConfig(64, PAGE), eviction_policy="clock")


def test_hashchain_lru_is_vllms_free_queue_and_other_names_rank_leaves() -> None:
    assert make_cache("hashchain", CacheConfig(64, PAGE)).block_pool.ranked is None
    assert make_cache("hashchain", CacheConfig(64, PAGE), eviction_policy="lru").block_pool.ranked is None
    assert make_cache("hashchain", CacheConfig(64, PAGE), eviction_policy="lfu").block_pool.ranked is not None
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
    pool = BlockPool(8, eviction_policy="lfu", block_size=PAGE)
    blocks = pool.get_new_blocks(3)
    pool.cache_full_blocks(keyed([h(i) for i in range(3)], 0), blocks, 0, 3)
    assert pool.evict_blocks({blocks[1].block_id}) == 1  # vLLM's KV-connector hook, in use
    assert pool.ranked is not None and pool.ranked.num_orphaned_blocks == 1
    pool.free_blocks(reversed(blocks))
    pool.check_invariants()  # block 2 (orphaned) and block 0 (now childless) are both leaves
    assert len(pool.ranked) == 2
