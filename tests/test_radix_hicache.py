"""The radix host tier against SGLang 0.5.23's HiCache (``UnifiedRadixCache`` + ``init_hicache``),
scenarios 1-4 of REFERENCE-tiers.md (b) as its section "Checked by running the pinned code on
CPU" states them, and the rules of hicache_tree.py one by one. Every expectation follows the
0.5.23 code as installed (.venv-upstream); the recorded fixtures are in test_radix_hicache_upstream.py."""

from __future__ import annotations

import itertools
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prefixcache.backends.radix import RadixPrefixCache
from prefixcache.backends.radix.hicache_backend import HiCacheRadixPrefixCache
from prefixcache.backends.radix.hicache_pool import HostPool
from prefixcache.backends.radix.hicache_tree import HiRadixCache
from prefixcache.backends.radix.key import RadixKey
from prefixcache.backends.radix.tree import TreeNode

from prefixcache import CacheConfig, Request, make_cache
from prefixcache.tiers import HostTierConfig
from tests.helpers import Checked, run_to_completion, tokens

pytestmark = pytest.mark.filterwarnings("ignore:HiCache host pool")


def hicache(capacity: int, page_size: int = 1, **tier: object) -> Checked:
    clock = itertools.count().__next__  # a logical clock, as 0.5.23's time counter
    tier_cfg = HostTierConfig(**tier)  # type: ignore[arg-type]
    return Checked(make_cache("radix", CacheConfig(capacity, page_size), host_tier=tier_cfg, clock=clock))


def serve(cache: Checked, req: Request, num_output: int = 1, *, ack: bool = True) -> tuple[int, int]:
    """Admit (one prefill chunk), decode ``num_output`` tokens as the engine does (the last one
    sampled, its KV never computed), release; then a scheduler step acks the writes.
    Returns (device hit, host tokens loaded)."""
    m = cache.lookup(req)
    assert not m.pending
    assert cache.allocate(req, req.num_tokens - m.tokens - m.host_tokens, m)
    assert req.num_computed_tokens == m.tokens + m.host_tokens
    req.num_computed_tokens = req.num_tokens
    cache.commit(req)
    for i in range(num_output):
        req.append_output_token_ids(40_000 + i)
        if i < num_output - 1:
            assert cache.allocate(req, 1)
            req.num_computed_tokens += 1
            cache.commit(req)
    cache.release(req)
    if ack:
        cache.host_tier.advance_transfers()
    return m.tokens, m.host_tokens


def nodes(cache: Checked) -> list[TreeNode]:
    return cache.cache.tree.iter_nodes()  # type: ignore[no-any-return]


def state(node: TreeNode) -> str:
    return {(True, False): "device", (True, True): "device+host", (False, True): "host"}[
        (node.value is not None, node.host_value is not None)
    ]


# ---------------------------------------------------------------------------- scenarios
def test_scenario_1_write_through_backup_survives_device_eviction() -> None:
    """0.5.23 write_through: A's node is backed up at its insert (hit_count 1), survives the
    device eviction X forces as host-only, and B = A + 10 loads all 1000 at admission
    (evicting X's device copy first), extending 10."""
    cache = hicache(1100)
    a = tokens(1000, 1)
    serve(cache, Request("a", a))
    assert cache.stats.stored_tokens == 1000
    serve(cache, Request("x", tokens(1000, 2)))  # device pressure: A's node is demoted
    assert sorted(state(n) for n in nodes(cache)) == ["device+host", "host"]
    b = Request("b", a + tokens(10, 3))
    m = cache.lookup(b)
    assert (m.tokens, m.host_tokens) == (0, 1000)
    assert cache.allocate(b, 10, m)
    assert b.num_computed_tokens == 1000 and cache.host_tier.loaded_tokens(b) == 1000
    assert cache.stats.host_hits == 1000 and cache.stats.loaded_tokens == 1000
    assert cache.host_tier.metrics() == {"cached_tokens_device": 0, "cached_tokens_host": 1000}
    a_node = next(n for n in nodes(cache) if n.key.token_ids[0] == a[0])
    assert state(a_node) == "device+host"
    assert cache.page_table(b)[:1000] == a_node.value.tolist()  # type: ignore[union-attr]


