"""RadixPrefixCache: pool sizes, the kv_groups / page_tables contract, where SGLang 0.5.23
(no_buffer) stores states and cuts hits, and what Marconi's options change.

The request flow itself is compared op by op with SGLang's own code in
test_radix_mamba_upstream.py; these tests pin the documented semantics around it.
"""

from __future__ import annotations

import pytest
from prefixcache.backends.radix import RadixPrefixCache
from prefixcache.backends.radix.mamba_marconi import prefix_flops
from prefixcache.backends.radix.mamba_pool import mamba_pool_sizes

from prefixcache import CacheConfig, Request

LAYOUT = [("mamba", 2), ("full",)]


def _cache(capacity: int = 40, **options: object) -> RadixPrefixCache:
    return RadixPrefixCache(CacheConfig(capacity, 1, layout=LAYOUT), **options)  # type: ignore[arg-type]


def _run(
    cache: RadixPrefixCache, rid: str, tokens: list[int], chunks: list[int], outputs: int = 0
) -> Request:
    """Admit, prefill in ``chunks`` (the first after the hit), decode ``outputs`` tokens, finish."""
    req = Request(rid, tokens)
    assert cache.allocate(req, chunks[0])
    for i, n in enumerate(chunks):
        if i:
            assert cache.allocate(req, n)
        req.num_computed_tokens += n
        cache.commit(req)
    for t in range(outputs):
        req.append_output_token_ids(100 + t)
        assert cache.allocate(req, 1)
        req.num_computed_tokens += 1
        cache.commit(req)
    cache.check_invariants()
    cache.release(req)
    cache.check_invariants()
    return req


