"""REFERENCE A4 through the PrefixCache contract: the article's walkthrough, hits, allocation.

Block ids are what vLLM itself hands out from a fresh pool: block 0 is the null block, the
free queue starts ascending and allocation pops its head.
"""

from __future__ import annotations

from typing import Any

import pytest
from prefixcache.backends.hashchain.hashing import make_block_hash_with_group_id

from prefixcache import Request
from tests.helpers import checked, run_to_completion, tokens

B = 4


def hc(num_blocks: int = 16, **options: Any) -> Any:
    return checked("hashchain", num_blocks * B, B, **options)


def free_ids(cache: Any) -> list[int]:
    return [b.block_id for b in cache.cache.block_pool.free_block_queue.get_all_free_blocks()]


def refs(cache: Any, ids: list[int]) -> list[int]:
    return [cache.cache.block_pool.blocks[i].ref_cnt for i in ids]


def finish(cache: Any, req: Request) -> None:
    req.num_computed_tokens = req.num_tokens
    cache.commit(req)
    cache.release(req)


# ---------------------------------------------------------------- the article, section 六
def test_walkthrough_step0_a_prefills_into_blocks_1_to_4_and_frees_them_reversed_to_the_tail() -> None:
    cache = hc(16)  # usable blocks 1..15
    pool, hasher = cache.cache.block_pool, cache.cache.manager.hasher
    a = Request("A", tokens(16))
    assert cache.lookup(a).tokens == 0
    assert cache.allocate(a, 16)
    assert cache.page_table(a) == [1, 2, 3, 4]  # the article's 5/7/9/11 are illustrative
    h = hasher.block_hashes(a)
    for i, block_id in enumerate([1, 2, 3, 4]):  # cached at allocation: h0..h3
        assert pool.blocks[block_id].block_hash == make_block_hash_with_group_id(h[i], 0)
    finish(cache, a)
    assert refs(cache, [1, 2, 3, 4]) == [0, 0, 0, 0]
    assert free_ids(cache) == [*range(5, 16), 4, 3, 2, 1]  # h3 nearest the head: evicted first
    assert cache.usage() == (11, 4, 0)


def test_walkthrough_step1_b_hits_12_tokens_revives_blocks_1_to_3_and_gets_block_5() -> None:
    cache = hc(16)
    prompt = tokens(16)
    run_to_completion(cache, Request("A", prompt))
    b = Request("B", prompt[:12] + tokens(4, seed=20))
    assert cache.lookup(b).tokens == 12  # max_num_blocks = 15 // 4 = 3, all three hit
    assert cache.allocate(b, 4)
    assert b.num_computed_tokens == 12
    assert cache.page_table(b) == [1, 2, 3, 5]
    assert refs(cache, [1, 2, 3, 4, 5]) == [1, 1, 1, 0, 1]  # touch: 0 -> 1, out of the queue
    assert free_ids(cache) == [*range(6, 16), 4]
    hb = cache.cache.manager.hasher.block_hashes(b)
    assert cache.cache.block_pool.blocks[5].block_hash == make_block_hash_with_group_id(hb[3], 0)
    assert (cache.stats.queries, cache.stats.hits) == (32, 12)  # B alone: 12 of 16 = 75%
    finish(cache, b)
    assert free_ids(cache) == [*range(6, 16), 4, 5, 3, 2, 1]


def test_walkthrough_step2_a_and_b_share_blocks_while_both_run() -> None:
    cache = hc(16)
    prompt = tokens(16)
    a = Request("A", prompt)
    assert cache.allocate(a, 16)
    b = Request("B", prompt[:12] + tokens(4, seed=20))
    assert cache.lookup(b).tokens == 12  # A's blocks were cached when allocated, before any KV
    assert cache.allocate(b, 4)
    assert cache.page_table(a) == [1, 2, 3, 4] and cache.page_table(b) == [1, 2, 3, 5]
    assert refs(cache, [1, 2, 3, 4, 5]) == [2, 2, 2, 1, 1]
    assert cache.usage().in_use == 5
    finish(cache, a)  # either one finishing only drops the count back to 1
    assert refs(cache, [1, 2, 3, 4, 5]) == [1, 1, 1, 0, 1]
    assert free_ids(cache) == [*range(6, 16), 4]
    finish(cache, b)
    assert free_ids(cache) == [*range(6, 16), 4, 5, 3, 2, 1]


# ---------------------------------------------------------------- hits
def test_n_minus_1_cap_hits_k_minus_1_blocks_and_caches_the_recomputed_last_as_a_duplicate() -> None:
    cache = hc(16)
    prompt = tokens(3 * B)
    run_to_completion(cache, Request("a", prompt))  # blocks 1, 2, 3
    b = Request("b", prompt)
    assert cache.lookup(b).tokens == 2 * B  # 11 // 4 = 2 blocks, although all 3 are cached
    assert cache.allocate(b, B)
    assert cache.page_table(b) == [1, 2, 4]
    pool = cache.cache.block_pool
    assert pool.blocks[4].block_hash == pool.blocks[3].block_hash  # duplicate, same hash
    key = pool.blocks[3].block_hash
    assert pool.cached_block_hash_to_block.get_one_block(key) is pool.blocks[3]  # first inserted
    assert sorted(b.block_id for k, b in pool.cached_block_hash_to_block.items() if k == key) == [3, 4]