@pytest.mark.parametrize(("policy", "host_hit"), [("write_through", 1049), ("write_through_selective", 0)])
def test_scenario_2_selective_vs_write_through_follow_up_turn(policy: str, host_hit: int) -> None:
    """0.5.23: the follow-up turn (A's prompt + 50 outputs + new) after A left the device hits
    prompt + the 49 outputs with KV on host under write_through; under selective, 0: a
    request counts each node once, so A's prompt stays at hit_count 1 (< 2)."""
    cache = hicache(1200, write_policy=policy)
    a = Request("a", tokens(1000, 1))
    serve(cache, a, num_output=50)
    assert cache.evict(5000) == 1049
    turn2 = Request("t2", list(a.all_token_ids) + tokens(20, 4))
    m = cache.lookup(turn2)
    assert (m.tokens, m.host_tokens) == (0, host_hit)


def test_scenario_2_selective_backs_up_on_the_second_request() -> None:
    """0.5.23 selective: a second request through A's prompt brings the prompt node to
    hit_count 2 and backs it up; the second request's own new leaf is at 1 and is not."""
    cache = hicache(1200, write_policy="write_through_selective")
    a = tokens(1000, 1)
    serve(cache, Request("a", a))
    assert cache.stats.stored_tokens == 0
    serve(cache, Request("a2", a + tokens(30, 5)))
    assert cache.stats.stored_tokens == 1000  # the shared prompt node only
    cache.evict(5000)
    m = cache.lookup(Request("b", a + tokens(30, 5)))
    assert (m.tokens, m.host_tokens) == (0, 1000)


def test_scenario_3_small_host_hit_is_recomputed() -> None:
    """0.5.23 load_back_threshold = 10: 500 device tokens then 8 host-only -> the 8 are
    recomputed (host_tokens 0), and the insert after them restores the host-only node from
    the request's own KV instead of freeing it."""
    cache = hicache(1200)
    a = tokens(500, 1)
    tail = tokens(8, 2)
    serve(cache, Request("a", a))
    serve(cache, Request("a8", a + tail))
    assert cache.evict(8) == 8  # the 8-token leaf: device -> host
    b = Request("b", a + tail + tokens(5, 3))
    m = cache.lookup(b)
    assert (m.tokens, m.host_hit_length, m.host_tokens) == (500, 8, 0)
    assert cache.allocate(b, b.num_tokens - 500, m)
    assert b.num_computed_tokens == 500 and cache.host_tier.loaded_tokens(b) == 0
    mine = cache.page_table(b)[500:508]
    b.num_computed_tokens = b.num_tokens
    cache.commit(b)
    eight = next(n for n in nodes(cache) if len(n.key) == 8)
    assert state(eight) == "device+host"
    assert eight.value.tolist() == mine  # type: ignore[union-attr]  # adopted, not freed
    assert cache.page_table(b)[500:508] == mine
    cache.release(b)


def test_scenario_3_threshold_boundary() -> None:
    """A host tail of exactly 10 tokens is loaded, 9 is not (``kv_tokens < threshold``)."""
    for tail_len, loaded in ((10, 10), (9, 0)):
        cache = hicache(1200)
        a = tokens(100, 1)
        tail = tokens(tail_len, 2)
        serve(cache, Request("a", a))
        serve(cache, Request("a+", a + tail))
        cache.evict(tail_len)
        m = cache.lookup(Request("b", a + tail + [1, 2]))
        assert (m.tokens, m.host_tokens) == (100, loaded)


def test_load_back_threshold_is_configurable() -> None:
    cache = hicache(1200, load_back_threshold=0)
    a = tokens(100, 1)
    serve(cache, Request("a", a))
    serve(cache, Request("a+", a + [5]))
    cache.evict(1)
    m = cache.lookup(Request("b", a + [5, 6]))
    assert (m.tokens, m.host_tokens) == (100, 1)  # max(1, threshold): one token still loads


@pytest.mark.parametrize("evicted", [False, True])
def test_scenario_4_page_alignment(evicted: bool) -> None:
    """0.5.23 page_size 64, prompt 1000 fully cached: match key 999 tokens -> 960 reused
    (from device, or loaded from host), 40 computed."""
    cache = hicache(64 * 40, page_size=64)
    a = tokens(1000, 1)
    serve(cache, Request("a", a))
    if evicted:
        assert cache.evict(5000) == 960
    b = Request("b", list(a))
    m = cache.lookup(b)
    assert (m.tokens, m.host_tokens) == ((0, 960) if evicted else (960, 0))
    assert cache.allocate(b, 40, m)
    assert b.num_computed_tokens == 960


