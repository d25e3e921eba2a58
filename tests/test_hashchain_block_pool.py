"""REFERENCE A3: BlockHashToBlockMap and BlockPool (null block, lazy eviction, free order)."""

from __future__ import annotations

import pytest
from prefixcache.backends.hashchain.block import KVCacheBlock
from prefixcache.backends.hashchain.block_pool import BlockHashToBlockMap, BlockPool
from prefixcache.backends.hashchain.hashing import BlockHash, make_block_hash_with_group_id

from prefixcache import CacheConfig, Request, make_cache
from prefixcache.invariants import InvariantError
from tests.helpers import DIRECT_REQUEST, keyed


def h(i: int) -> BlockHash:
    return BlockHash(i.to_bytes(32, "big"))


def key(i: int, group: int = 0) -> bytes:
    return make_block_hash_with_group_id(h(i), group)


def free_ids(pool: BlockPool) -> list[int]:
    return [b.block_id for b in pool.free_block_queue.get_all_free_blocks()]


def cached_pool(n: int = 8, chain: int = 3) -> tuple[BlockPool, list[KVCacheBlock]]:
    """A pool with one request's ``chain`` blocks allocated and cached under h(0..chain-1)."""
    pool = BlockPool(n)
    blocks = pool.get_new_blocks(chain)
    pool.cache_full_blocks(DIRECT_REQUEST, keyed([h(i) for i in range(chain)], 0), blocks, 0, chain)
    pool.check_invariants()
    return pool, blocks


def test_map_keeps_several_blocks_per_hash_returns_the_first_and_pops_only_the_named_one() -> None:
    m = BlockHashToBlockMap()
    a, b, c = KVCacheBlock(1), KVCacheBlock(2), KVCacheBlock(3)
    for block in (a, b, c):
        m.insert(key(7), block)
    assert m.get_one_block(key(7)) is a
    assert m.pop(key(7), 9) is None
    assert m.pop(key(7), 1) is a
    assert m.get_one_block(key(7)) is b
    assert m.pop(key(7), 3) is c and m.pop(key(7), 2) is b
    assert m.get_one_block(key(7)) is None and len(m) == 0


def test_null_block_zero_is_popped_at_start_never_free_and_not_counted() -> None:
    pool = BlockPool(6)
    assert pool.null_block.block_id == 0 and pool.null_block.is_null
    assert free_ids(pool) == [1, 2, 3, 4, 5] and pool.get_num_free_blocks() == 5
    pool.free_blocks([pool.null_block])  # never enters the queue, never goes negative
    assert free_ids(pool) == [1, 2, 3, 4, 5]
    pool.cache_full_blocks(DIRECT_REQUEST, keyed([h(0)], 0), [pool.null_block], 0, 1)  # skipped, not hashed
    assert pool.null_block.block_hash is None
    pool.check_invariants()


def get_cached(pool: BlockPool, block_hash: BlockHash, group_ids: list[int]) -> list[KVCacheBlock] | None:
    return pool.get_cached_block([make_block_hash_with_group_id(block_hash, g) for g in group_ids])


def test_get_cached_block_hits_only_if_every_group_hits() -> None:
    pool = BlockPool(6)
    b0, b1 = pool.get_new_blocks(2)
    pool.cache_full_blocks(DIRECT_REQUEST, keyed([h(5)], 0), [b0], 0, 1)
    pool.cache_full_blocks(DIRECT_REQUEST, keyed([h(5)], 1), [b1], 0, 1)
    assert get_cached(pool, h(5), [0, 1]) == [b0, b1]
    assert get_cached(pool, h(5), [0, 2]) is None
    assert get_cached(pool, h(6), [0]) is None