def test_partial_blocks_are_never_cached_and_never_hit() -> None:
    cache = hc(16)
    prompt = tokens(10)  # blocks 1, 2 full; block 3 holds 2 tokens
    run_to_completion(cache, Request("a", prompt))
    assert cache.cache.block_pool.blocks[3].block_hash is None
    assert free_ids(cache)[0] == 3  # unhashed: prepended, reused first
    assert cache.lookup(Request("b", prompt + tokens(6, seed=1))).tokens == 8


def test_lookup_stops_at_the_first_miss_even_if_later_blocks_are_cached() -> None:
    cache = hc(16)
    prompt = tokens(16)
    run_to_completion(cache, Request("a", prompt))  # blocks 1..4
    assert cache.evict_blocks({2}) == B
    assert cache.cache.block_pool.blocks[3].block_hash is not None  # still cached, unreachable
    assert cache.lookup(Request("b", prompt + [1])).tokens == B


def test_a_change_in_an_early_block_misses_every_later_block_through_the_chain() -> None:
    cache = hc(16)
    prompt = tokens(16)
    run_to_completion(cache, Request("a", prompt))
    other = list(prompt)
    other[5] += 1  # block 1 differs; blocks 2, 3 have equal tokens but another parent
    assert cache.lookup(Request("b", other + [1])).tokens == B


def test_concurrent_chunked_prefills_of_one_prompt_leave_duplicate_blocks_under_one_hash() -> None:
    cache = hc(16)
    prompt = tokens(16)
    a = Request("a", prompt)
    assert cache.allocate(a, 8)  # first chunk: blocks 1, 2
    b = Request("b", prompt)
    assert cache.lookup(b).tokens == 8
    assert cache.allocate(b, 8)
    assert cache.page_table(b) == [1, 2, 3, 4]
    a.num_computed_tokens = 8
    cache.commit(a)
    assert cache.allocate(a, 8)  # second chunk: its own blocks 5, 6, cached as duplicates
    assert cache.page_table(a) == [1, 2, 5, 6]  # block tables stay append-only: no dedup
    pool = cache.cache.block_pool
    assert pool.blocks[5].block_hash == pool.blocks[3].block_hash
    assert pool.blocks[6].block_hash == pool.blocks[4].block_hash
    (hit_blocks,), _ = cache.cache.manager.get_computed_blocks(Request("c", prompt + [9]))
    assert [b.block_id for b in hit_blocks] == [
        1,
        2,
        3,
        4,
    ]


def test_touch_revives_a_freed_cached_block_out_of_the_free_queue() -> None:
    cache = hc(8)
    prompt = tokens(8)
    run_to_completion(cache, Request("a", prompt))
    assert cache.usage() == (5, 2, 0) and 1 in free_ids(cache)
    b = Request("b", prompt + [3])
    assert cache.allocate(b, b.num_tokens - cache.lookup(b).tokens)
    assert 1 not in free_ids(cache) and 2 not in free_ids(cache)
    assert refs(cache, [1, 2]) == [1, 1] and cache.usage() == (4, 0, 3)


def test_output_tokens_are_cached_so_the_next_turn_hits_them() -> None:
    cache = hc(16)
    r = Request("turn1", tokens(6))
    assert cache.allocate(r, 6)
    for t in range(6):  # decode 6 tokens: blocks 1..3 become full
        r.num_computed_tokens = r.num_tokens
        cache.commit(r)
        r.append_output_token_ids(100 + t)
        assert cache.allocate(r, 1)
    finish(cache, r)
    assert cache.lookup(Request("turn2", list(r.all_token_ids) + tokens(3, seed=4))).tokens == 12


def test_each_block_is_hashed_once_across_lookups_allocations_and_decode() -> None:
    cache = hc(16)
    calls = []
    hasher = cache.cache.manager.hasher
    real = hasher.hash_fn
    hasher.hash_fn = lambda obj: calls.append(1) or real(obj)
    r = Request("r", tokens(5))
    for _ in range(3):
        cache.lookup(r)
    assert cache.allocate(r, 5)
    for t in range(11):
        r.num_computed_tokens = r.num_tokens
        cache.commit(r)
        r.append_output_token_ids(t)
        cache.lookup(r)
        assert cache.allocate(r, 1)
    assert r.num_tokens == 16 and len(calls) == 4


