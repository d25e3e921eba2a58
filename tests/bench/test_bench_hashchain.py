"""Benchmarks (``make bench`` / ``pytest tests/bench``) of the hashchain hot-path optimisations,
each against the plain form it replaced, on the same input:

* the lookup walk over 2048 cached blocks: ``longest_prefix`` (dict probes in C, in doubling
  chunks) vs ``get_one_block`` per key;
* allocating 2048 blocks that each evict a cached block: ``evict_hashed`` (one C pop per
  block) vs an evict call per block;
* caching 2048 blocks: ``insert_many`` (one ``setdefault`` per block) vs ``insert`` per block;
* hashing a 2048-block chain with sha256: ``chain_block_hashes`` (pickle and digest called in
  its loop) vs ``hash_block_tokens`` per block;
* handing out 4096 never-used blocks: ``LazyBlocks.run`` (one ``map`` for a wholly new run) vs
  a block made per position in a Python loop.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import pytest
from prefixcache.backends.hashchain.block import KVCacheBlock
from prefixcache.backends.hashchain.block_pool import BlockHashToBlockMap, BlockPool
from prefixcache.backends.hashchain.free_queue import LazyBlocks
from prefixcache.backends.hashchain.hashing import (
    BlockHash,
    chain_block_hashes,
    hash_block_tokens,
    none_hash,
    sha256,
)

from prefixcache import CacheConfig, Request, make_cache
from tests.helpers import DIRECT_REQUEST, keyed

BLOCK = 16
NUM_BLOCKS = 2048
PROMPT = [(31 * i + 7) % 32_000 for i in range(NUM_BLOCKS * BLOCK)]


def cached_request() -> tuple[Any, Request]:
    cache = make_cache("hashchain", CacheConfig((NUM_BLOCKS + 8) * BLOCK, BLOCK))
    warm = Request("warm", PROMPT)
    assert cache.allocate(warm, warm.num_tokens)
    waiting = Request("waiting", PROMPT + [1])
    assert cache.lookup(waiting).tokens == NUM_BLOCKS * BLOCK  # hashes now memoised
    return cache, waiting


def walk_per_key(hash_map: BlockHashToBlockMap, keys: list[Any], limit: int) -> list[KVCacheBlock]:
    """vLLM's form: ``get_one_block`` per key, to the first miss."""
    out: list[KVCacheBlock] = []
    for key in keys[:limit]:
        block = hash_map.get_one_block(key)
        if block is None:
            break
        out.append(block)
    return out


@pytest.mark.parametrize("form", ["longest_prefix", "get_one_block per key"])
def test_bench_lookup_walk(benchmark, form: str) -> None:  # type: ignore[no-untyped-def]
    cache, waiting = cached_request()
    hash_map = cache.block_pool.cached_block_hash_to_block
    keys = cache.manager.hasher.request_hashes(waiting).keys(0)
    walk = hash_map.longest_prefix if form == "longest_prefix" else partial(walk_per_key, hash_map)
    benchmark.group = "lookup walk over 2048 cached blocks (hashes memoised)"
    assert len(benchmark(walk, keys, NUM_BLOCKS)) == NUM_BLOCKS


def full_pool_of_cached_free_blocks() -> Any:
    """A pool whose NUM_BLOCKS usable blocks are all free and all carry a hash."""
    pool = BlockPool(NUM_BLOCKS + 1)
    blocks = pool.get_new_blocks(NUM_BLOCKS)
    hashes = [BlockHash(i.to_bytes(32, "big")) for i in range(NUM_BLOCKS)]
    pool.cache_full_blocks(DIRECT_REQUEST, keyed(hashes, 0), blocks, 0, NUM_BLOCKS)
    pool.free_blocks(blocks)
    return pool


def per_block_get_new_blocks(pool: Any, n: int) -> list[KVCacheBlock]:
    """The replaced form, as it was: per popped block, an evict call that pops the key from
    the map (a get, then a del) and clears the hash."""
    cache = pool.cached_block_hash_to_block._cache

    def evict(block: KVCacheBlock) -> None:
        key = block.block_hash
        entry = cache.get(key)
        assert entry is block  # no duplicates here
        del cache[key]
        block.reset_hash()
        pool.num_evicted_blocks += 1

    blocks = pool.free_block_queue.popleft_n(n)
    for block in blocks:
        if block.block_hash is not None:
            pool.num_cached_free_blocks -= 1
            evict(block)
        block.ref_cnt += 1
    return blocks


def insert_per_block(hash_map: BlockHashToBlockMap, key: bytes, block: KVCacheBlock) -> None:
    """The replaced ``insert``, as it was (a get, then a set)."""
    cache = hash_map._cache
    entry = cache.get(key)  # type: ignore[call-overload]
    if entry is None:
        cache[key] = block  # type: ignore[index]
    else:
        raise AssertionError("no duplicates in this benchmark")