# ---------------------------------------------------------------------------- write policies
def test_write_through_lock_is_held_until_the_ack() -> None:
    cache = hicache(1200)
    serve(cache, Request("a", tokens(100, 1)), ack=False)
    assert cache.host_tier.usage().in_use == 100  # the copy in flight
    assert cache.usage().evictable == 0 and cache.evict(1000) == 0
    assert cache.decode_steps_in_place(Request("z", [1, 2])) == 0
    cache.host_tier.advance_transfers()
    assert cache.host_tier.usage() == (2399 - 100, 100, 0)
    assert cache.evict(1000) == 100
    assert [state(n) for n in nodes(cache)] == ["host"]


def test_a_load_pins_its_nodes_until_the_next_steps_ack() -> None:
    """0.5.23 ``ongoing_load_back``: the loaded anchor stays locked (device and host) until
    ``loading_check`` at the next scheduler step, even once its request has finished."""
    cache = hicache(1200, page_size=4, write_policy="write_back")
    a = tokens(400, 1)
    serve(cache, Request("a", a))
    cache.evict(1000)
    b = Request("b", list(a))
    assert serve(cache, b, ack=False) == (0, 396)  # 399 looked up: 99 whole pages
    assert cache.usage().in_use == 99 and cache.host_tier.usage().in_use == 99
    cache.host_tier.advance_transfers()
    assert cache.usage().in_use == 0 and cache.host_tier.usage().in_use == 0


def test_write_back_copies_only_at_device_eviction() -> None:
    cache = hicache(1200, write_policy="write_back")
    a = tokens(100, 1)
    serve(cache, Request("a", a))
    serve(cache, Request("a2", a))
    assert cache.stats.stored_tokens == 0
    assert [n.hit_count for n in nodes(cache)] == [0, 0]  # write_back counts nothing
    assert cache.evict(1000) == 100
    assert cache.stats.stored_tokens == 100 and [state(n) for n in nodes(cache)] == ["host", "host"]


def test_selective_split_prefix_keeps_its_count() -> None:
    """Selective: a split keeps the node's hit_count (``_split_node``), so the second request
    through the shared 50 tokens brings them to 2; its own new leaf is at 1 until a third."""
    cache = hicache(1200, write_policy="write_through_selective")
    a = tokens(50, 1)
    serve(cache, Request("a", a + tokens(20, 2)))
    serve(cache, Request("a2", a + tokens(20, 3)))  # splits at 50: the prefix is at 2
    assert cache.stats.stored_tokens == 50
    serve(cache, Request("a3", a + tokens(20, 3)))  # the second leaf reaches 2
    assert cache.stats.stored_tokens == 70
    # a3's match (69 tokens) split its leaf 19 | 1; both halves reach 2 at its insert
    assert sorted(state(n) for n in nodes(cache)) == ["device"] + ["device+host"] * 3


# ---------------------------------------------------------------------------- host eviction
def test_host_eviction_takes_only_device_evicted_childless_nodes() -> None:
    """A host pool of 251 slots holds two 100-token copies: the third copy frees the LRU
    host-only leaf (a), never the copy of a node still on device (b): write_through keeps L2
    inclusive of what is backed up on device."""
    cache = hicache(400, capacity_tokens=250)  # 251 host slots
    a, b, c = tokens(100, 1), tokens(100, 2), tokens(100, 3)
    serve(cache, Request("a", a))
    serve(cache, Request("b", b))
    cache.evict(100)  # a (LRU) -> host-only; b stays device+host
    serve(cache, Request("c", c))  # c's copy needs 100: 51 free -> a's copy goes
    assert cache.stats.host_evicted_tokens == 100
    assert sorted(state(n) for n in nodes(cache)) == ["device+host", "device+host"]
    assert cache.lookup(Request("a?", a + [1])).host_tokens == 0


def test_host_full_of_device_copies_refuses_the_backup() -> None:
    """No host-only leaf to evict: the second copy is not made (the node stays device-only)."""
    cache = hicache(400, capacity_tokens=150)  # 151 host slots
    serve(cache, Request("a", tokens(100, 1)))
    serve(cache, Request("b", tokens(100, 2)))
    assert cache.stats.stored_tokens == 100 and cache.stats.host_evicted_tokens == 0
    assert sorted(state(n) for n in nodes(cache)) == ["device", "device+host"]


