"""REFERENCE B3 eviction policies: exact eviction order of each, names, hit_count that moves."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from prefixcache.backends.radix import POLICIES, RadixCache, RadixKey, make_policy

from prefixcache import CacheConfig, Request, make_cache
from tests.helpers import checked, run_to_completion, tokens

# Three leaves under the root. A is created first, then B, then C (FIFO order A, B, C).
# Requests re-insert A twice and C once: hit_count A=3, B=1, C=2.
# Last accesses, by matches at the end: A, then C, then B (LRU order A, C, B).
# Request priorities: A=1, B=1, C=0. Lengths: A=2, B=4, C=3.
EXPECTED = {
    "lru": "ACB",
    "mru": "BCA",
    "fifo": "ABC",
    "filo": "CBA",
    "lfu": "BCA",  # (hit_count, time): B=1, C=2, A=3
    "priority": "CAB",  # (priority, time): C=0, then A before B by time
    "slru": "BAC",  # B probationary (1 < 2), then A and C protected, by time
    "wlfu": "BAC",  # ours: hit_count * len: A=6, B=4, C=6; A before C by time
    "gdsf": "BCA",  # inflation 0 until the first eviction: LFU's order, keys kept as computed
    "tlru": "ACB",  # every leaf ends its request and is shorter than the slack: LRU
    "wa": "ACB",  # value p * exp(-age / gap) per category head: here LRU's order
    "arc": "BAC",  # B alone in T1 (held once) and larger than p = 0; then T2 (A, C) by time
    "s3fifo": "BAC",  # B alone in S (1 >= 10% of 3 leaves); then M (A, C) by time
}
LEAVES = {"A": [1, 1], "B": [2, 2, 2, 2], "C": [3, 3, 3]}
PRIO = {"A": 1, "B": 1, "C": 0}


def eviction_order(policy: str) -> str:
    freed: list[int] = []
    clock = itertools.count(1).__next__
    def free(runs: list) -> None:
        freed.extend(int(s[0]) for s in runs)

    tree = RadixCache(1, eviction_policy=policy, free_slots=free, clock=clock, capacity=16)
    slot = {"A": 100, "B": 200, "C": 300}
    for name in "ABC":
        tree.insert(RadixKey(LEAVES[name]), np.full(len(LEAVES[name]), slot[name]), priority=PRIO[name])
    for name in "AAC":
        tree.insert(RadixKey(LEAVES[name]), np.zeros(len(LEAVES[name]), dtype=np.int64))
    for name in "ACB":
        tree.match_prefix(RadixKey(LEAVES[name]))
    order = ""
    while tree.evictable_size():
        tree.evict(1)  # one whole leaf per call
        tree.check()
        order += {100: "A", 200: "B", 300: "C"}[freed[-1]]
    return order


@pytest.mark.parametrize("policy", sorted(EXPECTED))
def test_each_policy_evicts_in_its_exact_order(policy: str) -> None:
    assert eviction_order(policy) == EXPECTED[policy]


def test_every_registered_policy_has_an_expected_order() -> None:
    assert set(EXPECTED) == set(POLICIES) | {"arc", "s3fifo"}


def test_lfu_is_not_lru() -> None:
    assert eviction_order("lfu") != eviction_order("lru")


@pytest.mark.parametrize("name", ["LRU", "Lfu", "fIfO", "SLRU"])
def test_policy_names_are_case_insensitive(name: str) -> None:
    assert type(make_policy(name)) is POLICIES[name.lower()]
    make_cache("radix", CacheConfig(64, 1), eviction_policy=name)


def test_unknown_policy_lists_the_valid_ones() -> None:
    with pytest.raises(ValueError, match="valid: lru, lfu, fifo, mru, filo, priority, slru"):
        make_policy("clock")
    listed = "unknown eviction policy .belady.*takes: eviction_policy: .*, arc, s3fifo, lrp"
    with pytest.raises(ValueError, match=listed):
        make_cache("radix", CacheConfig(64, 1), eviction_policy="belady")
    with pytest.raises(ValueError, match="needs the cache's capacity"):
        RadixCache(1, eviction_policy="arc")


def test_slru_protects_at_threshold_two() -> None:
    assert make_policy("slru").threshold == 2  # type: ignore[attr-defined]


def test_request_flow_moves_hit_count_so_lfu_keeps_the_often_used_prefix() -> None:
    """Upstream failure mode: an LFU whose hit_count never moves is plain LRU."""
    results = {}
    for policy in ("lfu", "lru"):
        cache = checked("radix", 256, 1, eviction_policy=policy)
        hot, cold = tokens(20, seed=1), tokens(20, seed=2)
        for i in range(3):
            run_to_completion(cache, Request(f"hot{i}", hot))
        run_to_completion(cache, Request("cold", cold))  # more recent, used once
        root = cache.cache.tree.root_node
        assert (root.children[hot[0]].hit_count, root.children[cold[0]].hit_count) == (3, 1)
        cache.evict(20)
        results[policy] = (cache.lookup(Request("h", hot)).tokens, cache.lookup(Request("c", cold)).tokens)
    assert results["lfu"] == (19, 0), "LFU evicts the once-used prompt"
    assert results["lru"] == (0, 19), "LRU evicts the least recently used prompt"


@pytest.mark.parametrize("policy", sorted(EXPECTED))
def test_a_split_leaf_is_resorted_under_every_policy(policy: str) -> None:
    """A match ending inside an evictable leaf splits it; the lower part stays a leaf whose
    length (wlfu's key) changed, so its entry in the leaf index must be renewed. This is the
    bug whole-trace replays found: wlfu left a stale priority after a split."""
    clock = itertools.count(1).__next__
    tree = RadixCache(1, eviction_policy=policy, clock=clock, capacity=16)
    tree.insert(RadixKey([1, 2, 3, 4, 5, 6]), np.arange(6))
    tree.insert(RadixKey([1, 2, 3, 4, 5, 6]), np.arange(6))  # hit_count 2: wlfu's key moves with length
    tree.match_prefix(RadixKey([1, 2, 9]))  # splits [1..6] at 2
    tree.check()
    assert [len(n.key) for n in tree.evictable_leaves()] == [4]
    tree.insert(RadixKey([1, 2, 7, 8]), np.arange(4))
    tree.check()
