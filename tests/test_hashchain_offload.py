"""The hashchain host tier against vLLM 0.33.0's OffloadingConnector (scheduler side) and
CPUOffloadingManager.

The fixtures under tests/fixtures/upstream/offload/ were recorded by running the real pinned
vLLM 0.33.0 code on CPU (experiments/upstream/vllm_offload_driver.py: the connector scheduler,
the CPU spec and manager, the LRU / ARC policies and vLLM's KVCacheManager, driven by the loop
in offload_cases.py; the worker stubbed: loads acknowledged in their step, stores in the next,
plus ``ack_delay``). Each test replays the same case through our backend and compares request
by request: admission step, GPU hit, external hit, steps deferred; the chunks each step stored
and evicted; the external_prefix_cache_* counters. The scenario tests state the numbers of
REFERENCE-tiers.md's scenarios 6-9 as the pinned code behaves ("Checked by running the pinned
code on CPU" section).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from prefixcache.experiments.upstream.offload_cases import OursOffload, cases, replay

from prefixcache import CacheConfig, Engine, Request, make_cache
from prefixcache.tiers import HostTierConfig

FIXTURES = Path(__file__).parent / "fixtures" / "upstream" / "offload"
CASES = {c["name"]: c for c in cases()}


def _fixture(name: str) -> dict:
    return json.loads((FIXTURES / f"{name}.json").read_text())


def _replay(name: str) -> dict:
    case = CASES[name]
    return replay(case, OursOffload(case))


def test_every_case_has_a_recorded_fixture() -> None:
    assert sorted(p.stem for p in FIXTURES.glob("*.json")) == sorted(CASES)


@pytest.mark.parametrize("name", sorted(CASES))
def test_matches_vllm_0_33_offloading_connector_request_by_request(name: str) -> None:
    fixture, ours = _fixture(name), _replay(name)
    assert fixture["recorded_with"].startswith("vllm 0.33.0")
    assert ours["admissions"] == fixture["admissions"]
    assert ours["steps"] == fixture["steps"]
    assert ours["metrics"] == fixture["metrics"]


def _admission(record: dict, rid: str) -> list:
    return next(a for a in record["admissions"] if a[1] == rid)


def test_scenario_6_block_math_vllm_0_33() -> None:
    """GPU block 16, chunk 64: a 1000-token prompt stores 15 chunks (960 tokens; the 40-token
    tail never); a request with a 336-token GPU hit loads chunks 5..14: external 624."""
    ours = _replay("scenario_6")
    assert ours == {k: v for k, v in _fixture("scenario_6").items() if k in ours}
    assert ours["steps"][0]["stored"] == [f"A:{i}" for i in range(15)]
    step, _, local, external, deferred = _admission(ours, "B")
    assert (local, external, deferred) == (336, 624, 0)
    case = CASES["scenario_6"]
    side = OursOffload(case)
    replay(case, side)
    # Only A's chunks: a load's chunks (P's, B's) are not offered again (chunk-level policy).
    assert side.cache.stats.stored_tokens == 15 * 64
    assert side.cache.stats.host_evicted_tokens == 0


def test_scenario_7_a_store_in_flight_defers_the_lookup_vllm_0_33() -> None:
    """0.33: the chunk being stored looks up HIT_PENDING; the request is deferred (not a miss)
    for as long as the store takes, then loads it."""
    for name, steps_deferred in (("scenario_7", 1), ("ack_delay_2", 3)):
        ours = _replay(name)
        step, _, local, external, deferred = _admission(ours, "B")
        assert (local, external, deferred) == (0, 256, steps_deferred), name
        assert ours == {k: v for k, v in _fixture(name).items() if k in ours}


def test_scenario_8_lru_evicts_a_request_tail_first_vllm_0_33() -> None:
    """Host of 4 chunks: A stores a1-a4, B's b1, b2 evict a4, a3 (LRU and ARC alike); A's
    prefix then hits 2 chunks (128 tokens)."""
    for name in ("scenario_8", "scenario_8_arc"):
        ours = _replay(name)
        assert ours["steps"][1]["stored"] == ["B:0", "B:1"]
        assert ours["steps"][1]["evicted"] == ["A:3", "A:2"]
        assert _admission(ours, "C")[2:4] == [0, 128]
        assert ours == {k: v for k, v in _fixture(name).items() if k in ours}


def test_scenario_9_full_prompt_hit_vllm_0_33() -> None:
    """A 1024-token prompt on the host, GPU 0: vLLM's external hit is 1024 (counted so in
    external_prefix_cache_hits), after the load 1023 count as computed: we load 1023
    (``host_tokens``) and report vLLM's 1024 in the tier's metrics."""
    ours = _replay("scenario_9")
    assert _admission(ours, "B")[2:4] == [0, 1024]
    assert ours["metrics"]["external_prefix_cache_hits"] == 1024
    cfg = CacheConfig(capacity_tokens=16 * 100, page_size=16)
    cache = make_cache("hashchain", cfg, host_tier=HostTierConfig(block_size=64, capacity_tokens=64 * 20))
    prompt = list(range(1, 1025))
    a = Request("a", prompt)
    assert cache.allocate(a, 1024)
    a.num_computed_tokens = 1024
    cache.commit(a)
    cache.release(a)
    for _ in range(3):
        cache.host_tier.advance_transfers()
    cache.evict(10**6)
    b = Request("b", prompt)
    m = cache.lookup(b)
    assert (m.tokens, m.host_tokens, m.external_tokens) == (0, 1023, 1024)
    assert cache.allocate(b, 1, m)
    assert b.num_computed_tokens == 1023 and cache.host_tier.loaded_tokens(b) == 1023
    metrics = cache.host_tier.metrics()
    assert metrics == {"external_prefix_cache_queries": 2048, "external_prefix_cache_hits": 1024}
    assert cache.stats.host_hits == 1023 and cache.stats.hits == 0


def test_a_pending_match_cannot_be_allocated_and_the_engine_retries_it() -> None:
    cfg = CacheConfig(capacity_tokens=16 * 64, page_size=16)
    cache = make_cache("hashchain", cfg, host_tier=HostTierConfig(block_size=32))
    a = Request("a", list(range(1, 70)))
    assert cache.allocate(a, 69)
    a.num_computed_tokens = 69
    cache.commit(a)
    cache.release(a)
    cache.host_tier.advance_transfers()  # the store is built (submitted): in flight
    cache.evict(10**6)
    b = Request("b", list(range(1, 70)))
    m = cache.lookup(b)
    assert m.pending and m.host_tokens == 0
    with pytest.raises(ValueError, match="pending"):
        cache.allocate(b, 1, m)
    cache.host_tier.advance_transfers()  # acknowledged
    m = cache.lookup(b)
    assert not m.pending and m.host_tokens == 64


def test_host_usage_adds_up_and_counts_stores_and_evictions() -> None:
    cfg = CacheConfig(capacity_tokens=16 * 64, page_size=16)
    cache = make_cache("hashchain", cfg, host_tier=HostTierConfig(block_size=16, capacity_tokens=48))
    assert cache.host_tier.num_pages() == 3 and tuple(cache.host_tier.usage()) == (3, 0, 0)

    def run(rid: str, tokens: list[int]) -> None:
        r = Request(rid, tokens)
        cache.evict(10**6)  # the GPU copy gone: only the host tier can serve
        m = cache.lookup(r)
        assert cache.allocate(r, len(tokens) - m.tokens - m.host_tokens, m)
        r.num_computed_tokens = len(tokens)
        cache.commit(r)
        cache.release(r)
        cache.host_tier.advance_transfers()

    run("big", list(range(1, 66)))  # 4 chunks offered, 3 free and nothing evictable
    assert tuple(cache.host_tier.usage()) == (3, 0, 0) and cache.stats.stored_tokens == 0  # dropped whole
    run("a", list(range(1, 50)))  # 3 chunks
    assert tuple(cache.host_tier.usage()) == (0, 0, 3) and cache.stats.stored_tokens == 48  # in flight
    cache.host_tier.advance_transfers()
    assert tuple(cache.host_tier.usage()) == (0, 3, 0)
    run("b", list(range(500, 533)))  # 2 new chunks evict a's 2 tail chunks
    assert cache.stats.host_evicted_tokens == 32 and tuple(cache.host_tier.usage()) == (0, 1, 2)
    cache.check_invariants()


def test_offload_prompt_only_stores_no_decode_block_by_default() -> None:
    for prompt_only, stored in ((None, 32), (False, 48)):
        cfg = CacheConfig(capacity_tokens=16 * 64, page_size=16)
        tier = HostTierConfig(block_size=16, offload_prompt_only=prompt_only)
        cache = make_cache("hashchain", cfg, host_tier=tier)
        r = Request("r", list(range(1, 33)))
        assert cache.allocate(r, 32)
        r.num_computed_tokens = 32
        cache.commit(r)
        for t in range(16):  # decode a third block
            r.append_output_token_ids([100 + t])
            assert cache.allocate(r, 1)
            r.num_computed_tokens += 1
            cache.commit(r)
            cache.host_tier.advance_transfers()
        assert cache.stats.stored_tokens == stored, prompt_only


def test_decode_steps_are_never_skipped_while_a_transfer_is_in_flight() -> None:
    cfg = CacheConfig(capacity_tokens=16 * 64, page_size=16)
    cache = make_cache("hashchain", cfg, host_tier=HostTierConfig())
    r = Request("r", list(range(1, 40)))
    assert cache.allocate(r, 39)
    r.num_computed_tokens = 39
    cache.commit(r)
    r.append_output_token_ids([7])
    assert cache.decode_steps_in_place(r) == 0  # its stores are not built yet
    cache.host_tier.advance_transfers()
    assert cache.decode_steps_in_place(r) == 0  # in flight
    cache.host_tier.advance_transfers()
    assert cache.decode_steps_in_place(r) > 0


def test_engine_runs_a_host_tier_and_loads_start_a_step_later() -> None:
    cfg = CacheConfig(capacity_tokens=16 * 40, page_size=16)
    cache = make_cache("hashchain", cfg, host_tier=HostTierConfig(block_size=64))
    engine = Engine(cache, "fcfs", token_budget=4096, check_invariants=True)
    # Two shared prefixes taking turns; the device holds one request: each evicts the other
    # family's prefix from the GPU, and the host serves it back.
    families = (list(range(1, 257)), list(range(2001, 2257)))
    for i in range(8):
        prompt = families[i % 2] + [5000 + j + 300 * i for j in range(300)]
        engine.add_request(Request(f"r{i}", prompt, max_new_tokens=2, arrival_time=float(i)))
    engine.run()
    assert engine.num_finished == 8
    assert cache.stats.host_hits > 0 and cache.stats.loaded_tokens == cache.stats.host_hits
    assert cache.host_tier.metrics()["external_prefix_cache_hits"] >= cache.stats.host_hits
    assert cache.host_tier.load_overlapped is False


def test_no_host_tier_leaves_the_backend_without_one() -> None:
    cache = make_cache("hashchain", CacheConfig(capacity_tokens=256, page_size=16))
    assert cache.host_tier is None and cache.offload is None


@pytest.mark.parametrize(
    ("tier", "options", "message"),
    [
        (dict(block_size=24), {}, "multiple of the GPU KV cache block size"),
        (dict(write_policy="write_back"), {}, "write_policy"),
        (dict(load_back_threshold=10), {}, "load_back_threshold"),
        (dict(capacity_tokens=32, block_size=64), {}, "holds no chunk"),
        (dict(), {"attention_groups": [("full",), ("sliding_window", 32)]}, "dense layout only"),
        (dict(), {"host_ack_delay": -1}, "host_ack_delay"),
        (dict(), {"use_eagle": True}, "use_eagle"),
    ],
)
def test_bad_host_tier_values_are_clear_errors(tier: dict, options: dict, message: str) -> None:
    cfg = CacheConfig(capacity_tokens=16 * 64, page_size=16)
    with pytest.raises(ValueError, match=message):
        make_cache("hashchain", cfg, host_tier=HostTierConfig(**tier), **options)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [(dict(capacity_tokens=-5), "capacity_tokens"), (dict(eviction_policy="fifo"), "eviction_policy")],
)
def test_negative_size_and_unknown_policy_are_clear_errors(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        HostTierConfig(**kwargs)


def test_a_host_ack_delay_needs_a_host_tier() -> None:
    with pytest.raises(ValueError, match="without a host_tier"):
        make_cache("hashchain", CacheConfig(capacity_tokens=256, page_size=16), host_ack_delay=1)


# ---------------------------------------------------------------- targeted behaviours
def _tier_cache(host_chunks: int, device_blocks: int = 64, **tier: object):  # type: ignore[no-untyped-def]
    cfg = CacheConfig(capacity_tokens=16 * device_blocks, page_size=16)
    return make_cache("hashchain", cfg, host_tier=HostTierConfig(capacity_tokens=16 * host_chunks, **tier))


def _run(cache, rid: str, tokens: list[int], release: bool = True) -> Request:  # type: ignore[no-untyped-def]
    r = Request(rid, tokens)
    m = cache.lookup(r)
    assert not m.pending
    assert cache.allocate(r, len(tokens) - m.tokens - m.host_tokens, m)
    r.num_computed_tokens = len(tokens)
    cache.commit(r)
    if release:
        cache.release(r)
    return r


def _steps(cache, n: int = 3) -> None:  # type: ignore[no-untyped-def]
    for _ in range(n):
        cache.host_tier.advance_transfers()


def test_lookup_stops_at_the_first_missing_chunk() -> None:
    """vLLM's _maximal_prefix_lookup: consecutive chunks from the GPU hit on, up to a miss."""
    cache = _tier_cache(host_chunks=4)
    a = list(range(1, 66))  # 4 chunks of 16 (+1)
    _run(cache, "a", a)
    _steps(cache)
    cache.evict(16)  # the device drops a's tail block only
    e = _run(cache, "e", a + [500])  # GPU 48, loads chunk 3: only it is used again
    assert cache.host_tier.loaded_tokens(e) == 0 and cache.stats.host_hits == 16
    _steps(cache)
    _run(cache, "f", list(range(900, 917)))  # one new chunk evicts the oldest: chunk 2
    _steps(cache)
    assert cache.stats.host_evicted_tokens == 16
    cache.evict(10**6)
    m = cache.lookup(Request("g", a + [600]))
    assert (m.tokens, m.host_tokens) == (0, 32)  # chunks 0, 1; chunk 3 lies past the hole