def test_write_back_host_eviction_reclaims_device_copies_first() -> None:
    """0.5.23 write_back: host pressure first drops host copies of nodes still on device
    (``_reclaim_full_host_duplicates``), before host-only leaves: b's host-only copy (the
    LRU host leaf) survives, a's copy (a is on device again) goes."""
    cache = hicache(400, capacity_tokens=250, write_policy="write_back")
    a, b, c = tokens(100, 1), tokens(100, 2), tokens(100, 3)
    serve(cache, Request("a", a))
    serve(cache, Request("b", b))
    assert cache.evict(200) == 200  # both written back, host-only; 51 host slots free
    serve(cache, Request("a2", a + [9]))  # loads a back: a is device + host now
    assert cache.stats.loaded_tokens == 100
    serve(cache, Request("c", c))
    cache.lookup(Request("a2?", a + [9, 9]))  # a's path is now newer than c
    assert cache.evict(100) == 100  # c is written back: 100 > 51 free host slots
    assert cache.stats.host_evicted_tokens == 100
    by_first = {n.key.token_ids[0]: state(n) for n in nodes(cache) if len(n.key) == 100}
    assert by_first == {a[0]: "device", b[0]: "host", c[0]: "host"}
    assert cache.lookup(Request("b?", b + [1])).host_tokens == 100


# ---------------------------------------------------------------------------- admission
def test_load_back_is_all_or_nothing() -> None:
    """The load needs the tail's pages and the extend's at once: if even evicting every
    unpinned device node cannot give both, allocate refuses and changes nothing."""
    cache = hicache(300)
    a = tokens(200, 1)
    serve(cache, Request("a", a))
    cache.evict(500)
    holder = Request("h", tokens(150, 2))
    assert cache.allocate(holder, 150)  # pins 150 of the 299 device pages
    b = Request("b", a + tokens(10, 3))
    m = cache.lookup(b)
    assert m.host_tokens == 200
    before = (cache.usage(), cache.host_tier.usage(), [state(n) for n in nodes(cache)])
    assert not cache.allocate(b, 10, m)
    assert (cache.usage(), cache.host_tier.usage(), [state(n) for n in nodes(cache)]) == before
    assert not cache.is_live(b)