@pytest.mark.parametrize("form", ["evict_hashed", "call per block"])
def test_bench_allocating_blocks_that_evict(benchmark, form: str) -> None:  # type: ignore[no-untyped-def]
    def allocate(pool: Any) -> Any:
        if form == "evict_hashed":
            pool.get_new_blocks(NUM_BLOCKS)
        else:
            per_block_get_new_blocks(pool, NUM_BLOCKS)
        return pool

    benchmark.group = "allocate 2048 blocks, each evicting a cached one"
    pool = benchmark.pedantic(allocate, setup=lambda: ((full_pool_of_cached_free_blocks(),), {}), rounds=30)
    assert pool.num_evicted_blocks == NUM_BLOCKS and len(pool.cached_block_hash_to_block) == 0
    pool.check_invariants()


@pytest.mark.parametrize("form", ["insert_many", "insert per block"])
def test_bench_caching_blocks(benchmark, form: str) -> None:  # type: ignore[no-untyped-def]
    keys = [BlockHash(i.to_bytes(36, "big")) for i in range(NUM_BLOCKS)]
    blocks = [KVCacheBlock(i + 1) for i in range(NUM_BLOCKS)]

    def insert(hash_map: BlockHashToBlockMap) -> int:
        if form == "insert_many":
            hash_map.insert_many(keys, blocks)
        else:
            for key, block in zip(keys, blocks, strict=True):
                insert_per_block(hash_map, key, block)
        return len(hash_map)

    benchmark.group = "cache 2048 blocks in the hash map"
    assert benchmark.pedantic(insert, setup=lambda: ((BlockHashToBlockMap(),), {}), rounds=50) == NUM_BLOCKS


@pytest.mark.parametrize("form", ["extends_in_place", "general path"])
def test_bench_decode_step_inside_a_block(benchmark, form: str) -> None:  # type: ignore[no-untyped-def]
    """A running request's allocation that needs nothing (most decode steps): the in-place
    check of the unitary coordinator vs vLLM's general path (its count, skip, allocate and
    cache steps, each finding nothing to do)."""
    cache = make_cache("hashchain", CacheConfig(64 * BLOCK, BLOCK))
    req = Request("r", PROMPT[: 4 * BLOCK + 1])
    assert cache.allocate(req, req.num_tokens)
    manager = cache.manager
    if form == "general path":
        manager.coordinator.extends_in_place = lambda *args: False  # type: ignore[method-assign]
    req.num_computed_tokens = req.num_tokens - 1  # the last token's slot: inside block 5

    benchmark.group = "decode step inside a block (allocate_slots for 1 token)"
    assert benchmark(manager.allocate_slots, req, 1) == ([],)


def chain_per_call(blocks: list[tuple[int, ...]]) -> list[BlockHash]:
    """The plain form: ``hash_block_tokens`` per block."""
    parent, out = none_hash(sha256), []
    for block in blocks:
        parent = hash_block_tokens(sha256, parent, block, None)
        out.append(parent)
    return out


def chain_inlined(blocks: list[tuple[int, ...]]) -> list[BlockHash]:
    out: list[BlockHash] = []
    chain_block_hashes(sha256, none_hash(sha256), blocks, out)
    return out


@pytest.mark.parametrize("form", ["chain_block_hashes", "hash_block_tokens per block"])
def test_bench_hashing_a_chain(benchmark, form: str) -> None:  # type: ignore[no-untyped-def]
    blocks = [tuple(PROMPT[i : i + BLOCK]) for i in range(0, len(PROMPT), BLOCK)]
    chain = chain_inlined if form == "chain_block_hashes" else chain_per_call
    benchmark.group = "hash a 2048-block chain (sha256)"
    assert benchmark(chain, blocks) == chain_per_call(blocks)


def run_per_position(blocks: LazyBlocks, lo: int, hi: int) -> list[KVCacheBlock]:
    """The plain form: each position checked and its block made in the loop."""
    made, out = blocks._blocks, blocks._blocks[lo:hi]
    for k, block in enumerate(out):
        if block is None:
            out[k] = made[lo + k] = blocks.make_block(lo + k)
    return out  # type: ignore[return-value]


@pytest.mark.parametrize("form", ["LazyBlocks.run", "per position"])
def test_bench_handing_out_fresh_blocks(benchmark, form: str) -> None:  # type: ignore[no-untyped-def]
    def hand_out(blocks: LazyBlocks) -> list[KVCacheBlock]:
        return blocks.run(0, 4096) if form == "LazyBlocks.run" else run_per_position(blocks, 0, 4096)

    benchmark.group = "hand out 4096 never-used blocks"
    out = benchmark.pedantic(hand_out, setup=lambda: ((LazyBlocks(4096),), {}), rounds=100)
    assert [b.block_id for b in out] == list(range(4096))
