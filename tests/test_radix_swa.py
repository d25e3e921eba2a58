"""The radix backend's hybrid sliding-window side (SGLang 0.5.23's UnifiedRadixCache with the
FULL + SWA components): construction and sizing, the tree's tombstone rules, locks and the
request lifecycle's SWA frees, each on a small hand-checked case. The op-by-op agreement with
the pinned upstream code is in test_radix_swa_upstream.py."""

from __future__ import annotations

import numpy as np
import pytest
from prefixcache.backends.radix import RadixPrefixCache
from prefixcache.backends.radix.components.swa import SWAComponent, swa_tree
from prefixcache.backends.radix.key import RadixKey
from prefixcache.backends.radix.radix_cache import InsertParams, RadixCache
from prefixcache.backends.radix.swa_pool import SWAPagePool, swa_pool_sizes

from prefixcache import CacheConfig, Request, make_cache

SWA4 = [("sliding_window", 4), ("full",)]


def tree(window: int = 4, page_size: int = 1, full: int = 64, swa: int = 64) -> RadixCache:
    return swa_tree(page_size, SWAComponent(window, SWAPagePool(full + 1, swa + 1, page_size=page_size)))


def put(t: RadixCache, tokens: list[int], evicted: int = 0) -> tuple[int, object]:
    """Allocate slots from both pools (as SGLang's alloc), free the SWA below ``evicted``, insert."""
    p = t.page_size
    pages = t.component.pool.alloc(-(-len(tokens) // p))
    assert pages is not None
    t.component.pool.free_swa(pages[: evicted // p])
    slots = (pages[:, None] * p + np.arange(p)).reshape(-1)[: len(tokens)]
    out = t.insert_ending_at(RadixKey(tokens), slots, params=InsertParams(0, evicted))
    t.check()
    return out.prefix_len, out.node


def run(cache: RadixPrefixCache, req: Request, n: int | None = None) -> None:
    """Admit or extend ``req`` by n tokens (all remaining if None), compute and commit them."""
    first = not cache.is_live(req)
    m = cache.lookup(req) if first else None
    done = m.tokens if m is not None else req.num_computed_tokens
    assert cache.allocate(req, n if n is not None else req.num_tokens - done, m)
    req.num_computed_tokens = cache.reserved_tokens(req)
    cache.commit(req)
    cache.check_invariants()


# ---------------------------------------------------------------------------- construction
def test_dense_configs_keep_the_dense_radix_cache() -> None:
    for cfg in (CacheConfig(64, 4), CacheConfig(64, 4, layout=[("full",)] * 3)):
        cache = make_cache("radix", cfg)
        assert type(cache) is RadixPrefixCache and len(cache.kv_groups()) == 1


def test_a_hybrid_layout_gets_two_pools_sized_from_the_layer_token_budget() -> None:
    cfg = CacheConfig(400, 4, layout=SWA4 * 2)
    cache = make_cache("radix", cfg)
    assert isinstance(cache, RadixPrefixCache)
    # 400 x 4 layer-tokens / (2 + 0.8 x 2) = 444.4 -> 444 full, int(444 x 0.8) = 355 -> 352 SWA
    assert tuple(cache.component.sizes) == (444, 352) == tuple(swa_pool_sizes(cfg))
    full, swa = cache.kv_groups()
    assert (full.kind, full.pool, full.window, full.layers, full.num_pages) == (
        "full",
        "full",
        None,
        (1, 3),
        112,
    )
    assert (swa.kind, swa.pool, swa.window, swa.layers, swa.num_pages) == (
        "sliding_window",
        "swa",
        4,
        (0, 2),
        89,
    )
    half = make_cache("radix", cfg, swa_full_tokens_ratio=0.5)
    assert tuple(half.component.sizes) == (532, 264)  # 1600 / 3 = 533 -> 532; int(266.0) -> 264


def test_two_windows_share_one_swa_pool_keeping_the_larger() -> None:
    cache = make_cache(
        "radix", CacheConfig(64, 1, layout=[("sliding_window", 3), ("sliding_window", 8), ("full",)])
    )
    assert cache.kv_groups()[1].window == 8 and cache.kv_groups()[1].layers == (0, 1)


@pytest.mark.parametrize(
    "layout, options, message",
    [
        ([("sliding_window", 60), ("full",)], {}, "cannot hold even one request"),
        ([("mamba", 8), ("sliding_window", 4), ("full",)], {}, "Mamba"),
        ([("mamba", 8), ("full",)], {}, "Mamba"),
        (SWA4, {"need_sort": True}, "need_sort=False"),
        (SWA4, {"eviction_policy": "lfu"}, "eviction_policy='lfu' not supported .*LRU only"),
        (SWA4, {"swa_eviction_interval": 0}, "swa_eviction_interval"),
        (SWA4, {"swa_full_tokens_ratio": 0}, "swa_full_tokens_ratio"),
        ([("full",)], {"swa_eviction_interval": 8}, "swa_eviction_interval: not an option of radix over"),
    ],
)
def test_bad_hybrid_configs_are_clear_value_errors(layout: list, options: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make_cache("radix", CacheConfig(64, 4, layout=layout), **options)


# ---------------------------------------------------------------------------- the tree
def test_match_restarts_its_window_after_a_tombstone() -> None:
    """A tombstone resets the run of live SWA tokens: a match ends only where a run of at least
    one window follows the last tombstone (or there is none)."""
    t = tree(window=4)
    put(t, [1, 2, 3, 4, 5, 6, 7, 8])  # split at fresh-leaf time: [1..4] and [5..8], both live
    assert t.match_prefix(RadixKey([1, 2, 3, 4, 5, 6, 7, 8])).length == 8
    assert t.evict_for_alloc(0, 1) == (0, 4)  # the older half goes first: [1..4] tombstoned
    assert t.match_prefix(RadixKey([1, 2, 3, 4, 5, 6, 7, 8])).length == 8  # 4 live tokens after it
    assert t.match_prefix(RadixKey([1, 2, 3, 4, 5, 6, 7])).length == 0  # only 3 after it
    assert t.match_prefix(RadixKey([1, 2, 3, 4, 5, 6, 7])).full_hit == 7
    t.check()


def test_an_insert_below_the_inserters_frontier_leaves_a_tombstone_leaf() -> None:
    t = tree(window=4)
    assert put(t, [1, 2, 3], evicted=3)[0] == 0
    (leaf,) = t.root_node.children.values()
    assert leaf.tombstone and not leaf.children and t.evictable_size() == 3 and t.component.evictable == 0
    assert t.match_prefix(RadixKey([1, 2, 3])).length == 0


def test_a_fresh_leaf_longer_than_a_window_is_split_to_one_window() -> None:
    t = tree(window=6, page_size=4)
    _, leaf = put(t, list(range(1, 17)))  # 16 tokens, window 6 -> a tail of 8 (whole pages)
    assert len(leaf.key) == 8 and len(leaf.parent.key) == 8 and not leaf.tombstone
    lock = t.lock(leaf)
    assert t.component.protected == 8 and t.component.evictable == 8  # the SWA lock pins one window only
    assert t.protected_size() == 16
    t.unlock(lock)
    t.check()


def test_an_insert_revives_a_tombstone_with_the_inserters_kv() -> None:
    t = tree(window=2)
    put(t, [1, 2, 3, 4])  # [1,2] [3,4]
    t.evict_for_alloc(0, 1)  # tombstones [1,2]
    assert t.match_prefix(RadixKey([1, 2])).length == 0
    free_full = t.component.pool.full.num_free
    assert put(t, [1, 2])[0] == 2  # unlocked tombstone: adopts the new full + SWA KV
    assert t.component.pool.full.num_free == free_full  # the old full-only KV was freed for the new
    assert t.match_prefix(RadixKey([1, 2])).length == 2


def test_a_locked_tombstone_keeps_its_full_kv_and_takes_only_the_swa() -> None:
    t = tree(window=2)
    put(t, [1, 2, 3, 4])
    t.evict_for_alloc(0, 1)
    node = t.match_prefix(RadixKey([1, 2, 3, 4])).last_node.parent
    assert node.tombstone
    old_full = node.value.copy()
    lock = t.lock(node)
    put(t, [1, 2])
    assert np.array_equal(node.value, old_full) and not node.tombstone
    t.unlock(lock)
    t.check()


def test_an_early_swa_release_never_tombstones_under_a_lock_ref() -> None:
    t = tree(window=2)
    _, leaf = put(t, [1, 2])
    lock = t.lock(leaf)
    t.component.release_swa_early(lock)
    assert not leaf.tombstone and t.component.evictable == 2 and t.protected_size() == 2
    t.unlock(lock, swa_released=True)
    sizes = (t.evictable_size(), t.component.evictable, t.protected_size(), t.component.protected)
    assert sizes == (2, 2, 0, 0)
    t.check()


def test_full_eviction_is_oldest_leaf_first_and_swa_eviction_skips_locked_windows() -> None:
    t = tree(window=2)
    put(t, [1, 2])
    put(t, [5, 6])
    put(t, [1, 2, 3, 4])  # stamps [1, 2] again: [5, 6] is the oldest leaf
    assert t.evict_for_alloc(1, 0) == (2, 2) and t.match_prefix(RadixKey([5, 6])).length == 0
    lock = t.lock(t.match_prefix(RadixKey([1, 2, 3, 4])).last_node)  # SWA lock on [3, 4]
    assert t.evict_for_alloc(0, 8) == (0, 2)  # only [1, 2]'s SWA is unlocked: tombstoned, full kept
    assert t.evictable_size() == 0 and t.component.protected == 2
    t.unlock(lock)
    t.check()


# ---------------------------------------------------------------------------- requests
def test_usage_is_the_full_pool_and_swa_usage_the_swa_pool() -> None:
    cache = make_cache("radix", CacheConfig(64, 1, layout=SWA4))
    a = Request("a", list(range(1, 21)))
    run(cache, a)
    full, swa = cache.usage(), cache.component_usage()
    assert sum(full) == cache.component.sizes.full_tokens and sum(swa) == cache.component.sizes.swa_tokens
    assert full.free == cache.component.sizes.full_tokens - 20
    # the checkpoint freed the SWA of the request's tokens older than the window
    assert swa.free == cache.component.sizes.swa_tokens - 4 - 1  # 4 in the window + its last token
    cache.release(a)
    cache.check_invariants()
    assert cache.usage().in_use == 0 and cache.component_usage().in_use == 0


def test_page_tables_read_zero_where_the_swa_left_the_window() -> None:
    cache = make_cache("radix", CacheConfig(64, 4, layout=SWA4), swa_eviction_interval=1)
    r = Request("r", list(range(1, 9)))
    run(cache, r)
    for t in range(12):
        r.append_output_token_ids(100 + t)
        run(cache, r, 1)
        full, swa = cache.page_tables(r)
        assert full == cache.page_table(r) and len(full) == len(swa)
        n = r.num_computed_tokens
        for pos in range(n - 3, n):  # the window's last 3 positions are on real SWA pages
            assert swa[pos // 4] != 0
    # the request freed its own out-of-window pages; the prompt's pages belong to the tree,
    # whose SWA only SWA eviction frees (the oldest, outside the request's SWA lock)
    assert swa[2] == 0 and 0 not in swa[3:] and swa[0] != 0 and swa[1] != 0 and 0 not in full
    assert cache.evict_component(8) == 4 and cache.page_tables(r)[1][:2] == [0, swa[1]]
    cache.release(r)
    cache.check_invariants()


def test_evicting_swa_counts_the_full_kv_of_the_leaves_it_deletes() -> None:
    """An SWA eviction that deletes an unlocked leaf drops its full KV too: ``stats.evicted_tokens``
    counts those tokens (a tombstone drops none), as for every other eviction."""
    cache = make_cache("radix", CacheConfig(400, 4, layout=SWA4 * 2))
    r = Request("r", list(range(1, 41)))
    run(cache, r)
    cache.release(r)
    before = cache.usage().evictable
    assert before > 0 and cache.stats.evicted_tokens == 0
    assert cache.evict_component(10**6) > 0
    deleted = (before - cache.usage().evictable) * 4
    assert deleted > 0 and cache.stats.evicted_tokens == deleted
    cache.check_invariants()


def test_a_request_hits_only_where_the_window_rule_holds() -> None:
    cache = make_cache("radix", CacheConfig(64, 1, layout=SWA4))
    a = Request("a", list(range(1, 21)))
    run(cache, a)
    cache.release(a)
    # tokens [0, 15) lost their SWA at a's checkpoint: a prefix ending there cannot be reused
    assert cache.lookup(Request("b", list(range(1, 11)) + [99])).tokens == 0
    hit = cache.lookup(Request("c", list(range(1, 21)) + [99]))
    assert hit.tokens == 20 and hit.full_hit == 20


def test_a_failed_hybrid_allocate_changes_nothing() -> None:
    cache = make_cache("radix", CacheConfig(32, 1, layout=SWA4))
    a = Request("a", list(range(1, 30)))
    run(cache, a, 20)
    before = (cache.usage(), cache.component_usage(), cache.page_tables(a))
    b = Request("b", list(range(100, 125)))
    assert not cache.allocate(b, 25)
    assert (cache.usage(), cache.component_usage(), cache.page_tables(a)) == before and not cache.is_live(b)


def test_a_match_from_before_a_reset_is_revalidated() -> None:
    cache = make_cache("radix", CacheConfig(64, 1, layout=SWA4))
    a = Request("a", list(range(1, 11)))
    run(cache, a)
    cache.release(a)
    b = Request("b", list(range(1, 11)) + [7])
    stale = cache.lookup(b)
    assert stale.tokens == 10 and cache.reset()
    assert cache.revalidate(stale).tokens == 0
    assert cache.allocate(b, 11, stale) and b.num_computed_tokens == 0
    cache.check_invariants()