def test_a_request_released_mid_prefill_stores_only_what_it_computed() -> None:
    cache = _tier_cache(host_chunks=8, block_size=32)
    r = Request("r", list(range(1, 81)))
    assert cache.allocate(r, 60)  # room for two chunks of 32, but only 40 tokens computed
    r.num_computed_tokens = 40
    cache.commit(r)
    cache.release(r)  # preempted (or aborted) mid-prefill
    _steps(cache)
    assert cache.stats.stored_tokens == 32


def test_a_running_request_offering_cached_chunks_ranks_them_tail_first() -> None:
    """0.33 LRU: a request's provisional rank orders its chunks by position, tail first, while
    it runs; here b re-offers a's four chunks (GPU hit, nothing loaded) and c's two new chunks
    evict b's two tail chunks."""
    cache = _tier_cache(host_chunks=4)
    a = list(range(1, 66))
    _run(cache, "a", a)
    _steps(cache)
    _run(cache, "b", a + [7], release=False)  # GPU hit 64: offers chunks 0-3 again
    _steps(cache)
    _run(cache, "c", list(range(900, 933)))
    _steps(cache)
    assert cache.stats.host_evicted_tokens == 32
    cache.evict(10**6)
    m = cache.lookup(Request("d", a + [8]))
    assert m.tokens == 64  # b still holds its blocks; the host kept chunks 0, 1
    probe = Request("p", a[:33])  # 2 chunks + 1: on the host only
    cache.release(next(r for r in cache.live_requests if r.request_id == "b"))
    cache.evict(10**6)
    m = cache.lookup(probe)
    assert (m.tokens, m.host_tokens) == (0, 32)