# ---------------------------------------------------------------- allocation
def test_allocate_short_of_room_returns_false_without_touching_the_hit_blocks() -> None:
    cache = hc(7)  # 6 usable
    run_to_completion(cache, Request("a", tokens(8) + [1]))  # 1, 2 cached; 3 partial
    other = Request("other", tokens(8, seed=50))
    assert cache.allocate(other, 8)  # takes 3, 4: free queue is now 5 6 2 1
    b = Request("b", tokens(8) + tokens(9, seed=3))  # 17 tokens: 5 blocks, 2 of them hits
    b.num_computed_tokens = 7  # stale value left by a caller: must survive the failure
    before = (free_ids(cache), refs(cache, list(range(1, 7))), cache.usage())
    assert before[0] == [5, 6, 2, 1]
    assert cache.lookup(b).tokens == 8
    assert not cache.allocate(b, 9)  # 3 new + 2 hits sitting in the free queue = 5 > 4 free
    assert (free_ids(cache), refs(cache, list(range(1, 7))), cache.usage()) == before
    assert b.num_computed_tokens == 7 and cache.stats.requests == 2


def test_hit_blocks_count_against_free_space_only_while_nobody_references_them() -> None:
    shared = tokens(8)
    cache = hc(7)  # 6 usable
    holder = Request("holder", shared + [7])
    assert cache.allocate(holder, 9)  # blocks 1, 2 (cached), 3; free: 4 5 6
    b = Request("b", shared + tokens(12, seed=3))  # 5 blocks: 2 hits already in use + 3 new
    assert cache.allocate(b, b.num_tokens - cache.lookup(b).tokens)
    assert cache.page_table(b) == [1, 2, 4, 5, 6]
    cache.release(b)
    cache.release(holder)
    other = Request("other", tokens(8, seed=50))
    assert cache.allocate(other, 8)  # 4 free left, the two hits among them
    b = Request("b2", shared + tokens(9, seed=5))  # 5 blocks: 2 unreferenced hits + 3 new
    assert cache.lookup(b).tokens == 8
    assert not cache.allocate(b, b.num_tokens - cache.lookup(b).tokens)
    b = Request("b3", shared + tokens(8, seed=6))  # 4 blocks: 2 + 2 fits exactly
    assert cache.allocate(b, b.num_tokens - cache.lookup(b).tokens)
    assert cache.usage().free == 0 and cache.usage().evictable == 0


def test_identical_prompt_admitted_in_the_same_step_already_hits() -> None:
    cache = hc(16)
    prompt = tokens(13)
    a = Request("a", prompt)
    assert cache.allocate(a, 13)  # nothing computed or committed yet
    b = Request("b", prompt)
    assert cache.lookup(b).tokens == 12
    assert cache.allocate(b, 1)
    assert cache.page_table(b)[:3] == cache.page_table(a)[:3]


def test_stats_count_each_admission_once_and_lookups_and_extensions_not_at_all() -> None:
    cache = hc(16)
    prompt = tokens(12)
    run_to_completion(cache, Request("a", prompt))
    b = Request("b", prompt + [5, 6])
    for _ in range(3):
        cache.lookup(b)
    assert cache.allocate(b, 2)
    b.num_computed_tokens = b.num_tokens
    b.append_output_token_ids(9)
    assert cache.allocate(b, 1)
    s = cache.stats
    assert (s.requests, s.queries, s.hits) == (2, 12 + 14, 12)
    assert s.preempted_requests == 0


def test_common_prefix_blocks_are_the_leading_blocks_every_running_request_references() -> None:
    cache = hc(32)
    shared = tokens(8)
    reqs = [Request(f"r{i}", shared + tokens(6, seed=i + 1)) for i in range(3)]
    for r in reqs:
        assert cache.allocate(r, r.num_tokens - cache.lookup(r).tokens)
    assert [cache.get_num_common_prefix_blocks(r) for r in reqs] == [2, 2, 2]
    stranger = Request("s", tokens(6, seed=99))
    assert cache.allocate(stranger, 6)
    assert cache.get_num_common_prefix_blocks(reqs[0]) == 0
    cache.release(stranger)
    cache.release(reqs[2])
    assert cache.get_num_common_prefix_blocks(reqs[0]) == 2


# ---------------------------------------------------------------- namespaces
@pytest.mark.parametrize(
    "first, second",
    [
        ({"cache_salt": "s1"}, {"cache_salt": "s2"}),
        ({"cache_salt": "s1"}, {}),
        ({"lora_name": "l1"}, {"lora_name": "l2"}),
        ({}, {"lora_name": "l1"}),
        ({"lora_name": "x"}, {"cache_salt": "x"}),
        ({"mm_hashes": [("img1", 0, 6)]}, {"mm_hashes": [("img2", 0, 6)]}),
        ({"mm_hashes": [("img1", 0, 6)]}, {"mm_hashes": [("img1", 1, 5)]}),
    ],
    ids=["salt", "salt-vs-none", "lora", "none-vs-lora", "lora-vs-salt-same-string", "mm-id", "mm-offset"],
)
def test_salt_lora_and_multimodal_namespaces_isolate_equal_tokens(first: dict, second: dict) -> None:
    cache = hc(16)
    prompt = tokens(13)
    run_to_completion(cache, Request("a", prompt, **first))
    assert cache.lookup(Request("b", prompt, **second)).tokens == 0
    assert cache.lookup(Request("c", prompt, **first)).tokens == 12
