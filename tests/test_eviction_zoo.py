"""The zoo beyond SGLang's seven (prefixcache.eviction): ARC, S3-FIFO, tail-optimized LRU and
workload-aware eviction, their segmented index, and what makes each differ from LRU."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
import pytest
from prefixcache.backends.hashchain.eviction import RankedEviction
from prefixcache.backends.radix import RadixCache, RadixKey

from prefixcache import CacheConfig, Request, make_cache
from prefixcache.eviction import (
    ARC,
    S3FIFO,
    Ghost,
    SegmentedIndex,
    TailOptimizedLRU,
    WorkloadAware,
    make_index,
    make_policy,
)
from tests.helpers import checked, run_to_completion


@dataclass
class Entry:
    last_access_time: float = 0.0
    creation_time: float = 0.0
    hit_count: int = 1
    priority: int = 0
    num_tokens: int = 1
    tail_tokens: int = 0
    ghost_hit: bool = False
    policy_state: tuple | None = None


def entry_tuple(policy, e: Entry, i: int) -> tuple:
    return (policy.priority(e), i, e)


# ------------------------------------------------------------------ the segmented index
def test_segmented_index_pops_the_segment_the_policy_chooses_and_keeps_its_count() -> None:
    policy = S3FIFO(capacity=8, small=0.5)
    index = make_index(policy)
    assert isinstance(index, SegmentedIndex) and not index
    small = [Entry(creation_time=t, last_access_time=t) for t in (5, 3)]
    main = [Entry(hit_count=2, last_access_time=t) for t in (1, 2)]
    entries = [entry_tuple(policy, e, i) for i, e in enumerate(small + main)]
    for t in entries:
        index.add(t)
    assert len(index) == 4 and [t[-1] for t in index] == [small[1], small[0], main[0], main[1]]
    assert index[0][-1] is small[1]  # S holds 2 of 4 >= 50%: its oldest-created goes
    index.pop(0)
    assert index.pop(0)[-1] is main[0]  # S now 1 of 3 < 50%: M, least recently used first
    index.remove(entries[0])
    assert len(index) == 1 and index[0][-1] is main[1]
    with pytest.raises(IndexError, match="only shows its next victim"):
        index[1]
    with pytest.raises(ValueError):
        index.remove(entries[0])  # not there any more


def test_plain_policies_keep_a_sorted_list() -> None:
    assert not isinstance(make_index(make_policy("lru")), SegmentedIndex)
    assert isinstance(make_index(make_policy("wa")), SegmentedIndex)


def test_ghost_is_bounded_fifo_and_take_forgets() -> None:
    g = Ghost(2)
    for cid in "abc":
        g.add(cid)
    assert len(g) == 2 and not g.take("a")  # the oldest fell out
    assert g.take("b") and not g.take("b")


# ------------------------------------------------------------------ ARC
def test_arc_adapts_its_target_on_ghost_hits_and_evicts_t1_while_above_it() -> None:
    arc = ARC(capacity=4)
    once, twice = Entry(hit_count=1), Entry(hit_count=2)
    assert arc.priority(once)[0] == 1 and arc.priority(twice)[0] == 2
    arc.forget(once, "x")  # evicted from T1: remembered in B1
    arc.forget(twice, "y")  # from T2: B2
    new = Entry()
    arc.admit(new, "x")  # a B1 hit: T1 was too small
    assert arc.p == 1.0 and new.ghost_hit and arc.priority(new)[0] == 2
    assert arc.choose({1: 1, 2: 5}, {}) == 2  # |T1| = 1 is not above p = 1
    assert arc.choose({1: 2, 2: 5}, {}) == 1
    arc.admit(Entry(), "y")  # a B2 hit: p shrinks again
    assert arc.p == 0.0
    assert arc.choose({1: 1}, {}) == 1 and arc.choose({2: 1}, {}) == 2  # one side empty
    fresh = Entry()
    arc.admit(fresh, "never-seen")
    assert not fresh.ghost_hit


# ------------------------------------------------------------------ S3-FIFO
def test_s3fifo_sends_ghost_hits_to_main_and_remembers_only_small_evictions() -> None:
    s3 = S3FIFO(capacity=4)
    small, main = Entry(creation_time=7), Entry(hit_count=3, last_access_time=9)
    assert s3.priority(small) == (0, 7) and s3.priority(main) == (1, 9)
    s3.forget(main, "m")
    s3.forget(small, "s")
    back = Entry()
    s3.admit(back, "s")
    assert back.ghost_hit and s3.priority(back)[0] == 1
    again = Entry()
    s3.admit(again, "m")  # evicted from M: not in the ghost
    assert not again.ghost_hit
    assert s3.choose({0: 1, 1: 9}, {}) == 0 and s3.choose({0: 1, 1: 10}, {}) == 1
    with pytest.raises(ValueError, match="small queue share"):
        S3FIFO(4, small=1.0)


def test_s3fifo_in_radix_evicts_a_one_hit_leaf_before_an_older_reused_one() -> None:
    clock = itertools.count(1).__next__
    tree = RadixCache(1, eviction_policy="s3fifo", clock=clock, capacity=16)
    tree.insert(RadixKey([1, 1]), np.arange(2))
    tree.insert(RadixKey([1, 1]), np.arange(2))  # held twice: main queue
    tree.insert(RadixKey([2, 2]), np.arange(2))  # newer, held once: small queue
    tree.evict(1)
    tree.check()
    assert tree.match_prefix(RadixKey([1, 1])).length == 2  # LRU would have taken [1, 1]
    assert tree.match_prefix(RadixKey([2, 2])).length == 0


def test_s3fifo_in_radix_reinserted_content_goes_to_main() -> None:
    clock = itertools.count(1).__next__
    tree = RadixCache(1, eviction_policy="s3fifo", clock=clock, capacity=16)
    tree.insert(RadixKey([3, 3]), np.arange(2))
    tree.evict(2)
    tree.insert(RadixKey([3, 3, 4, 4]), np.arange(4))  # a longer edge on the same branch:
    (leaf,) = tree.evictable_leaves()  # the next turn of what was evicted, a ghost hit
    assert leaf.ghost_hit and tree.policy.priority(leaf)[0] == 1
    tree.insert(RadixKey([5, 5]), np.arange(2))  # another branch of the root: a stranger
    assert [n.ghost_hit for n in tree.evictable_leaves() if n.key.token_ids[0] == 5] == [False]


def test_a_radix_split_hands_its_upper_part_the_policy_fields() -> None:
    """The upper part of a split edge is what becomes a leaf when the lower part goes: it keeps
    the edge's ghost hit (its segment) and counts the lower part in its tail."""
    clock = itertools.count(1).__next__
    tree = RadixCache(1, eviction_policy="s3fifo", clock=clock, capacity=16)
    tree.insert(RadixKey([3, 3]), np.arange(2))
    tree.evict(2)
    tree.insert(RadixKey([3, 3, 4, 4, 5, 5]), np.arange(6))  # a ghost hit, tail 0
    tree.match_prefix(RadixKey([3, 3, 4, 9]))  # splits it after [3, 3, 4]
    upper = tree.root_node.children[3]
    assert len(upper.key) == 3 and upper.ghost_hit and upper.tail_tokens == 3
    tree.check()