def test_cache_full_blocks_allows_duplicates_under_one_hash() -> None:
    pool = BlockPool(6)
    first, second = pool.get_new_blocks(2)
    pool.cache_full_blocks(DIRECT_REQUEST, keyed([h(1)], 0), [first], 0, 1)
    pool.cache_full_blocks(DIRECT_REQUEST, keyed([h(1)], 0), [second], 0, 1)
    assert get_cached(pool, h(1), [0]) == [first]
    assert first.block_hash == second.block_hash == key(1)
    pool.check_invariants()


def test_get_new_blocks_refuses_more_than_free() -> None:
    pool = BlockPool(4)
    with pytest.raises(ValueError, match="cannot get 4 free blocks"):
        pool.get_new_blocks(4)
    assert pool.get_num_free_blocks() == 3


def test_freed_cached_block_stays_a_hit_until_popped_then_loses_its_hash() -> None:
    pool, blocks = cached_pool(n=5, chain=3)  # 4 usable: blocks 1..3 cached, 4 free
    pool.free_blocks(reversed(blocks))
    assert free_ids(pool) == [4, 3, 2, 1]
    assert get_cached(pool, h(2), [0]) == [blocks[2]]  # lazy: still a hit
    assert pool.num_cached_free_blocks == 3
    (fresh,) = pool.get_new_blocks(1)
    assert fresh.block_id == 4 and pool.num_evicted_blocks == 0  # unhashed first
    (reused,) = pool.get_new_blocks(1)
    assert reused is blocks[2] and reused.block_hash is None  # the chain's tail goes first
    assert get_cached(pool, h(2), [0]) is None and get_cached(pool, h(1), [0]) is not None
    assert pool.num_evicted_blocks == 1
    pool.check_invariants()


def test_touch_removes_an_unreferenced_block_from_the_free_queue_and_counts_the_reference() -> None:
    pool, blocks = cached_pool(n=6, chain=2)
    pool.free_blocks(reversed(blocks))
    assert blocks[0].ref_cnt == 0 and blocks[0].block_id in free_ids(pool)
    pool.touch([blocks[0]])
    assert blocks[0].ref_cnt == 1 and blocks[0].block_id not in free_ids(pool)
    pool.touch([blocks[0]])  # already referenced: only the count moves
    assert blocks[0].ref_cnt == 2
    pool.check_invariants()


def test_free_blocks_prepends_unhashed_and_appends_hashed_each_in_the_given_order() -> None:
    pool = BlockPool(8)
    blocks = pool.get_new_blocks(6)  # ids 1..6; 7 stays free
    pool.cache_full_blocks(DIRECT_REQUEST, keyed([h(i) for i in range(3)], 0), blocks, 0, 3)  # 1, 2, 3 hashed
    pool.free_blocks([blocks[4], blocks[0], blocks[3], blocks[2], blocks[5], blocks[1]])
    assert free_ids(pool) == [5, 4, 6, 7, 1, 3, 2]
    pool.check_invariants()


def test_unhashed_first_off_appends_every_freed_block_in_the_given_order() -> None:
    pool = BlockPool(8, unhashed_first=False)
    blocks = pool.get_new_blocks(6)
    pool.cache_full_blocks(DIRECT_REQUEST, keyed([h(i) for i in range(3)], 0), blocks, 0, 3)
    pool.free_blocks([blocks[4], blocks[0], blocks[3], blocks[2], blocks[5], blocks[1]])
    assert free_ids(pool) == [7, 5, 1, 4, 3, 6, 2]
    pool.check_invariants()


def test_freeing_a_block_with_no_reference_is_refused_and_changes_nothing() -> None:
    pool, blocks = cached_pool(n=6, chain=2)
    pool.free_blocks([blocks[1]])
    with pytest.raises(ValueError, match="ref_cnt is 0"):
        pool.free_blocks([blocks[0], blocks[1]])
    assert blocks[0].ref_cnt == 1
    pool.check_invariants()


