"""REFERENCE A5: several attention groups (hybrid models), one block list per group per request.

vLLM: ``kv_cache_coordinator.py`` (HybridKVCacheCoordinator.find_longest_cache_hit) and
``single_type_kv_cache_manager.py`` (FullAttentionManager, SlidingWindowManager).
"""

from __future__ import annotations

import random
from typing import Any

import pytest
from prefixcache.backends.hashchain.hashing import BlockHash, RequestHashes, get_hash_fn
from prefixcache.backends.hashchain.kv_cache_coordinator import (
    HybridKVCacheCoordinator,
    UnitaryKVCacheCoordinator,
)
from prefixcache.backends.hashchain.kv_cache_manager import KVCacheManager
from prefixcache.backends.hashchain.single_type_kv_cache_manager import (
    AttentionGroupSpec,
    FullAttentionManager,
)

from prefixcache import Request
from prefixcache.invariants import InvariantError
from tests.helpers import DIRECT_REQUEST, checked, keyed, run_to_completion, tokens

B = 4
FULL = AttentionGroupSpec("full")


def sw(window: int) -> AttentionGroupSpec:
    return AttentionGroupSpec("sliding_window", window)


def hybrid(*groups: AttentionGroupSpec, num_blocks: int = 64) -> KVCacheManager:
    return KVCacheManager(num_blocks, B, get_hash_fn("sha256"), list(groups))


def fake_hashes(n: int) -> list[BlockHash]:
    return [BlockHash(bytes([i]) * 32) for i in range(n)]


def record(hashes: list[BlockHash]) -> RequestHashes:
    """A request's hasher record holding exactly these block hashes."""
    r = RequestHashes()
    r.hashes.extend(hashes)
    return r


def hit_of(manager: KVCacheManager, hashes: list[BlockHash], max_length: int) -> tuple[Any, int]:
    return manager.coordinator.find_longest_cache_hit(record(hashes), max_length)


def cache_at(manager: KVCacheManager, hashes: list[BlockHash], group_id: int, cached: set[int]) -> None:
    """Register one fresh block per index in ``cached`` under ``hashes[i]`` for ``group_id``."""
    pool = manager.block_pool
    for i in sorted(cached):
        blocks = [pool.null_block] * i + pool.get_new_blocks(1)
        pool.cache_full_blocks(DIRECT_REQUEST, keyed(hashes, group_id), blocks, i, i + 1)


def accepted(manager: KVCacheManager, hashes: list[BlockHash], group_id: int, length: int) -> bool:
    """Brute force: would this group use a hit of exactly ``length`` tokens?"""
    _, hit = manager.coordinator.single_type_managers[group_id].find_longest_cache_hit(
        record(hashes), length, [group_id]
    )
    return hit == length


def ids(blocks: list[Any]) -> list[int]:
    return [b.block_id for b in blocks]


# ---------------------------------------------------------------- single-type lookups
def test_full_group_stops_at_the_first_miss_even_if_later_blocks_are_cached() -> None:
    m = hybrid(FULL)
    h = fake_hashes(6)
    cache_at(m, h, 0, {0, 1, 3, 4, 5})
    (blocks,), hit = hit_of(m, h, 6 * B)
    assert hit == 2 * B and len(blocks) == 2


def test_sliding_window_finds_the_rightmost_run_of_cdiv_window_minus_1_blocks_and_pads_with_nulls() -> None:
    m = hybrid(sw(8))  # cdiv(8 - 1, 4) = 2 contiguous blocks
    h = fake_hashes(6)
    cache_at(m, h, 0, {0, 2, 3, 5})  # from the right: 5 alone, 4 misses, then 3 and 2
    (blocks,), hit = hit_of(m, h, 6 * B)
    null = m.block_pool.null_block
    assert hit == 4 * B
    assert blocks[:2] == [null, null] and not any(b.is_null for b in blocks[2:])
    assert len(blocks) == 4  # the stale hit at 5 is trimmed