def test_default_tier_sizes_and_fields() -> None:
    assert hicache(1200).cache.host_size == 2399  # ratio 2.0, one page more (padding page)
    assert hicache(64 * 40, page_size=64, ratio=3.0).cache.host_size == (39 * 64 * 3 // 64 + 1) * 64
    assert hicache(64 * 40, page_size=64, capacity_tokens=3000).cache.host_size == 47 * 64
    cache = hicache(1200)
    assert cache.cache.write_policy == "write_through" and cache.cache.load_back_threshold == 10
    assert cache.host_tier.config == HostTierConfig() and cache.host_tier.load_overlapped is True
    assert cache.host_tier.num_pages() == 2399


def test_no_tier_is_the_plain_radix_cache() -> None:
    cache = make_cache("radix", CacheConfig(64, 4), host_tier=None)
    assert type(cache) is RadixPrefixCache and cache.host_tier is None


# ---------------------------------------------------------------------------- bad values
@pytest.mark.parametrize(
    "field",
    [{"eviction_policy": "lru"}, {"block_size": 16}, {"store_threshold": 2}, {"offload_prompt_only": True}],
)
def test_hashchain_only_fields_are_refused(field: dict[str, object]) -> None:
    with pytest.raises(ValueError, match="radix host tier has no"):
        make_cache("radix", CacheConfig(64, 1), host_tier=HostTierConfig(**field))  # type: ignore[arg-type]


def test_bad_values_are_clear_errors() -> None:
    with pytest.raises(ValueError, match="capacity_tokens"):
        HostTierConfig(capacity_tokens=-1)
    with pytest.raises(ValueError, match="ratio"):
        HostTierConfig(ratio=-2.0)
    with pytest.raises(ValueError, match="unknown write_policy"):
        HostTierConfig(write_policy="write_sometimes")
    with pytest.raises(ValueError, match="full-attention"):
        make_cache("radix", CacheConfig(256, 1, layout="gemma3-like"), host_tier=HostTierConfig())
    with pytest.raises(ValueError, match="HostTierConfig"):
        make_cache("radix", CacheConfig(64, 1), host_tier={"ratio": 2})


def test_a_host_pool_no_larger_than_the_device_pool_warns() -> None:
    """0.5.23 logs a warning (``_allocate_host_buffer``), it does not assert."""
    with pytest.warns(UserWarning, match="smaller than the device pool"):
        cache = make_cache("radix", CacheConfig(1200, 1), host_tier=HostTierConfig(ratio=0.5))
    assert isinstance(cache, HiCacheRadixPrefixCache) and cache.host_size == 600
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        make_cache("radix", CacheConfig(1200, 1), host_tier=HostTierConfig(capacity_tokens=1199))


@pytest.mark.parametrize("policy", ["write_through", "write_through_selective", "write_back"])
def test_engine_runs_the_radix_host_tier_with_loads_in_the_same_forward(policy: str) -> None:
    """Through the engine (prefixcache/engine.py): two prefix families taking turns, two
    requests each (selective backs a prefix up at its second use), on a device that holds
    one; the host serves each back at admission, overlapped with the forward."""
    from prefixcache.engine import Engine

    cfg = CacheConfig(capacity_tokens=16 * 40, page_size=16)
    cache = make_cache("radix", cfg, host_tier=HostTierConfig(write_policy=policy))
    engine = Engine(cache, "fcfs", token_budget=4096, check_invariants=True)
    families = (list(range(1, 257)), list(range(2001, 2257)))
    for i in range(12):
        prompt = families[i // 2 % 2] + [5000 + j + 300 * i for j in range(300)]
        engine.add_request(Request(f"r{i}", prompt, max_new_tokens=2, arrival_time=float(i)))
    engine.run()
    assert engine.num_finished == 12
    assert cache.stats.host_hits > 0 and cache.stats.loaded_tokens == cache.stats.host_hits
    assert cache.host_tier.metrics()["cached_tokens_host"] == cache.stats.loaded_tokens
    assert cache.host_tier.usage().in_use == 0 and cache.host_tier.load_overlapped is True


# ---------------------------------------------------------------------------- host index
def _tree_state(cache: Checked) -> list[tuple[tuple[int, ...], str, tuple[int, ...] | None]]:
    return [(tuple(n.key.token_ids), state(n), None if n.host_value is None else tuple(n.host_value.tolist()))
            for n in nodes(cache)]  # fmt: skip


@settings(max_examples=60, deadline=None)
@given(
    write_policy=st.sampled_from(["write_through", "write_back", "write_through_selective"]),
    stream=st.lists(st.tuples(st.integers(0, 5), st.integers(1, 60), st.integers(1, 4)),
                    min_size=4, max_size=40),
)
def test_the_host_index_pops_what_the_tree_scan_pops(
    write_policy: str, stream: list[tuple[int, int, int]]
) -> None:
    """Under LRU, host eviction takes its victims from the host index (``_pop_host_leaf``);
    the same stream through a cache that lists the tree on every call instead (0.5.23's scan)
    ends every request with the same hits and the same tree, host slots included. Prompts
    share six prefixes and grow in turns, so the host fills and evicts."""
    caches = [hicache(300, capacity_tokens=200, write_policy=write_policy) for _ in range(2)]
    caches[1].cache.tree._host_index = None  # the scan
    for i, (prefix, length, turns) in enumerate(stream):
        prompt = tokens(40, 100 + prefix) + tokens(length, 1000 + i)
        for turn in range(turns):
            hits = [serve(c, Request(f"r{i}-{turn}", prompt + tokens(5 * turn, 7))) for c in caches]
            assert hits[0] == hits[1]
            assert _tree_state(caches[0]) == _tree_state(caches[1])
    assert caches[0].stats.host_evicted_tokens == caches[1].stats.host_evicted_tokens


TLRU_CASES = [
    # A's 20 tokens split at 10 by B: the shared prefix keeps 10 tokens after it (the split)
    ([list(range(1, 21)), [*range(1, 11), *range(100, 110)], list(range(500, 505))],
     [[11], [100], [500], [1]]),
    # E extends A's 8 tokens by 8: A's node now has 8 tokens after it (the insert's walk)
    ([list(range(1, 9)), list(range(1, 17)), list(range(500, 505))], [[9], [500], [1]]),
]


@pytest.mark.parametrize(("prompts", "order"), TLRU_CASES)
def test_tlru_evicts_from_the_device_as_the_dense_tree_does(
    prompts: list[list[int]], order: list[list[int]]
) -> None:
    """tlru ranks an entry by the tokens its last request held after it (``tail_tokens``):
    HiCache's insert and split keep them as the dense tree's do, so the device evicts in the
    same order with or without a host tier. With a slack of 15 the shared node (10 or 8 tokens
    with as many after it) is not excess: D (5 tokens, excess) goes before it. A shared node
    whose tail read 0 would be excess, and older than D."""

    def device_order(host_tier: HostTierConfig | None) -> list[list[int]]:
        options = {"host_tier": host_tier} if host_tier is not None else {}
        cache = make_cache("radix", CacheConfig(96, 1), eviction_policy="tlru", **options)
        cache.tree.policy.slack = 15  # type: ignore[attr-defined]

        def settle() -> None:
            if host_tier is not None:
                cache.host_tier.advance_transfers()  # acks unlock the written nodes

        for i, prompt in enumerate(prompts):
            run_to_completion(cache, Request(f"r{i}", prompt))
            settle()
        evicted = []
        while True:
            on_device = {n.key.tolist()[0]: n for n in cache.tree.iter_nodes() if n.value is not None}
            if not cache.evict(1):
                return evicted
            settle()
            gone = (first for first, n in on_device.items() if n.value is None or n.parent is None)
            evicted.append(sorted(gone))

    assert device_order(None) == order
    assert device_order(HostTierConfig(write_policy="write_through", ratio=4.0)) == order


@pytest.mark.parametrize("host_tier", [None, HostTierConfig(write_policy="write_through", ratio=4.0)])
def test_a_checkpoint_sets_the_tail_of_nodes_another_request_cached(host_tier: HostTierConfig | None) -> None:
    """tlru reads ``tail_tokens``. A checkpoint that walks past its own locked path, over a node
    another request cached after it was admitted, sets that node's tail (the tokens its key
    holds after it), with or without a host tier."""
    options = {} if host_tier is None else {"host_tier": host_tier}
    cache = make_cache("radix", CacheConfig(96, 1), eviction_policy="tlru", **options)
    a, b = Request("a", list(range(1, 11))), Request("b", [*range(1, 11), 50, 51, 52, 53])
    for req in (a, b):  # both admitted before either is cached: b's lock stays at the root
        assert cache.allocate(req, req.num_tokens, cache.lookup(req))
    for req in (a, b):
        req.num_computed_tokens = req.num_tokens
        cache.commit(req)
        cache.check_invariants()
    shared = next(n for n in cache.tree.iter_nodes() if n.key.tolist()[0] == 1)
    assert len(shared.key) == 10 and shared.tail_tokens == 4


def test_a_match_stamps_the_host_only_tail_it_walks() -> None:
    """A match stamps its path down to the deepest node it reaches, host-only ones included
    (SGLang's best_match_node with HiCache on): a host tail just looked up is the most recently
    used, so host eviction takes an older one first."""
    tree = HiRadixCache(
        1, host_pool=HostPool(16, 1), write_policy="write_through", clock=itertools.count().__next__
    )
    a, b = RadixKey([1, 2, 3, 4]), RadixKey([10, 11, 12, 13])
    tree.insert(a, np.arange(1, 5))  # write_through: each backed up at its first hit ...
    tree.insert(b, np.arange(5, 9))
    tree.ack_writes()  # ... and unlocked at the ack
    assert tree.evict(8) == 8  # a first (older), then b: both host-only now

    def first(key: RadixKey) -> TreeNode:
        return tree.root_node.children[key.child_key(1)]

    assert first(a).evicted and first(b).evicted
    m = tree.match_with_host(RadixKey([1, 2, 3, 4, 5]))
    assert (m.device.length, m.host_hit_length, m.best_node) == (0, 4, first(a))
    assert tree.evict_host(4) == 4  # b's copy goes: a's was stamped by the match
    assert first(a).backuped and b.child_key(1) not in tree.root_node.children
    tree.check()
