"""EAGLE bigram keys in the radix backend (``make_cache("radix", ..., is_eagle=True)``), as SGLang
0.5.23 keys its trees under EAGLE speculative decoding (``CacheInitParams.is_eagle``;
``RadixKey(is_bigram=True)`` and ``maybe_to_bigram_view`` in mem_cache/radix_cache.py).

An EAGLE draft model's KV at position i is computed from token i + 1 too, so SGLang caches the
KV of position i under the bigram (t[i], t[i+1]): a request of n tokens reuses at most n - 2
and a checkpoint of c computed tokens publishes the KV of c - 1 (whole pages).

Upstream fixtures: tests/fixtures/upstream/sglang_eagle/ (written by
``experiments/upstream/sglang_driver.py``'s ``record_eagle`` from SGLang 0.5.23's own
RadixCache(is_eagle=True) + token-to-KV allocator, driven as its scheduler does; the recorder
checks that UnifiedRadixCache(FULL, Python core, is_eagle=True), what 0.5.23 builds for a plain
model, records the same); the SWA tree's
EAGLE cases live beside the other hybrid fixtures (tests/test_radix_swa_upstream.py).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from prefixcache.backends.radix import RadixKey, RadixPrefixCache
from prefixcache.experiments.upstream.ours import compare, replay_ours

from prefixcache import CacheConfig, PrefixCache, Request, make_cache

FIXTURES = sorted((Path(__file__).parent / "fixtures" / "upstream" / "sglang_eagle").glob("*.json"))
GEMMA_LIKE = [("sliding_window", 8)] * 2 + [("full",)]


# ---------------------------------------------------------------------------- RadixKey
def test_bigram_key_measures_bigrams_over_raw_tokens() -> None:
    """SGLang's RadixKey(is_bigram=True): raw tokens kept, length N - 1, iteration as pairs."""
    key = RadixKey([1, 2, 3, 4], is_bigram=True)
    assert len(key) == 3 and key.tolist() == [1, 2, 3, 4]
    assert list(key) == [(1, 2), (2, 3), (3, 4)]
    assert len(RadixKey([], is_bigram=True)) == 0


def test_bigram_slices_share_their_boundary_token() -> None:
    """Bigrams [a, b) span raw tokens [a, b + 1): neighbouring slices share one token."""
    key = RadixKey([1, 2, 3, 4, 5], extra_key="ns", is_bigram=True)
    head, tail = key[:2], key[2:]
    assert head.tolist() == [1, 2, 3] and tail.tolist() == [3, 4, 5]
    assert head.is_bigram and tail.is_bigram and head.extra_key == "ns"
    assert len(head) + len(tail) == len(key)
    assert key[1].tolist() == [2, 3] and key[-1].tolist() == [4, 5]
    assert len(key[2:2]) == 0 and key[2:2].tolist() == []
    with pytest.raises(IndexError):
        key[4]


@pytest.mark.parametrize("page, expected", [(1, 5), (2, 4), (4, 4), (8, 0)])
def test_bigram_page_alignment_counts_bigrams(page: int, expected: int) -> None:
    """6 raw tokens are 5 bigrams; whole pages of bigrams keep one raw token past them."""
    key = RadixKey([9, 8, 7, 6, 5, 4], is_bigram=True).page_aligned(page)
    assert len(key) == expected and key.tolist() == [9, 8, 7, 6, 5, 4][: expected + 1 if expected else 0]


@pytest.mark.parametrize(
    "a, b, page, expected",
    [
        ([1, 2, 3, 4], [1, 2, 3, 4], 1, 3),  # all raw tokens equal: every bigram
        ([1, 2, 3, 4], [1, 2, 3, 9], 1, 2),  # (3, 4) != (3, 9)
        ([1, 2, 3, 4], [1, 2, 9, 4], 1, 1),
        ([1, 2, 3, 4], [7, 2, 3, 4], 1, 0),
        ([1, 2, 3, 4, 5, 6], [1, 2, 3, 4, 5, 7], 2, 4),
        ([1, 2, 3, 4, 5, 6], [1, 2, 3, 4, 5, 7], 4, 4),
        ([1, 2, 3, 4, 5, 6], [1, 2, 3, 4, 9, 7], 4, 0),
    ],
)
def test_bigram_match_is_one_less_than_the_raw_match(
    a: list[int], b: list[int], page: int, expected: int
) -> None:
    """``match_at``: m equal raw tokens are m - 1 equal bigrams, rounded down to whole pages."""
    x, y = RadixKey(a, is_bigram=True), RadixKey(b, is_bigram=True)
    assert x.match(y, page) == y.match(x, page) == expected