def test_blocks_being_loaded_are_not_hit_and_their_chunks_defer_other_lookups() -> None:
    """vLLM delays caching an async load's blocks (delay_cache_blocks) and defers a request
    whose chunks another request is loading."""
    cache = _tier_cache(host_chunks=8)
    a = list(range(1, 50))
    _run(cache, "a", a)
    _steps(cache)
    cache.evict(10**6)
    x = Request("x", a + [5])
    m = cache.lookup(x)
    assert cache.allocate(x, 2, m) and cache.host_tier.loaded_tokens(x) == 48  # loading: nothing computed yet
    m = cache.lookup(Request("y", a + [6]))
    assert m.pending and m.tokens == 0
    cache.host_tier.advance_transfers()  # the load is acknowledged: its blocks are cached now
    m = cache.lookup(Request("y", a + [6]))
    assert not m.pending and m.tokens == 48


def test_a_match_taken_before_the_host_changed_is_revalidated() -> None:
    cache = _tier_cache(host_chunks=8)
    a = list(range(1, 50))
    _run(cache, "a", a)
    cache.host_tier.advance_transfers()  # the store is submitted, not acknowledged
    cache.evict(10**6)
    b = Request("b", a + [9])
    m = cache.lookup(b)
    assert m.pending
    cache.host_tier.advance_transfers()  # acknowledged: only the host changed
    assert cache.allocate(b, 2, m)  # revalidated, not refused as pending
    assert cache.host_tier.loaded_tokens(b) == 48


