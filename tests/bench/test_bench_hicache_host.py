"""Benchmark (run with ``make bench`` / ``pytest tests/bench``): HiCache's host eviction in a tree
of 2,000 host-only leaves (4,000 nodes with their device copies gone), one page a call.
Under LRU the victim comes from the host index (``HiRadixCache._pop_host_leaf``); the scan it
replaced (0.5.23's: list the tree, heap the host leaves) runs on the same tree with the index
off. Both free the same node."""

from __future__ import annotations

import warnings

import pytest

from prefixcache import CacheConfig, Request, make_cache
from prefixcache.tiers import HostTierConfig

LEAVES = 2_000


def host_only_tree(index: bool):  # type: ignore[no-untyped-def]
    """A radix cache whose host holds ``LEAVES`` prompts' copies and whose device holds none."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tier = HostTierConfig(capacity_tokens=1 << 20)
        cache = make_cache("radix", CacheConfig(1 << 16, 16), host_tier=tier)
    if not index:
        cache.tree._host_index = None
    for i in range(LEAVES):
        req = Request(f"r{i}", [i % 7] * 16 + list(range(i * 64, i * 64 + 48)))
        match = cache.lookup(req)
        assert cache.allocate(req, req.num_tokens - match.tokens, match)
        req.num_computed_tokens = req.num_tokens
        cache.commit(req)
        cache.release(req)
        cache.host_tier.advance_transfers()
    cache.evict(1 << 16)  # every node host-only now
    return cache


@pytest.mark.parametrize("index", [True, False], ids=["host index", "tree scan"])
def test_bench_evict_host_page(benchmark, index: bool) -> None:  # type: ignore[no-untyped-def]
    benchmark.group = f"evict one host page, {LEAVES} host leaves"
    cache = host_only_tree(index)
    tree = cache.tree
    freed = benchmark.pedantic(tree.evict_host, args=(16,), rounds=50, iterations=1)
    assert freed == 48  # one leaf: its 48 tokens
