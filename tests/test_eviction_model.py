"""The block-model eviction replay (analysis/eviction_model.py): its LRU is bounds' LRU, no
policy beats the offline optimum, ours is online (a trace's prefix replays to the same hits),
and unknown names are clear errors."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prefixcache.experiments.analysis import bounds, eviction_model

from prefixcache.eviction import POLICIES, LearnedReuse

ALL = [*POLICIES, *eviction_model.MODEL_POLICIES]


def random_trace(seed: int, n: int = 60, page: int = 2) -> tuple[bounds.BlockTrace, list[int], list[int]]:
    """Requests that extend or branch off earlier ones (conversations over a few shared heads)."""
    rng = random.Random(seed)
    prompts: list[list[int]] = []
    for _ in range(n):
        base = rng.choice(prompts) if prompts and rng.random() < 0.7 else [rng.randrange(3)] * page
        suffix = [rng.randrange(4) for _ in range(rng.randrange(1, 9))]
        prompts.append(base[: rng.randrange(len(base) + 1)] + suffix)
    outputs = [rng.randrange(400) for _ in prompts]
    return bounds.block_trace(prompts, page), [len(p) for p in prompts], outputs


@given(seed=st.integers(0, 10_000), capacity=st.integers(1, 40))
def test_model_lru_is_bounds_lru(seed: int, capacity: int) -> None:
    trace, _, _ = random_trace(seed)
    assert eviction_model.policy_hits(trace, capacity, "lru") == bounds.lru_hits(trace, capacity)


@given(seed=st.integers(0, 10_000), capacity=st.integers(1, 40), policy=st.sampled_from(ALL))
def test_no_policy_beats_belady(seed: int, capacity: int, policy: str) -> None:
    trace, prompts, outputs = random_trace(seed)
    hits = eviction_model.policy_hits(trace, capacity, policy, prompts, outputs)
    assert sum(hits) <= sum(bounds.belady_hits(trace, capacity))
    assert all(0 <= h <= len(look) * trace.page_size for h, look in zip(hits, trace.lookups, strict=True))


@pytest.mark.parametrize("policy", [p for p in ALL if p != "reuse-oracle"])
def test_online_policies_see_no_future(policy: str) -> None:
    """Replaying the first half of a trace gives the first half of the whole trace's hits."""
    trace, prompts, outputs = random_trace(7, n=120)
    half = bounds.BlockTrace(trace.lookups[:60], trace.inserts[:60], trace.page_size)
    whole = eviction_model.policy_hits(trace, 12, policy, prompts, outputs)
    assert eviction_model.policy_hits(half, 12, policy, prompts[:60], outputs[:60]) == whole[:60]


def test_the_reuse_oracle_does_see_the_future() -> None:
    """The check above can fail: the offline oracle changes its first half when the second changes."""
    trace, prompts, outputs = random_trace(7, n=120)
    half = bounds.BlockTrace(trace.lookups[:60], trace.inserts[:60], trace.page_size)
    whole = eviction_model.policy_hits(trace, 12, "reuse-oracle", prompts, outputs)
    assert eviction_model.policy_hits(half, 12, "reuse-oracle", prompts[:60], outputs[:60]) != whole[:60]


def test_lrp_learns_a_higher_reuse_probability_for_the_class_that_is_reused() -> None:
    """Two classes touched equally often; one's entries are always hit again, the other's never."""

    class Entry:
        reuse_class: tuple = ()
        credited = False
        last_access_time = 0

    policy = LearnedReuse(capacity=4)
    reused, dead = (3, 0, 0), (0, 0, 0)
    for now in range(20):
        for cls in (reused, dead):
            policy.current = cls
            entry = Entry()
            policy.assign(entry)
            if cls == reused:
                policy.reused(entry, now)
                policy.reused(entry, now)  # a second hit of one touch is credited once
    assert policy.probability(reused) > 0.9 > 0.1 > policy.probability(dead)


def test_unknown_policy_is_a_clear_error() -> None:
    trace, _, _ = random_trace(0)
    with pytest.raises(ValueError, match="valid: lru"):
        eviction_model.policy_hits(trace, 4, "clock")


def test_model_tlru_keeps_the_blocks_a_next_turn_needs() -> None:
    """512-token blocks, tlru's default slack of 1024 tokens. A (4 blocks), then B, C, D (one
    each) through a 4-block cache, then A again. Each of B, C, D forces one eviction. LRU takes
    A's blocks from the end (a4, a3, a2). tlru takes a4 and a3 too: at most 1024 tokens end
    there. a2 has 1536 after its start, so tlru takes B's block instead."""
    page = 512
    a = list(range(4 * page + 1))
    singles = [[10**6 + i] * page + [0] for i in range(3)]
    trace = bounds.block_trace([a, *singles, a], page)
    lru = eviction_model.policy_hits(trace, 4, "lru")
    tlru = eviction_model.policy_hits(trace, 4, "tlru")
    assert (lru[-1], tlru[-1]) == (page, 2 * page)