def test_sliding_window_needs_a_longer_run_for_a_longer_window() -> None:
    m = hybrid(sw(9))  # cdiv(9 - 1, 4) = 2
    m2 = hybrid(sw(10))  # cdiv(10 - 1, 4) = 3
    h = fake_hashes(5)
    for mm in (m, m2):
        cache_at(mm, h, 0, {0, 2, 3})
    assert hit_of(m, h, 5 * B)[1] == 4 * B
    assert hit_of(m2, h, 5 * B)[1] == 1 * B  # no run of 3: only [0, 1) from the start


def test_sliding_window_run_from_block_0_shorter_than_the_window_is_a_hit() -> None:
    m = hybrid(sw(12))  # 3 contiguous blocks
    h = fake_hashes(4)
    cache_at(m, h, 0, {0, 1, 3})
    (blocks,), hit = hit_of(m, h, 4 * B)
    assert hit == 2 * B and not any(b.is_null for b in blocks)


# ---------------------------------------------------------------- the fixed point
def test_fixed_point_shrinks_full_attention_to_what_the_sliding_window_accepts() -> None:
    m = hybrid(FULL, sw(8))
    h = fake_hashes(6)
    cache_at(m, h, 0, {0, 1, 2, 3, 4})
    cache_at(m, h, 1, {0, 1, 2, 4})  # window run ending at 5 blocks is broken at block 3
    (full, window), hit = hit_of(m, h, 5 * B + 3)
    assert hit == 3 * B
    assert len(full) == 3 and len(window) == 3 and window[0].is_null