def test_bigram_child_keys_are_the_first_page_of_bigrams() -> None:
    """Children are filed by their first page of bigrams: same first token, different next
    token -> different children; namespaces stay apart."""
    a, b = RadixKey([1, 2, 3], is_bigram=True), RadixKey([1, 5, 3], is_bigram=True)
    assert a.child_key(1) != b.child_key(1) and RadixKey([1, 2]).child_key(1) == RadixKey([1, 5]).child_key(1)
    assert a.child_key(2) == (1, 2, 3)
    assert RadixKey([1, 2], "ns", is_bigram=True).child_key(1) == ("ns", (1, 2))
    with pytest.raises(ValueError, match="no child key"):
        RadixKey([], is_bigram=True).child_key(1)


def test_maybe_to_bigram_view_cuts_the_value_to_one_slot_per_bigram() -> None:
    raw = RadixKey([4, 5, 6], "ns")
    key, value = raw.maybe_to_bigram_view(True, np.array([10, 11, 12]))
    assert key.is_bigram and len(key) == 2 and key.extra_key == "ns" and value is not None
    assert value.tolist() == [10, 11] and not raw.is_bigram  # ours: a new key, the caller's unchanged
    same, v = raw.maybe_to_bigram_view(False, np.array([1]))
    assert same is raw and v is not None and v.tolist() == [1]
    assert key.maybe_to_bigram_view(True)[0] is key  # already a bigram view
    one, _ = RadixKey([4]).maybe_to_bigram_view(True)
    assert len(one) == 0 and one.is_bigram


def test_bigram_and_plain_keys_do_not_mix() -> None:
    with pytest.raises(ValueError, match="bigram"):
        RadixKey([1, 2, 3], is_bigram=True).match(RadixKey([1, 2, 3]))
    with pytest.raises(ValueError, match="bigram"):
        RadixKey([1], is_bigram=True)
    assert RadixKey([1, 2], is_bigram=True) != RadixKey([1, 2])


# ---------------------------------------------------------------------------- the option
def test_is_eagle_reaches_the_dense_and_the_swa_tree_and_is_off_by_default() -> None:
    dense = make_cache("radix", CacheConfig(256, 4), is_eagle=True)
    swa = make_cache("radix", CacheConfig(256, 4, layout=GEMMA_LIKE), is_eagle=True)
    assert isinstance(dense, RadixPrefixCache) and dense.tree.is_eagle
    assert isinstance(swa, RadixPrefixCache) and swa.tree.is_eagle
    assert not make_cache("radix", CacheConfig(256, 4)).tree.is_eagle  # type: ignore[attr-defined]
    assert not make_cache("radix", CacheConfig(256, 4, layout=GEMMA_LIKE)).tree.is_eagle  # type: ignore[attr-defined]


def test_is_eagle_with_mamba_layers_is_refused() -> None:
    """SGLang 0.5.23 drops is_eagle for a tree with a MAMBA component (UnifiedTreeCore:
    ``params.is_eagle and MAMBA not in components``): no bigram keys there, so we refuse it."""
    with pytest.raises(ValueError, match="is_eagle"):
        make_cache("radix", CacheConfig(256, 1, layout="mamba-hybrid"), is_eagle=True)
    # The class refuses it too when built directly, past the factory's capability table.
    from prefixcache.backends.radix import RadixPrefixCache

    with pytest.raises(ValueError, match="drops it for a tree with a MAMBA component"):
        RadixPrefixCache(CacheConfig(256, 1, layout="mamba-hybrid"), is_eagle=True)


