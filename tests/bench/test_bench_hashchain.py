"""Benchmarks (``make bench`` / ``pytest tests/bench``) of the hashchain hot-path optimisations,
each against the plain form it replaced, on the same input:

* a repeated lookup of a waiting request: resumed from its memo (nothing left the map) vs a
  fresh walk (the memo dropped first), 2048 cached blocks;
* block hashing: the inlined pickle + SHA-256 loop vs one ``hash_fn`` call per block (what
  any other hash function gets), 2048 blocks.
"""

from __future__ import annotations

from typing import Any

import pytest
from prefixcache.backends.hashchain.hashing import BlockHasher, sha256

from prefixcache import CacheConfig, Request, make_cache

BLOCK = 16
NUM_BLOCKS = 2048
PROMPT = [(31 * i + 7) % 32_000 for i in range(NUM_BLOCKS * BLOCK)]


def cached_request() -> tuple[Any, Request]:
    cache = make_cache("hashchain", CacheConfig((NUM_BLOCKS + 8) * BLOCK, BLOCK))
    warm = Request("warm", PROMPT)
    assert cache.allocate(warm, warm.num_tokens)
    waiting = Request("waiting", PROMPT + [1])
    assert cache.lookup(waiting) == NUM_BLOCKS * BLOCK
    return cache, waiting


def test_bench_repeated_lookup_resumed_from_the_memo(benchmark) -> None:  # type: ignore[no-untyped-def]
    cache, waiting = cached_request()
    benchmark.group = "repeated lookup, 2048 cached blocks"
    assert benchmark(cache.lookup, waiting) == NUM_BLOCKS * BLOCK


def test_bench_repeated_lookup_walked_afresh(benchmark) -> None:  # type: ignore[no-untyped-def]
    cache, waiting = cached_request()
    manager = cache.manager

    def fresh() -> int:
        waiting.memo.pop(manager, None)  # the lookup memo only; block hashes stay memoised
        return int(cache.lookup(waiting))

    benchmark.group = "repeated lookup, 2048 cached blocks"
    assert benchmark(fresh) == NUM_BLOCKS * BLOCK


def hash_all(hash_fn: Any) -> int:
    return len(BlockHasher(BLOCK, hash_fn).block_hashes(Request("h", PROMPT)))


@pytest.mark.parametrize("form", ["inlined", "call per block"])
def test_bench_block_hashing_sha256(benchmark, form: str) -> None:  # type: ignore[no-untyped-def]
    # A wrapper is not `sha256` itself, so the hasher takes its generic one-call-per-block loop.
    hash_fn = sha256 if form == "inlined" else (lambda obj: sha256(obj))
    benchmark.group = "sha256 block hashing, 2048 blocks"
    assert benchmark(hash_all, hash_fn) == NUM_BLOCKS