@pytest.mark.parametrize("seed", range(40))
def test_fixed_point_converges_to_the_largest_length_every_group_accepts(seed: int) -> None:
    rng = random.Random(seed)
    groups = [FULL, sw(rng.choice([2, 5, 8, 9, 13])), sw(rng.choice([4, 6, 12, 17]))]
    rng.shuffle(groups)
    m = hybrid(*groups, num_blocks=128)
    n = 10
    h = fake_hashes(n)
    for g in range(len(groups)):
        cache_at(m, h, g, {i for i in range(n) if rng.random() < 0.75})
    cap = rng.randrange(1, n * B + 1)
    blocks, hit = hit_of(m, h, cap)
    best = max(L for L in range(0, cap + 1, B) if all(accepted(m, h, g, L) for g in range(len(groups))))
    assert hit == best
    assert all(len(group_blocks) == hit // B for group_blocks in blocks)


def test_groups_of_equal_spec_are_looked_up_jointly() -> None:
    m = hybrid(sw(8), sw(8))
    h = fake_hashes(4)
    cache_at(m, h, 0, {0, 1, 2, 3})
    cache_at(m, h, 1, {0, 1, 3})  # group 1 breaks every run of 2 that reaches block 3
    blocks, hit = hit_of(m, h, 4 * B)
    assert hit == 2 * B and len(blocks[0]) == len(blocks[1]) == 2


# ---------------------------------------------------------------- through the PrefixCache contract
def hybrid_cache(num_blocks: int = 32, groups: Any = (("full",), ("sliding_window", 8))) -> Any:
    # Dense retention (None): these tests predate vLLM's sparse retention. Under vLLM 0.33's
    # engine default (0, our default too) a window hashes only its replay-boundary tail, so
    # e.g. test_a_hit_needs_every_group would hit 12, not 16 (tests/test_hashchain_hybrid*.py).
    return checked(
        "hashchain", num_blocks * B, B, attention_groups=list(groups), prefix_cache_retention_interval=None
    )


def test_a_hit_needs_every_group() -> None:
    cache = hybrid_cache()
    prompt = tokens(16)
    a = Request("A", prompt)
    assert cache.allocate(a, 16)
    window_ids = cache.page_tables(a)[1]
    a.num_computed_tokens = 16
    cache.commit(a)
    cache.release(a)
    assert cache.lookup(Request("B", prompt + tokens(4, seed=1))).tokens == 16
    cache.evict_blocks(set(window_ids))  # the full-attention group still has every block
    assert cache.lookup(Request("C", prompt + tokens(4, seed=1))).tokens == 0


def test_hybrid_request_holds_one_block_list_per_group_from_one_shared_pool() -> None:
    cache = hybrid_cache(32)
    a = Request("A", tokens(16))
    assert cache.allocate(a, 16)
    full, window = cache.page_tables(a)
    assert cache.page_table(a) == full == [1, 2, 3, 4]
    assert window == [5, 6, 7, 8]  # group 1 allocates after group 0
    assert cache.usage().in_use == 8


def test_sliding_window_hit_is_padded_with_null_blocks_in_the_page_table() -> None:
    cache = hybrid_cache(32)
    prompt = tokens(16)
    run_to_completion(cache, Request("A", prompt))
    b = Request("B", prompt + tokens(4, seed=2))
    assert cache.allocate(b, 4)
    assert b.num_computed_tokens == 16
    full, window = cache.page_tables(b)
    # next token 16 reads [9, 16]: blocks 0 and 1 are out of the window, never touched
    assert window[:2] == [0, 0] and 0 not in window[2:] and 0 not in full
    assert len(full) == len(window) == 5


def test_sliding_window_frees_blocks_that_leave_the_window_during_decode() -> None:
    cache = hybrid_cache(32)
    a = Request("A", tokens(8))
    assert cache.allocate(a, 8)
    a.num_computed_tokens = 8
    first_window_blocks = cache.page_tables(a)[1][:1]
    for t in range(8):
        a.append_output_token_ids(t)
        assert cache.allocate(a, 1)
        a.num_computed_tokens += 1
    _, window = cache.page_tables(a)
    assert window[:2] == [0, 0]  # 16 computed: the next token reads [9, 16]
    pool = cache.cache.block_pool
    assert [pool.blocks[i].ref_cnt for i in first_window_blocks] == [0]


def test_failed_hybrid_allocate_changes_nothing_in_any_group() -> None:
    cache = hybrid_cache(9)  # 8 usable blocks
    a = Request("A", tokens(12))
    assert cache.allocate(a, 12)  # 3 + 3 blocks
    b = Request("B", tokens(8, seed=3))
    before = (cache.usage(), cache.page_tables(a), [x.ref_cnt for x in cache.cache.block_pool.blocks])
    assert not cache.allocate(b, 8)  # needs 2 + 2
    after = (cache.usage(), cache.page_tables(a), [x.ref_cnt for x in cache.cache.block_pool.blocks])
    assert before == after and not cache.is_live(b)


def test_request_that_cannot_fit_in_any_group_layout_is_a_value_error() -> None:
    cache = hybrid_cache(9, groups=(("full",), ("full",)))  # 8 usable blocks, 2 per token block
    with pytest.raises(ValueError, match="attention groups"):
        cache.allocate(Request("A", tokens(20)), 20)


def test_check_invariants_covers_every_group() -> None:
    cache = hybrid_cache(32)
    a = Request("A", tokens(16))
    assert cache.allocate(a, 16)
    window_manager = cache.cache.manager.coordinator.single_type_managers[1]
    window_manager.req_to_blocks["A"].append(cache.cache.block_pool.blocks[20])
    with pytest.raises(InvariantError):
        cache.cache.check_invariants()
    window_manager.req_to_blocks["A"].pop()
    window_manager.req_to_blocks["A"].insert(2, cache.cache.block_pool.null_block)
    with pytest.raises(InvariantError, match="null"):
        cache.cache.check_invariants()


# ---------------------------------------------------------------- the single-group default
def test_default_is_one_full_attention_group_on_the_unitary_manager() -> None:
    for options in ({}, {"attention_groups": [("full",)]}):
        cache = checked("hashchain", 16 * B, B, **options)
        coordinator = cache.cache.manager.coordinator
        assert type(coordinator) is UnitaryKVCacheCoordinator
        assert [type(m) for m in coordinator.single_type_managers] == [FullAttentionManager]


@pytest.mark.parametrize("seed", range(6))
def test_hybrid_coordinator_with_one_full_group_matches_the_unitary_block_for_block(seed: int) -> None:
    rng = random.Random(seed)
    unitary = KVCacheManager(24, B, get_hash_fn("sha256"))
    one_group = KVCacheManager(24, B, get_hash_fn("sha256"))
    one_group.coordinator = HybridKVCacheCoordinator([FULL], one_group.block_pool, B)
    live: list[tuple[Request, Request]] = []
    prefixes = [tokens(12, seed=s) for s in range(3)]
    for step in range(60):
        if live and rng.random() < 0.4:
            r1, r2 = live.pop(rng.randrange(len(live)))
            unitary.free(r1)
            one_group.free(r2)
        else:
            toks = rng.choice(prefixes)[: rng.randrange(1, 13)] + tokens(rng.randrange(1, 9), seed=100 + step)
            r1, r2 = Request(f"r{step}", toks), Request(f"r{step}", toks)
            blocks1, hit1 = unitary.get_computed_blocks(r1)
            (blocks2,), hit2 = one_group.get_computed_blocks(r2)
            assert hit1 == hit2 and ids(blocks1[0]) == ids(blocks2)
            got1 = unitary.allocate_slots(r1, len(toks) - hit1, hit1, blocks1)
            got2 = one_group.allocate_slots(r2, len(toks) - hit2, hit2, (blocks2,))
            assert (got1 is None) == (got2 is None)
            if got1 is not None and got2 is not None:
                assert ids(got1[0]) == ids(got2[0])
                live.append((r1, r2))
        free1 = ids(unitary.block_pool.free_block_queue.get_all_free_blocks())
        free2 = ids(one_group.block_pool.free_block_queue.get_all_free_blocks())
        assert free1 == free2


@pytest.mark.parametrize(
    "groups",
    [[], [("mamba",)], [("full", 4)], [("sliding_window",)], [("sliding_window", 0)], ["full"]],
)
def test_bad_attention_groups_are_a_value_error(groups: Any) -> None:
    with pytest.raises(ValueError):
        checked("hashchain", 16 * B, B, attention_groups=groups)


@pytest.mark.parametrize("seed", range(8))
def test_random_hybrid_workload_keeps_every_invariant(seed: int) -> None:
    """Prefill in chunks, decode, preempt and finish at random; Checked runs check_invariants."""
    rng = random.Random(seed)
    cache = hybrid_cache(24, groups=(("full",), ("sliding_window", rng.choice([3, 8, 13]))))
    live: list[Request] = []
    prefixes = [tokens(16, seed=s) for s in range(3)]
    for step in range(120):
        if live and rng.random() < 0.6:
            r = rng.choice(live)
            if r.num_computed_tokens < r.num_tokens:
                n = min(rng.randrange(1, 9), r.num_tokens - r.num_computed_tokens)
            else:
                r.append_output_token_ids(rng.randrange(50))
                n = 1
            if cache.allocate(r, n):
                r.num_computed_tokens += n
                cache.commit(r)
            elif rng.random() < 0.5 or r.num_computed_tokens >= 30:
                cache.release(r)
                live.remove(r)
        else:
            r = Request(f"r{step}", rng.choice(prefixes)[: rng.randrange(1, 17)] + tokens(3, seed=step))
            hit = cache.lookup(r).tokens
            if cache.allocate(r, min(rng.randrange(1, 9), r.num_tokens - hit)):
                assert r.num_computed_tokens == hit
                live.append(r)
        for r in list(live):
            if r.num_tokens >= 40:
                cache.release(r)
                live.remove(r)