# ---------------------------------------------------------------------------- upstream
def test_eagle_fixtures_present() -> None:
    assert len(FIXTURES) >= 20
    for path in FIXTURES:
        fixture = json.loads(path.read_text())
        assert fixture["options"] == {"need_sort": False, "is_eagle": True}, path.name
        assert "is_eagle=True" in fixture["upstream"]
    assert {json.loads(p.read_text())["scenario"]["page_size"] for p in FIXTURES} == {1, 4}


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.stem)
def test_eagle_requests_replay_upstream(path: Path) -> None:
    """SGLang 0.5.23 RadixCache(is_eagle=True): per op the hit, the page ids, evicted tokens
    and the pool usage agree exactly (insert / match / split / evict order, page 1 and 4)."""
    fixture = json.loads(path.read_text())
    scenario = fixture["scenario"]
    ours, _ = replay_ours("radix", scenario, **fixture["options"])
    diffs = compare(ours, fixture["records"], scenario["ops"])
    assert not diffs, f"{fixture['upstream']} disagrees on {len(diffs)} op(s):\n" + "\n".join(diffs[:10])


def test_eagle_fixtures_differ_from_plain_keys() -> None:
    """The fixtures pin the bigram behaviour: plain keys disagree with every page-1 fixture.
    At page 4 a few agree by construction (where n - 1 and n tokens hold the same whole pages,
    both keyings cache and reuse the same pages), never more than 3 of the 12."""
    same = []
    for path in FIXTURES:
        fixture = json.loads(path.read_text())
        ours, _ = replay_ours("radix", fixture["scenario"], need_sort=False)
        if not compare(ours, fixture["records"], fixture["scenario"]["ops"]):
            same.append(path.stem)
    assert all(name.endswith("_p4") for name in same) and len(same) <= 3, same


# ---------------------------------------------------------------------------- engine level
def _run(cache: PrefixCache, req: Request) -> int:
    """Admit, prefill in one chunk, commit, release; the hit."""
    match = cache.lookup(req)
    assert cache.allocate(req, req.num_tokens - match.tokens, match)
    hit = req.num_computed_tokens
    req.num_computed_tokens = req.num_tokens
    cache.commit(req)
    cache.release(req)
    cache.check_invariants()
    return hit


@pytest.mark.parametrize("page", [1, 4])
def test_a_finished_prompt_is_reused_but_for_its_last_two_tokens(page: int) -> None:
    """A finished 10-token request leaves the KV of 9 positions (bigrams (t0,t1)..(t8,t9)),
    page-aligned: page 1 -> 9, page 4 -> 8. The same prompt again looks up its first 9 tokens
    (8 bigrams): reuses 8. One token more (11 tokens) looks up 10 raw tokens = 9 bigrams: page 1
    reuses all 9 cached positions. Plain keys would give 9 and 10."""
    prompt = list(range(100, 110))
    for eagle, same, longer in (
        (True, 8, 9 if page == 1 else 8),
        (False, 9 if page == 1 else 8, 10 if page == 1 else 8),
    ):
        cache = make_cache("radix", CacheConfig(256, page), is_eagle=eagle)
        assert _run(cache, Request("a", prompt)) == 0
        assert cache.lookup(Request("b", prompt)).tokens == same
        assert cache.lookup(Request("c", [*prompt, 7])).tokens == longer
        assert cache.usage().evictable * page == (9 if eagle and page == 1 else 8 if page == 4 else 10)


def test_a_different_next_token_breaks_the_bigram() -> None:
    """Position 4's KV was computed with token 5 next; a request that continues with 9 there
    cannot reuse it (plain keys would reuse 5 positions, EAGLE only 4)."""
    for eagle, expected in ((True, 4), (False, 5)):
        cache = make_cache("radix", CacheConfig(256, 1), is_eagle=eagle)
        _run(cache, Request("a", [1, 2, 3, 4, 5, 6, 7, 8]))
        assert cache.lookup(Request("b", [1, 2, 3, 4, 5, 9, 9, 9])).tokens == expected