# ------------------------------------------------------------------ tail-optimized LRU
def test_tlru_evicts_excess_before_older_entries() -> None:
    tlru = TailOptimizedLRU(slack=8)
    excess = Entry(last_access_time=9, num_tokens=4, tail_tokens=4)  # 8 tokens to the end
    needed = Entry(last_access_time=1, num_tokens=4, tail_tokens=5)
    assert tlru.priority(excess) < tlru.priority(needed)
    with pytest.raises(ValueError, match="slack"):
        TailOptimizedLRU(-1)


# An old three-page request O and a newer one-page request N; what each still hits after
# evicting ``pages`` pages, under LRU and under tlru with a slack of one page.
TLRU_CASES = {
    # hashchain ranks blocks: both requests' last blocks are excess (nothing of theirs follows
    # them), so O's tail goes first under both; then LRU takes O's next block, while tlru
    # keeps it (a page of O follows it: its next turn needs it) and takes N.
    "hashchain": (2, {"lru": (4, 4), "tlru": (8, 0)}),
    # radix ranks whole leaves: O's is one 12-token edge, longer than the slack: only N is
    # excess, so tlru takes N where LRU takes O.
    "radix": (1, {"lru": (0, 4), "tlru": (12, 0)}),
}


@pytest.mark.parametrize("backend", sorted(TLRU_CASES))
def test_tlru_in_both_designs_keeps_what_a_next_turn_needs(backend: str) -> None:
    page = 4
    old, new = list(range(100, 100 + 3 * page)) + [0], [7] * page + [0]
    pages, expected = TLRU_CASES[backend]
    for policy, hits in expected.items():
        cache = checked(backend, 16 * page, page, eviction_policy=policy)
        if policy == "tlru":
            target = cache.cache.tree.policy if backend == "radix" else cache.block_pool.eviction.policy
            target.slack = page
        run_to_completion(cache, Request("old", old))
        run_to_completion(cache, Request("new", new))
        for _ in range(pages):
            cache.evict(page)
        cache.check_invariants()
        got = (cache.lookup(Request("o", old)).tokens, cache.lookup(Request("n", new)).tokens)
        assert got == hits, policy