def test_evict_blocks_drops_hashes_only_and_in_use_blocks_stay_in_use() -> None:
    pool, blocks = cached_pool(n=6, chain=3)
    pool.free_blocks([blocks[2]])
    assert pool.evict_blocks({blocks[1].block_id, blocks[2].block_id, 5}) == 2  # 5 had no hash
    assert blocks[1].ref_cnt == 1 and blocks[1].block_hash is None
    assert blocks[2].block_id in free_ids(pool) and blocks[2].block_hash is None
    assert get_cached(pool, h(0), [0]) == [blocks[0]]
    assert pool.num_cached_free_blocks == 0 and pool.num_evicted_blocks == 2
    with pytest.raises(ValueError, match="outside"):
        pool.evict_blocks({99})
    pool.check_invariants()


def test_evict_lru_blocks_drops_hashes_from_the_head_of_the_free_queue() -> None:
    pool, blocks = cached_pool(n=8, chain=3)
    pool.free_blocks(reversed(blocks))  # queue: 4 5 6 7 | 3 2 1
    assert pool.evict_lru_blocks(2) == 2
    assert [b.block_hash is None for b in blocks] == [False, True, True]
    assert free_ids(pool) == [4, 5, 6, 7, 3, 2, 1]  # they stay where they were, now unhashed
    assert pool.evict_lru_blocks(5) == 1
    pool.check_invariants()


def test_reset_prefix_cache_is_refused_while_a_block_is_in_use_then_drops_every_hash() -> None:
    pool, blocks = cached_pool(n=6, chain=2)
    assert pool.reset_prefix_cache() is False
    assert blocks[0].block_hash == key(0) and get_cached(pool, h(1), [0]) == [blocks[1]]
    pool.free_blocks(blocks)
    assert pool.reset_prefix_cache() is True
    assert all(b.block_hash is None for b in pool.blocks) and len(pool.cached_block_hash_to_block) == 0
    assert pool.num_cached_free_blocks == 0
    pool.check_invariants()


def test_check_invariants_catches_a_hash_missing_from_the_map() -> None:
    pool, blocks = cached_pool(n=6, chain=2)
    pool.cached_block_hash_to_block.pop(key(1), blocks[1].block_id)
    with pytest.raises(InvariantError, match="not in the map"):
        pool.check_invariants()


def test_check_invariants_catches_a_broken_free_queue_link() -> None:
    pool, _ = cached_pool(n=8, chain=2)
    last = pool.free_block_queue.fake_free_list_tail.prev_free_block  # a freed block, linked alone
    assert last is not None and last.prev_free_block is not None
    last.prev_free_block = pool.blocks[3]
    with pytest.raises(InvariantError, match="back link|backward"):
        pool.check_invariants()


def test_check_invariants_catches_a_referenced_block_in_the_free_queue() -> None:
    pool = BlockPool(6)
    pool.blocks[2].ref_cnt = 1
    with pytest.raises(InvariantError, match="in free queue True"):
        pool.check_invariants()


@pytest.mark.parametrize("miss_at", [0, 1, 15, 16, 17, 47, 48, 100, 200])
def test_longest_prefix_equals_get_one_block_up_to_the_first_miss(miss_at: int) -> None:
    """The chunked C-level scan returns what the per-key loop returns, duplicates included."""
    m = BlockHashToBlockMap()
    blocks = [KVCacheBlock(i) for i in range(1, 401)]
    keys = [key(i) for i in range(200)]
    for i, k in enumerate(keys):
        if i != miss_at:
            m.insert(k, blocks[i])
        if i % 7 == 3:  # a duplicate: lookups return the first inserted block
            m.insert(k, blocks[200 + i])
    expected: list[KVCacheBlock] = []
    for k in keys[:150]:
        b = m.get_one_block(k)
        if b is None:
            break
        expected.append(b)
    assert m.longest_prefix(keys, 150) == expected
    assert m.num_duplicated_keys == len([i for i in range(200) if i % 7 == 3 and i != miss_at])
    for i in range(200):  # popping duplicates back to one block keeps the counter exact
        if i % 7 == 3:
            m.pop(keys[i], blocks[200 + i].block_id)
    assert m.num_duplicated_keys == 0
    assert m.longest_prefix(keys, 150) == [m.get_one_block(k) for k in keys[: min(miss_at, 150)]]


