"""REFERENCE B3 at the request level: SGLang's flow through RadixPrefixCache."""

from __future__ import annotations

from typing import Any

import pytest
from prefixcache.backends.radix import RadixKey, request_key
from prefixcache.backends.radix.key import MM_VALUE_BASE

from prefixcache import CacheConfig, Request, make_cache
from prefixcache.pool import PagePool
from tests.helpers import checked, run_to_completion, tokens


def watch_frees(cache: Any) -> list[list[int]]:
    """Record each pool.free and assert, at that moment, that no live request points at a page
    being freed (upstream failure mode: freeing duplicate slots a request still points at)."""
    inner = cache.cache
    calls: list[list[int]] = []

    class WatchedPool(PagePool):
        __slots__ = ()

        def free(self, pages: Any) -> None:
            pages = [int(p) for p in pages]
            for rid, live in ((rid, rec.state) for rid, rec in inner._live.items()):
                assert not set(pages) & set(live.pages), f"freeing pages {rid!r} still points at"
            calls.append(pages)
            super().free(pages)

    inner.pool.__class__ = WatchedPool
    return calls


@pytest.mark.parametrize("page", [1, 2, 4])
def test_page_table_points_at_tree_pages_before_duplicates_are_freed(page: int) -> None:
    cache = checked("radix", 64 * page, page)
    frees = watch_frees(cache)
    prompt = tokens(6 * page + 1)
    a, b = Request("a", prompt), Request("b", prompt)
    for r in (a, b):  # both admitted before either computed: no hit, private pages
        assert cache.allocate(r, r.num_tokens)
    b_own = cache.page_table(b)
    for r in (a, b):
        r.num_computed_tokens = r.num_tokens
        cache.commit(r)
    cached = len(prompt) // page * page
    assert cache.page_table(b)[: cached // page] == cache.page_table(a)[: cached // page]
    assert frees[-1] == b_own[: cached // page], "b's duplicate pages went back to the pool"
    assert cache.cache.tree.protected_size() == cached
    for r in (a, b):
        cache.release(r)
    assert cache.cache.tree.total_size() == cached and cache.usage().evictable == cached // page


def test_commit_moves_the_lock_to_the_new_last_node() -> None:
    cache = checked("radix", 128, 1)
    r = Request("r", tokens(30))
    assert cache.allocate(r, 10)
    r.num_computed_tokens = 10
    cache.commit(r)
    tree = cache.cache.tree
    first = cache.cache._live["r"].state.lock.node
    assert (tree.protected_size(), tree.evictable_size(), first.lock_ref) == (10, 0, 1)
    assert cache.allocate(r, 10)
    r.num_computed_tokens = 20
    cache.commit(r)
    second = cache.cache._live["r"].state.lock.node
    assert second is not first and second.parent is first and second.lock_ref == 1
    assert (tree.protected_size(), tree.evictable_size()) == (20, 0)
    cache.release(r)
    assert (tree.protected_size(), tree.evictable_size()) == (0, 20)


def test_chunked_prefill_counts_the_request_once_per_node() -> None:
    cache = checked("radix", 256, 1)
    r = Request("r", tokens(30))
    for chunk in (10, 10, 10):
        assert cache.allocate(r, chunk)
        r.num_computed_tokens += chunk
        cache.commit(r)
    cache.release(r)
    tree = cache.cache.tree
    assert [n.hit_count for n in tree.iter_nodes()] == [1, 1, 1]


@pytest.mark.parametrize("page", [1, 2, 4])
def test_release_caches_whole_pages_and_frees_the_unaligned_tail(page: int) -> None:
    cache = checked("radix", 64 * page, page)
    r = Request("r", tokens(5 * page + page - 1 if page > 1 else 5))
    assert cache.allocate(r, r.num_tokens)
    r.num_computed_tokens = r.num_tokens
    cache.commit(r)
    cache.release(r)
    cached = r.num_tokens // page * page
    assert cache.cache.tree.total_size() == cached
    assert cache.usage() == (cache.config.num_usable_pages - cached // page, cached // page, 0)
    assert cache.lookup(Request("again", list(r.all_token_ids) + [1])).tokens == cached


@pytest.mark.parametrize("page", [1, 2, 4])
def test_hits_are_whole_pages_below_the_last_token(page: int) -> None:
    cache = checked("radix", 64 * page, page)
    prompt = tokens(7 * page + 1)
    run_to_completion(cache, Request("a", prompt))
    for n in range(2, len(prompt) + 1):
        assert cache.lookup(Request("q", prompt[:n])).tokens == (n - 1) // page * page


def test_release_after_decode_caches_prompt_and_output() -> None:
    cache = checked("radix", 128, 1)
    r = Request("r", tokens(8))
    assert cache.allocate(r, 8)
    for t in range(4):
        r.num_computed_tokens = r.num_tokens
        cache.commit(r)
        r.append_output_token_ids(100 + t)
        assert cache.allocate(r, 1)
    r.num_computed_tokens = r.num_tokens  # 12 tokens with KV
    cache.release(r)
    follow_up = Request("turn2", list(r.all_token_ids) + [5, 6])
    assert cache.lookup(follow_up).tokens == 12


def test_allocate_evicts_unpinned_leaves_when_the_pool_is_short() -> None:
    cache = checked("radix", 33, 1)  # 32 usable slots
    run_to_completion(cache, Request("old", tokens(20, seed=1)))
    new = Request("new", tokens(20, seed=2))
    assert cache.allocate(new, 20)
    assert cache.stats.evicted_tokens == 20  # the whole old leaf, though 8 would do
    assert cache.lookup(Request("o", tokens(20, seed=1))).tokens == 0


def test_allocate_never_evicts_its_own_hit_and_fails_cleanly() -> None:
    cache = checked("radix", 41, 1)  # 40 usable slots
    shared = tokens(20, seed=1)
    run_to_completion(cache, Request("warm", shared))  # 20 cached, evictable
    other = Request("other", tokens(8, seed=3))
    assert cache.allocate(other, 8)  # 12 free
    r = Request("r", shared + tokens(13, seed=2))  # hit 20, needs 13: only by evicting its own hit
    before = (cache.usage(), cache.stats.requests)
    assert not cache.allocate(r, 13)
    assert (cache.usage(), cache.stats.requests) == before and not cache.is_live(r)
    assert cache.cache.tree.protected_size() == 0
    assert cache.lookup(Request("w", shared)).tokens == 19


def test_lora_and_salt_namespaces_are_isolated_even_with_the_same_string() -> None:
    cache = checked("radix", 512, 1)
    prompt = tokens(20)
    run_to_completion(cache, Request("lora", prompt, lora_name="x"))
    assert cache.lookup(Request("plain", prompt)).tokens == 0
    assert cache.lookup(Request("salt", prompt, cache_salt="x")).tokens == 0
    assert cache.lookup(Request("other-lora", prompt, lora_name="y")).tokens == 0
    assert cache.lookup(Request("same-lora", prompt, lora_name="x")).tokens == 19
    run_to_completion(cache, Request("both", prompt, lora_name="x", cache_salt="s"))
    assert cache.lookup(Request("both2", prompt, lora_name="x", cache_salt="s")).tokens == 19
    assert cache.lookup(Request("salt-only", prompt, cache_salt="s")).tokens == 0
    assert request_key(Request("k", prompt, lora_name="x")).extra_key != request_key(
        Request("k", prompt, cache_salt="x")
    ).extra_key


def test_multimodal_spans_enter_the_key_and_never_collide_with_token_ids() -> None:
    cache = checked("radix", 512, 1)
    prompt = tokens(10) + [0] * 8 + tokens(10, seed=3)  # 8 placeholder tokens at offset 10
    run_to_completion(cache, Request("img1", prompt, mm_hashes=[("cat.png", 10, 8)]))
    assert cache.lookup(Request("same", prompt, mm_hashes=[("cat.png", 10, 8)])).tokens == 27
    assert cache.lookup(Request("other", prompt, mm_hashes=[("dog.png", 10, 8)])).tokens == 10
    assert cache.lookup(Request("text", prompt)).tokens == 10
    key = request_key(Request("k", prompt, mm_hashes=[("cat.png", 10, 8)])).token_ids
    assert (key[10:18] >= MM_VALUE_BASE).all() and len(set(key[10:18].tolist())) == 8
    assert (key[:10] < MM_VALUE_BASE).all()


def test_token_ids_in_the_multimodal_range_are_rejected() -> None:
    cache = make_cache("radix", CacheConfig(64, 1))
    with pytest.raises(ValueError, match="2\\*\\*40"):
        cache.lookup(Request("big", [1, MM_VALUE_BASE, 2]))


def test_disabled_cache_never_hits_and_returns_every_page() -> None:
    cache = checked("radix", 256, 4, disable=True)
    prompt = tokens(30)
    run_to_completion(cache, Request("a", prompt))
    assert cache.lookup(Request("b", prompt)).tokens == 0
    assert cache.usage() == (cache.config.num_usable_pages, 0, 0)
    assert cache.evict(100) == 0 and cache.cache.tree.total_size() == 0


def test_preempted_request_rehits_its_own_committed_pages() -> None:
    cache = checked("radix", 256, 4)
    r = Request("r", tokens(21))
    assert cache.allocate(r, 21)
    r.num_computed_tokens = 13
    cache.commit(r)  # 12 tokens in the tree
    cache.release(r)
    r.num_computed_tokens, r.num_preemptions = 0, 1
    assert cache.lookup(r).tokens == 12
    assert cache.allocate(r, 9) and r.num_computed_tokens == 12


def test_tree_slots_are_per_token_indices_of_whole_pages() -> None:
    page = 4
    cache = checked("radix", 64 * page, page)
    r = Request("r", tokens(9))
    assert cache.allocate(r, 9)
    table = cache.page_table(r)
    r.num_computed_tokens = 9
    cache.release(r)
    m = cache.cache.tree.match_prefix(RadixKey(tokens(9)[:8]))
    assert m.indices.tolist() == [p * page + o for p in table[:2] for o in range(page)]


def test_decode_commits_publish_nothing_until_release_as_sglang() -> None:
    """SGLang inserts at prefill-chunk ends and at finish, never after a decode step."""
    cache = checked("radix", 256, 1)
    r = Request("r", tokens(10))
    assert cache.allocate(r, 10)
    r.num_computed_tokens = 10
    cache.commit(r)
    for step in range(5):
        r.append_output_token_ids(step)
        assert cache.allocate(r, 1)
        r.num_computed_tokens += 1
        cache.commit(r)
    probe = list(r.all_token_ids) + [99]
    assert cache.lookup(Request("probe", probe)).tokens == 10  # the prompt only
    cache.release(r)
    assert cache.lookup(Request("probe2", probe)).tokens == 15  # prompt and output