# ------------------------------------------------------------------ workload-aware
def test_workload_aware_learns_reuse_per_category_and_its_order_moves_with_time() -> None:
    """Category (1 holder, priority 0) sees one reuse, after 10; category (2 holders) none.
    A fixed-key policy would keep one order; wa's flips as the entries age."""
    wa = WorkloadAware()
    for t in (0.0, 100.0):  # two one-holder entries; the first is reused 10 later
        wa.priority(Entry(last_access_time=t))
    reused = Entry(last_access_time=0.0)
    wa.priority(reused)
    reused.hit_count, reused.last_access_time = 2, 10.0
    wa.priority(reused)  # seen again: a reuse of category (1, 0) after 10
    assert wa.reuses == {(1, 0): 1.0} and wa.gap_sum == {(1, 0): 10.0}
    assert wa.touches == {(1, 0): 3.0, (2, 0): 1.0}
    young = Entry(last_access_time=100.0)  # one holder: p = (1+1)/(4+2), decays with gap 10
    wa.priority(young)
    cold = Entry(hit_count=2, last_access_time=100.0)  # two holders: p = 1/4, gap 10 (all's)
    wa.priority(cold)
    heads = {(1, 0): young, (2, 0): cold}
    assert wa.choose(heads, heads) == (2, 0)  # same age: the less likely category goes
    assert (wa.value(young), wa.value(cold)) == pytest.approx((1 / 3, 1 / 4))
    cold.last_access_time = 105.0  # now cold is fresher: 1/4 beats 1/3 * exp(-5/10)
    wa.now = 105.0
    assert wa.value(young) == pytest.approx(np.exp(-0.5) / 3)
    assert wa.choose(heads, heads) == (1, 0)


def test_capacity_policies_get_the_pool_size_in_both_backends() -> None:
    assert make_cache("radix", CacheConfig(64, 4), eviction_policy="arc").tree.policy.capacity == 16
    pool = make_cache("hashchain", CacheConfig(64, 4), eviction_policy="arc").block_pool
    assert isinstance(pool.eviction, RankedEviction)
    assert pool.eviction.policy.capacity == pool.num_gpu_blocks - 1