def test_a_huge_pool_creates_blocks_only_as_they_are_used() -> None:
    """Issue 28, item 5: 10^8 tokens in blocks of 16 is 6.25M blocks; none but the null block
    exists before the first allocation, and allocating takes them in vLLM's order (ascending
    ids from the fresh run, then the freed ones where they were linked)."""
    cache = make_cache("hashchain", CacheConfig(10**8, 16))
    pool = cache.block_pool
    assert len(pool.blocks) == 10**8 // 16 and [b.block_id for b in pool.blocks.created()] == [0]
    a = Request("a", list(range(100)))
    assert cache.allocate(a, 100)
    assert cache.page_table(a) == list(range(1, 8)) and len(pool.blocks.created()) == 8
    cache.release(a)  # reversed: its last (unhashed, partial) block to the head, the rest at the tail
    b = Request("b", [7] * 40)
    assert cache.allocate(b, 40)
    assert cache.page_table(b) == [7, 8, 9]  # the unhashed freed block first, then the fresh run
    assert cache.usage().in_use == 3


def test_a_run_of_lazy_blocks_makes_only_the_missing_ones_and_keeps_every_made_one() -> None:
    """``LazyBlocks.run`` (the fresh run's hand-out): ids in order, a block made earlier is
    the same object, made blocks stay made, whether the range is wholly new or mixed."""
    from prefixcache.backends.hashchain.free_queue import LazyBlocks

    blocks = LazyBlocks(12)
    early = blocks[5]
    assert [b.block_id for b in blocks.run(8, 11)] == [8, 9, 10]  # none made yet
    mixed = blocks.run(3, 12)  # 5 and 8-10 made before
    assert [b.block_id for b in mixed] == list(range(3, 12)) and mixed[2] is early
    assert blocks.run(0, 12)[3:] == mixed and [b.block_id for b in blocks.created()] == list(range(12))
    assert blocks.run(12, 20) == [] and all(blocks[i] is mixed[i - 3] for i in range(3, 12))


@pytest.mark.parametrize("backend", ["hashchain", "radix", "none"])
def test_a_pool_too_large_to_allocate_is_a_clear_error(backend: str) -> None:
    with pytest.raises(ValueError, match="memory|GiB"):
        make_cache(backend, CacheConfig(10**15, 1))


def test_only_a_ranked_pool_makes_blocks_with_policy_fields_a_taken_hash_fails_before_any_change() -> None:
    """vLLM's LRU pool creates plain blocks (a block per token at page size 1 is millions); a
    ranked policy's pool creates blocks carrying what the policy keeps, sized to the block.
    Caching a range where one block already has a hash raises and hashes none of them."""
    from prefixcache.backends.hashchain.block import RankedKVCacheBlock
    from prefixcache.backends.hashchain.eviction import make_eviction_order

    lru, ranked = BlockPool(8), BlockPool(8, eviction=make_eviction_order("lfu", 7, 16))
    assert type(lru.get_new_blocks(1)[0]) is KVCacheBlock and not hasattr(lru.blocks[3], "hit_count")
    block = ranked.get_new_blocks(1)[0]
    assert type(block) is RankedKVCacheBlock and block.num_tokens == 16 and block.hit_count == 0
    blocks = lru.get_new_blocks(3)
    blocks[2].assign_hash(keyed([h(9)], 0)[0])
    with pytest.raises(ValueError, match="already has a hash"):
        lru.cache_full_blocks(DIRECT_REQUEST, keyed([h(i) for i in range(3)], 0), blocks, 0, 3)
    assert [b.block_hash for b in blocks[:2]] == [None, None] and len(lru.cached_block_hash_to_block) == 0