# ---------------------------------------------------------------------------- sizes, contract
def test_pool_sizes_follow_sglang_ratio_path() -> None:
    """kv_cache_configurator.py: states K = (B r/(1+r) - slot) // slot, KV (B - (K+1) slot) // cell."""
    cfg = CacheConfig(4096, 1, layout="mamba-hybrid")  # 3 x mamba 528 + 1 full: B = 16384
    slot = 3 * 528
    k = int((16384 * 0.9 / 1.9 - slot) // slot)
    assert mamba_pool_sizes(cfg) == (k, 16384 - (k + 1) * slot) == (3, 10048)
    assert mamba_pool_sizes(cfg, ratio=3.0) == (6, 16384 - 7 * slot)
    assert mamba_pool_sizes(cfg, max_states=2) == (2, 16384 - 3 * slot)


@pytest.mark.parametrize(
    "config, options, message",
    [
        (CacheConfig(64, 4, layout=LAYOUT), {}, "page_size must be 1"),
        (CacheConfig(64, 1, layout=[("mamba", 2), ("sliding_window", 4), ("full",)]), {}, "sliding-window"),
        (CacheConfig(64, 1), {"mamba_admission": "marconi"}, "mamba_admission: not an option of radix over"),
        (CacheConfig(4, 1, layout=[("mamba", 8), ("full",)]), {}, "state slots"),
        (CacheConfig(64, 1, layout=LAYOUT), {"mamba_admission": "all"}, "mamba_admission"),
        (CacheConfig(64, 1, layout=LAYOUT), {"eviction_policy": "lfu"}, "eviction_policy"),
        (CacheConfig(64, 1, layout=LAYOUT), {"mamba_full_memory_ratio": 0}, "ratio"),
        (CacheConfig(64, 1, layout=LAYOUT), {"max_mamba_cache_size": 0}, "max_mamba_cache_size"),
        (CacheConfig(64, 1, layout=LAYOUT), {"need_sort": True}, "need_sort"),
    ],
)
def test_unsupported_configs_raise(config: CacheConfig, options: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        RadixPrefixCache(config, **options)  # type: ignore[arg-type]


def test_kv_groups_and_page_tables_contract() -> None:
    cfg = CacheConfig(40, 1, layout=[("full",), ("mamba", 2), ("mamba", 2), ("full",)])
    cache = RadixPrefixCache(cfg)
    full, mamba = cache.kv_groups()
    k, t = cache.component.sizes
    assert full == type(full)("full", None, "full", 1, t + 1, (0, 3))
    assert mamba == type(mamba)("mamba", None, "mamba", 1, k + 1, (1, 2))
    req = Request("a", [1, 2, 3, 4])
    assert cache.allocate(req, 4)
    kv, (slot,) = cache.page_tables(req)
    assert len(kv) == 4 and 0 not in kv and 1 <= slot <= k
    req.num_computed_tokens = 4
    cache.commit(req)
    assert cache.page_tables(req)[1] == [slot], "the request keeps its own state slot"
    cache.check_invariants()


# ---------------------------------------------------------------------------- SGLang semantics
def test_states_at_every_chunk_end_and_at_finish() -> None:
    """no_buffer: cache_unfinished_req copies the state at each prefill chunk end; the finish
    donates the request's own slot at its last computed token (output included)."""
    cache = _cache(60)
    req = _run(cache, "a", list(range(1, 11)), [3, 4, 3], outputs=2)
    assert [d for d, _ in cache.component.state_slots()] == [3, 7, 10, 12]
    assert req.num_computed_tokens == 12


def test_hit_is_cut_back_to_the_deepest_checkpoint() -> None:
    """A shared prefix with no state at its end is no hit: the match is cut back to the last
    node holding a state (here 3, a chunk end), though the full KV matches 6 tokens."""
    cache = _cache(60)
    _run(cache, "a", [1, 2, 3, 4, 5, 6, 7, 8], [3, 5])
    b = Request("b", [1, 2, 3, 4, 5, 6, 9, 9])
    m = cache.lookup(b)
    assert (m.tokens, m.full_hit) == (3, 6)  # type: ignore[attr-defined]
    assert cache.allocate(b, 5, m) and b.num_computed_tokens == 3
    assert cache.request_kv(b).cow_source == dict((d, s) for d, s in cache.component.state_slots())[3]


def test_state_eviction_tombstones_internal_nodes_and_deletes_leaves() -> None:
    """Mamba LRU eviction: the internal node at 6 keeps its KV without its state, the leaf
    at 8 goes whole; the KV alone then matches 6 tokens but hits none."""
    cache = _cache(60)
    _run(cache, "a", [1, 2, 3, 4, 5, 6], [6])
    _run(cache, "b", [1, 2, 3, 4, 5, 6, 7, 8], [2])
    assert [d for d, _ in cache.component.state_slots()] == [6, 8]
    assert cache.evict_component(2) == 2 and cache.component.state_slots() == []
    assert cache.usage().evictable == 6
    m = cache.lookup(Request("c", [1, 2, 3, 4, 5, 6, 7]))
    assert (m.tokens, m.full_hit) == (0, 6)  # type: ignore[attr-defined]


def test_split_leaves_the_upper_part_without_a_state() -> None:
    """A match ending inside a node splits it; the state stays with the lower part, whose end
    it describes (redistribute_on_node_split)."""
    cache = _cache(60)
    _run(cache, "a", [1, 2, 3, 4, 5, 6], [6])
    cache.lookup(Request("b", [1, 2, 3, 9]))  # splits [1..6] at 3
    assert [len(n.key) for n in cache.tree.root_node.children[1].children.values()] == [3]
    assert [d for d, _ in cache.component.state_slots()] == [6]


def test_mamba_lock_holds_only_the_node() -> None:
    """A running request pins its node's state; its ancestors' states can still go (their KV
    stays: the full lock covers the path)."""
    cache = _cache(60)
    _run(cache, "a", [1, 2, 3, 4, 5, 6], [3, 3])  # states at 3 and 6
    b = Request("b", [1, 2, 3, 4, 5, 6, 7])
    assert cache.allocate(b, 1)  # hit 6: locks the node ending at 6
    assert cache.evict_component(5) == 1  # only the state at 3 is free to go (a tombstone)
    assert [d for d, _ in cache.component.state_slots()] == [6]
    assert cache.usage().evictable == 0, "the KV of the locked path stays"
    cache.check_invariants()


# ---------------------------------------------------------------------------- Marconi
def test_marconi_admission_holds_fewer_states() -> None:
    """Marconi stores no state at plain chunk ends: a chunked prefill leaves one state (the
    finish) where SGLang leaves one per chunk."""
    sglang, marconi = _cache(60), _cache(60, mamba_admission="marconi")
    for cache in (sglang, marconi):
        _run(cache, "a", list(range(1, 13)), [3, 3, 3, 3])
    assert [d for d, _ in sglang.component.state_slots()] == [3, 6, 9, 12]
    assert [d for d, _ in marconi.component.state_slots()] == [12]


def test_marconi_admission_checkpoints_the_junction() -> None:
    """A request diverging from a cached prefix checkpoints the state at the junction, so a
    third request sharing only that prefix hits it (SGLang: 0)."""
    hits = {}
    for admission in ("sglang", "marconi"):
        cache = _cache(60, mamba_admission=admission)
        _run(cache, "a", [1, 2, 3, 4, 5, 6, 7, 8], [8])
        _run(cache, "b", [1, 2, 3, 4, 5, 9, 9, 9], [8])
        hits[admission] = cache.lookup(Request("c", [1, 2, 3, 4, 5, 7, 7])).tokens
    assert hits == {"sglang": 0, "marconi": 5}


def test_marconi_eviction_keeps_the_long_prefix() -> None:
    """LRU drops the older state however much it saves; Marconi's FLOP-aware score drops the
    recent short one and the long (costly to recompute) hit stays."""
    kept = {}
    for policy in ("lru", "marconi"):
        cache = _cache(200, eviction_policy=policy, marconi_alpha=2.0)
        _run(cache, "long", list(range(1, 41)), [40])
        _run(cache, "short", [90, 91], [2])
        cache.evict_component(1)
        kept[policy] = [d for d, _ in cache.component.state_slots()]
    assert kept == {"lru": [2], "marconi": [40]}


def test_prefix_flops_grow_quadratically_with_attention() -> None:
    assert prefix_flops(10, 3, 1, 4096) == 4 * 10 + 100 / 8192
    assert prefix_flops(20, 0, 1, 1) - 2 * prefix_flops(10, 0, 1, 1) == 100


# ---------------------------------------------------------------------------- stale matches
# Regressions from the lifecycle machine (test_stateful_mamba_radix.py, thorough profile).
MACHINE_LAYOUT = [("mamba", 4), ("full",)]  # the machine's: 4 state slots, 28 KV slots


def _machine_cache(**options: object) -> RadixPrefixCache:
    return RadixPrefixCache(CacheConfig(24, 1, layout=MACHINE_LAYOUT), **options)  # type: ignore[arg-type]


def _finish(cache: RadixPrefixCache, rid: str, tokens: list[int]) -> None:
    """The machine's finish_at_prefill: admit with the hit, compute the rest, release."""
    req = Request(rid, tokens)
    match = cache.lookup(req)
    assert cache.allocate(req, req.num_tokens - match.tokens, match)
    req.num_computed_tokens = req.num_tokens
    cache.release(req)
    cache.check_invariants()


def _hit_is_a_fresh_lookups(cache: RadixPrefixCache, req: Request) -> None:
    """The live ``req``'s hit is what a lookup finds now: its KV slots are the tree's for its
    tokens and its state was copied from a tree state of exactly the hit's depth."""
    hit, src = req.num_computed_tokens, cache.request_kv(req).cow_source
    assert (hit == 0) == (src == 0), f"hit {hit} with state source {src}"
    if hit:
        held = cache.component.state_slots()
        assert (hit, src) in held, f"hit {hit}: slot {src} is not a state of that depth"
    now = cache.lookup(Request("twin", req.all_token_ids))
    assert hit == now.tokens, f"hit {hit}, a lookup now finds {now.tokens}"
    assert cache.page_tables(req)[0][:hit] == cache.tree.path_indices(now.last_node).tolist()  # type: ignore[attr-defined]


MARCONI = {"mamba_admission": "marconi", "eviction_policy": "marconi"}
BOTH = pytest.mark.parametrize("options", [{}, MARCONI], ids=["sglang", "marconi"])


# Every one below is one cause: the backend's reset built a new tree whose version restarted,
# so once the new tree had changed as often as the old one had when a match was taken, that
# match was trusted: its node, KV slots and state slot of the old tree, now another's.
def _match_of_the_old_tree(cache: RadixPrefixCache, cached: list[int], probe: list[int]) -> tuple:
    """r1 = ``cached`` finishes, r2 = ``probe`` is looked up (hitting all of r1): (r2, its match),
    to be admitted after a reset."""
    _finish(cache, "r1", cached)
    r2 = Request("r2", probe)
    match = cache.lookup(r2)
    assert match.tokens == len(cached)
    return r2, match


@BOTH
def test_a_stale_match_after_a_reset_copies_no_other_requests_state(options: dict) -> None:
    """Machine: "r2 hit 1 but its state is of (None, (0, 0))"."""
    cache = _machine_cache(**options)
    r2, match = _match_of_the_old_tree(cache, [0], [0, 0])
    assert cache.reset()
    _finish(cache, "r3", [0, 0])  # the new tree reaches the old version; slot 1 holds (0, 0)
    assert cache.revalidate(match) is not match
    assert cache.allocate(r2, 1, match)
    _hit_is_a_fresh_lookups(cache, r2)
    cache.check_invariants()


@BOTH
def test_a_stale_match_after_a_reset_reads_no_other_tokens_kv(options: dict) -> None:
    """Machine: "hit of a stale match: KV of position 1"."""
    cache = _machine_cache(**options)
    r2, match = _match_of_the_old_tree(cache, [0, 0], [0, 0, 0])
    assert cache.reset()
    _finish(cache, "r3", [0, 1])  # KV slots 1, 2 hold (0,), (0, 1) now
    assert cache.allocate(r2, 1, match)
    _hit_is_a_fresh_lookups(cache, r2)
    cache.check_invariants()


@BOTH
def test_a_stale_match_after_a_reset_locks_no_node_of_the_old_tree(options: dict) -> None:
    """Machine: "KV pool: negative count in PageUsage(free=25, evictable=-2, in_use=5)": the
    lock on the old node took its 3 tokens off the new tree's evictable count."""
    cache = _machine_cache(**options)
    r2, match = _match_of_the_old_tree(cache, [0, 0, 0], [0, 0, 0, 0])
    assert cache.reset()
    _finish(cache, "r3", [1])
    assert cache.allocate(r2, 1, match)
    cache.check_invariants()
    _hit_is_a_fresh_lookups(cache, r2)


@BOTH
def test_a_stale_match_after_a_reset_hits_only_with_a_state(options: dict) -> None:
    """Machine: "a hit of 2 with no state to copy": the old node's state was evicted before the
    reset (the version moved on), and the new tree reached that version again."""
    cache = _machine_cache(**options)
    r2, match = _match_of_the_old_tree(cache, [0], [0, 0])
    assert cache.evict_component(1) == 1
    assert cache.reset()
    _finish(cache, "r3", [1])  # the new tree at the match's version; its node has no state
    assert cache.allocate(r2, 1, match)
    _hit_is_a_fresh_lookups(cache, r2)
    cache.check_invariants()


@BOTH
def test_a_stale_match_after_a_reset_is_refused_when_no_state_comes_free(options: dict) -> None:
    """Machine: the bare ``assert ok`` in ``_admit``: the lock on the old node (holding a state)
    took the new tree's evictable state count to -1, so the admission saw a state to evict
    where there was none."""
    cache = _machine_cache(**options)
    r2, match = _match_of_the_old_tree(cache, [0], [0, 0])
    assert cache.reset()
    _finish(cache, "r3", [1])
    for rid, tokens in (("a", [1, 2]), ("b", [2]), ("c", [2, 2])):  # every state slot taken
        assert cache.allocate(Request(rid, tokens), 1)
    assert cache.component_usage() == (0, 0, cache.component.sizes.states)
    assert not cache.allocate(r2, 1, match)
    cache.check_invariants()


def test_node_ids_are_never_reused_across_a_reset() -> None:
    """The Mamba LRU is keyed by node id: a node of before a reset (held by a stale match) must
    not share its id with a node of the tree after it (SGLang's TreeNode.counter never restarts)."""
    cache = _machine_cache()
    _finish(cache, "r1", [0])
    old = {n.id for n in cache.tree.iter_nodes()} | {cache.tree.root_node.id}
    assert cache.reset()
    _finish(cache, "r2", [1])
    new = {n.id for n in cache.tree.iter_nodes()} | {cache.tree.root_node.id}
    assert not old & new