def test_scenario_10_lmcache_chunk_arithmetic() -> None:
    """REFERENCE-tiers.md scenario 10 (LMCache, chunk 256, save_unfull_chunk False): a
    1000-token prompt stores 768; the same prompt with a 512-token GPU hit loads 256; a
    1024-token prompt stored whole, GPU 0, loads 1023. LMCache itself is not modelled (its keys,
    its CPU LRU and CacheBlend): what carries over is the arithmetic, which vLLM 0.33's
    OffloadingConnector with 256-token chunks (block_size=256 over 16-token GPU blocks) shares
    with LMCache's vLLM adapter: whole chunks only, hit minus what the GPU computed, one token
    recomputed on a full-prompt hit."""
    cache = _tier_cache(host_chunks=16 * 10, device_blocks=128, block_size=256)
    prompt = list(range(1, 1001))
    _run(cache, "a", prompt)
    _steps(cache)
    assert cache.stats.stored_tokens == 768  # three whole chunks; the 232-token tail never
    cache.evict(10**6)
    _run(cache, "c", prompt[:513])  # the GPU now holds the first 512 tokens again
    _steps(cache)
    b = Request("b", prompt)
    m = cache.lookup(b)
    assert (m.tokens, m.host_tokens) == (512, 256)  # chunk 2 loaded; chunk 3 was never stored
    assert cache.allocate(b, 1000 - 768, m) and cache.host_tier.loaded_tokens(b) == 256
    b.num_computed_tokens = 1000
    cache.commit(b)
    cache.release(b)
    full = list(range(5000, 6024))
    _run(cache, "d", full)
    _steps(cache)
    cache.evict(10**6)
    m = cache.lookup(Request("e", full))
    assert (m.tokens, m.host_tokens, m.external_tokens) == (0, 1023, 1024)