def _shadow_kv(req: Request, start: int, end: int) -> dict[int, tuple[int, int | None]]:
    """What an EAGLE draft writes for positions [start, end): token i with the token after it
    when that is known, else None (its KV is then not reusable by anyone)."""
    ids = req.all_token_ids
    return {i: (ids[i], ids[i + 1] if i + 1 < len(ids) else None) for i in range(start, end)}


_OPS = st.lists(
    st.tuples(
        st.sampled_from(["new", "step", "decode", "release", "evict"]),
        st.integers(0, 3),  # which live request / stem
        st.integers(0, 7),  # extra tokens, chunk size
    ),
    min_size=1,
    max_size=30,
)


@pytest.mark.parametrize(
    "page, layout",
    [(1, None), (4, None), (1, GEMMA_LIKE), (2, GEMMA_LIKE)],
    ids=["p1", "p4", "swa_p1", "swa_p2"],
)
@given(ops=_OPS)
def test_eagle_lifecycle_reuses_only_kv_computed_with_the_same_next_token(
    page: int, layout: Any, ops: list[tuple[str, int, int]]
) -> None:
    """Random admissions (chunked prefill), decode steps, releases and evictions on an EAGLE
    cache (dense and gemma3-like SWA): invariants after every step; every lookup reports at
    most n - 2 tokens in whole pages; and every reused position holds KV its writer computed
    with the same token and the same next token (a shadow KV per full-pool slot): what SGLang's
    scheduler may reuse under EAGLE. Plain keys fail this (a last position computed without its
    next token would be reused)."""
    cfg = CacheConfig(96, page, layout=layout)
    cache = make_cache("radix", cfg, is_eagle=True)
    stems = [[1, 2, 3, 4, 5, 6], [1, 2, 3, 9, 9], [7, 7, 7, 7, 7, 7, 7, 7], [1, 2, 3, 4, 5, 6, 8]]
    shadow: dict[int, tuple[int, int | None]] = {}
    live: list[Request] = []
    serial = 0

    def slot(req: Request, i: int) -> int:
        return cache.page_tables(req)[0][i // page] * page + i % page

    def compute(req: Request, n: int) -> None:
        start = req.num_computed_tokens
        # EAGLE's draft extend rewrites the previous last position once its next token is known
        first = start - 1 if start and shadow.get(slot(req, start - 1), (0, None))[1] is None else start
        for i, kv in _shadow_kv(req, first, start + n).items():
            shadow[slot(req, i)] = kv
        req.num_computed_tokens = start + n
        cache.commit(req)

    for kind, which, extra in ops:
        if kind == "new" and len(live) < 3:
            serial += 1
            req = Request(f"r{serial}", stems[which] + [50 + serial] * extra)
            match = cache.lookup(req)
            n = req.num_tokens
            assert match.tokens <= max(0, n - 2) and match.tokens % page == 0
            chunk = min(n - match.tokens, max(1, extra))
            if not cache.allocate(req, chunk, match):
                cache.check_invariants()
                continue
            hit = req.num_computed_tokens
            for i in range(hit):  # reused: computed by its writer with our token and next token
                assert shadow.get(slot(req, i)) == (req.all_token_ids[i], req.all_token_ids[i + 1]), (req, i)
            live.append(req)
            compute(req, chunk)
        elif kind == "step" and live:
            req = live[which % len(live)]
            left = req.num_tokens - req.num_computed_tokens
            if left > 0:
                chunk = min(left, max(1, extra))
                if cache.allocate(req, chunk):
                    compute(req, chunk)
        elif kind == "decode" and live:
            req = live[which % len(live)]
            if req.num_computed_tokens == req.num_tokens and req.num_tokens < 24:
                req.append_output_token_ids([60 + extra])
                if cache.allocate(req, 1):
                    compute(req, 1)
        elif kind == "release" and live:
            cache.release(live.pop(which % len(live)))
        elif kind == "evict":
            cache.evict(extra * page)
        cache.check_invariants()
    for req in live:
        cache.release(req)
    cache.check_invariants()