def test_the_radix_storage_tier_fields_are_refused_by_hashchain() -> None:
    """vLLM's OffloadingConnector has no L3 prefetch of SGLang's kind: its fields are errors."""
    cfg = CacheConfig(capacity_tokens=16 * 64, page_size=16)
    with pytest.raises(ValueError, match="hashchain host tier has no storage"):
        make_cache("hashchain", cfg, host_tier=HostTierConfig(storage=True))


@pytest.mark.parametrize("ack_delay", [0, 2])
def test_a_host_load_is_pending_until_the_connector_reports_it(ack_delay: int) -> None:
    """Issue 33: the host hit's fields and the load's acknowledgement are public. vLLM's async
    load: admitted with ``allocate(req, 0, match)``, the request waits until the connector
    reports the load (``advance_transfers``, ``ack_delay`` steps late), and only then are the
    loaded blocks cached (a lookup sees them)."""
    cfg = CacheConfig(capacity_tokens=16 * 100, page_size=16)
    cache = make_cache("hashchain", cfg, host_tier=HostTierConfig(block_size=64, capacity_tokens=64 * 20),
                       host_ack_delay=ack_delay)
    prompt = list(range(1, 130))
    _run(cache, "a", prompt)
    _steps(cache, 3 + ack_delay)
    cache.evict(10**6)
    b = Request("b", prompt)
    m = cache.lookup(b)
    assert (m.tokens, m.host_tokens, m.external_tokens, m.shared_prefix_boundary) == (0, 128, 128, 0)
    assert not cache.host_tier.load_pending(b)  # not live yet
    assert cache.allocate(b, 0, m)
    steps = 0
    while cache.host_tier.load_pending(b) and steps <= 10:  # (bounded: a load never acked fails)
        assert cache.lookup(Request("c", prompt)).tokens == 0  # loaded blocks not cached yet
        cache.host_tier.advance_transfers()
        steps += 1
    assert steps == 1 + ack_delay
    assert cache.lookup(Request("c", prompt)).tokens == 128
    cache.release(b)
    assert not cache.host_tier.load_pending(b)


def test_without_a_tier_there_is_no_tier_and_the_match_has_no_host_part() -> None:
    for backend in ("hashchain", "radix"):
        cache = make_cache(backend, CacheConfig(1024, 16))
        r = Request("r", list(range(1, 40)))
        m = cache.lookup(r)
        assert (m.host_tokens, m.external_tokens, m.shared_prefix_boundary) == (0, 0, 0)
        assert cache.allocate(r, 39, m)
        assert cache.host_tier is None
