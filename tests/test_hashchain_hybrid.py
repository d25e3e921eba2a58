"""REFERENCE-hybrid.md "Scenario tests" 1-9 on the hashchain backend, each checked against the
numbers recorded from vLLM 0.33.0 (tests/fixtures/upstream/hybrid/, written by
experiments/upstream/vllm_hybrid_driver.py); plus layout-driven construction and the options.

Not here: scenario 6 (EAGLE, ``use_eagle=True``: tests/test_hashchain_hybrid_eagle.py), 12-14
(SGLang). Scenarios 10-11 (Mamba) run vLLM 0.33's MambaManager in "align" mode, the only mode
that caches.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from prefixcache.backends.hashchain.hashing import (
    BlockHash,
    BlockHasher,
    RequestHashes,
    get_hash_fn,
    group_id_suffix,
)
from prefixcache.backends.hashchain.kv_cache_manager import KVCacheManager
from prefixcache.backends.hashchain.kv_cache_planning import (
    partial_hash_hits_enabled,
    plan_kv_cache_groups,
    resolve_hash_block_size,
)
from prefixcache.backends.hashchain.single_type_kv_cache_manager import AttentionGroupSpec

from prefixcache import CacheConfig, Request, make_cache
from prefixcache.layout import ModelLayout
from tests.helpers import DIRECT_REQUEST, keyed, tokens
from tests.test_hashchain_hybrid_fixtures import FIXTURE_DIR, load, replay_ours

UNITS = json.loads((FIXTURE_DIR / "vllm_hybrid_units.json").read_text())
RETENTIONS = {"dense": None, "ret0": 0}


def window_manager(num_blocks: int, window: int, block_size: int) -> KVCacheManager:
    return KVCacheManager(
        num_blocks, block_size, get_hash_fn("sha256"), [AttentionGroupSpec("sliding_window", window)]
    )


def record_of(n: int) -> RequestHashes:
    r = RequestHashes()
    r.hashes.extend(BlockHash(bytes([i]) * 32) for i in range(n))
    return r


def admitted(scenario: str, rid: str) -> dict[str, Any]:
    """The record of ``rid``'s admission (its first alloc) in a fixture."""
    fixture = load(scenario)
    ops = fixture["scenario"]["ops"]
    return next(
        r for op, r in zip(ops, fixture["records"], strict=True) if op["op"] == "alloc" and op["rid"] == rid
    )


# ---------------------------------------------------------------- 1-3: SlidingWindowManager
@pytest.mark.parametrize("case", UNITS["scenario1_swa_find"], ids=lambda c: c["pattern"])
def test_scenario_1_sliding_window_possible_cached_prefix(case: dict[str, Any]) -> None:
    """vLLM 0.33 SlidingWindowManager.find_longest_cache_hit, window 4, bs 2 (need 2 blocks):
    right-to-left scan; hit length, leading nulls and which positions are real as recorded."""
    pattern = case["pattern"]
    m = window_manager(64, 4, 2)
    hashes = record_of(len(pattern))
    pool = m.block_pool
    position_of: dict[int, int] = {}
    for i, flag in enumerate(pattern):
        if flag == "T":
            blocks = [pool.null_block] * i + pool.get_new_blocks(1)
            pool.cache_full_blocks(DIRECT_REQUEST, keyed(hashes.hashes, 0), blocks, i, i + 1)
            position_of[blocks[i].block_id] = i
    (blocks,), hit = m.coordinator.find_longest_cache_hit(hashes, len(pattern) * 2)
    assert hit == case["hit"]
    assert sum(b.is_null for b in blocks) == case["num_nulls"]
    # The driver cached position p in block 10 + p.
    vllm_positions = [None if i == 0 else i - 10 for i in case["ids"]]
    assert [None if b.is_null else position_of[b.block_id] for b in blocks] == vllm_positions


def test_scenario_2_remove_skipped_blocks() -> None:
    """vLLM 0.33 remove_skipped_blocks, window 4, bs 2, table 1000-1010: nulls from the left,
    each call frees right to left and stops at the first null; freed blocks (no hash) go to
    the head of the free queue in that order."""
    m = KVCacheManager(1011, 2, get_hash_fn("sha256"), [AttentionGroupSpec("sliding_window", 4)])
    pool = m.block_pool
    held = pool.get_new_blocks(1010)
    manager = m.coordinator.single_type_managers[0]
    manager.req_to_blocks["r"] = [b for b in held if b.block_id >= 1000]
    manager.num_cached_block["r"] = 0
    pool.free_blocks([b for b in held if b.block_id < 1000])
    for case in UNITS["scenario2_remove_skipped"]:
        manager.remove_skipped_blocks("r", case["num_computed_tokens"])
        assert [b.block_id for b in manager.req_to_blocks["r"]] == case["table"]
        assert [b.block_id for b in pool.free_block_queue.get_all_free_blocks()[:5]] == case["free_head"]
    pool.check_invariants()


@pytest.mark.parametrize("case", UNITS["scenario3_blocks_to_allocate"], ids=str)
def test_scenario_3_sliding_window_blocks_to_allocate(case: dict[str, Any]) -> None:
    """vLLM 0.33 get_num_blocks_to_allocate for 40 tokens (window 4, bs 2), a 10-block hit of
    free cached blocks, some nulls: new blocks beyond max(skipped, hit) + hit blocks to touch."""
    m = window_manager(64, 4, 2)
    pool = m.block_pool
    hit = [pool.null_block] * case["num_nulls"] + pool.blocks[10 : 20 - case["num_nulls"]]
    manager = m.coordinator.single_type_managers[0]
    got = manager.get_num_blocks_to_allocate("r", 40, hit, case["total_computed_tokens"])
    assert got == case["blocks"]


# ---------------------------------------------------------------- 4, 5, 7: whole requests
SCENARIO_4_DENSE_FREE_QUEUE = [15, 14, 13, 12, 8, 4, *range(16, 21), 5, 9, 3, 2, 1, 7, 6, 11, 10]


@pytest.mark.parametrize("retention", RETENTIONS)
def test_scenario_4_prefill_hybrid_model(retention: str) -> None:
    """vLLM's test_prefill_hybrid_model (full + 2 x SWA(32), bs 16, 21 blocks), dense and at the
    engine default: req1 hits 48 tokens, ids ([1,2,3],[0,6,7],[0,10,11]) + new ([13],[14],[15]);
    after both finish the free queue is vLLM's (dense: [15,14,13,12,8,4,16..20,5,9,3,2,1,7,6,11,10])."""
    name = f"scenario4_{retention}"
    fixture = load(name)
    r1 = admitted(name, "r1")
    assert r1["hit"] == 48
    assert r1["ids"] == [[1, 2, 3, 13], [0, 6, 7, 14], [0, 10, 11, 15]]
    assert r1["new"] == [[13], [14], [15]]
    ours = replay_ours(fixture["scenario"])
    assert [r.get("ids") for r in ours] == [r.get("ids") for r in fixture["records"]]
    assert ours[-1]["free_queue"] == fixture["records"][-1]["free_queue"]
    if retention == "dense":
        assert ours[-1]["free_queue"] == SCENARIO_4_DENSE_FREE_QUEUE


# case -> (hit dense, hit at retention 0), as vLLM 0.33 recorded them
SCENARIO_5 = {
    "swa_block0": ("5_9", 48, 48),
    "full_block0": ("1", 0, 0),
    "block2_all": ("3_7_11", 32, 0),
    "full_block2": ("3", 32, 0),
    "swa1_block2": ("7", 32, 0),
    "full_block2_swa_block0": ("3_5_9", 0, 0),
}


@pytest.mark.parametrize("case", SCENARIO_5)
@pytest.mark.parametrize("retention", RETENTIONS)
def test_scenario_5_evict_then_look_up(case: str, retention: str) -> None:
    """Scenario 4's req0 finished, some blocks evicted, req1 looked up. Dense: SWA block 0 gone
    still hits 3 blocks; block 2 gone in any group cuts to 2. Retention 0: SWA hashed only the
    replay-boundary tail (blocks 2, 3), so every case but "SWA block 0" gives 0."""
    ids, dense, sparse = SCENARIO_5[case]
    name = f"scenario5_evict_{ids}_{retention}"
    fixture = load(name)
    lookup = fixture["records"][-1]
    assert lookup["hit"] == (dense if retention == "dense" else sparse)
    ours = replay_ours(fixture["scenario"])
    assert ours[-1]["hit"] == lookup["hit"] and ours[-1]["blocks"] == lookup["blocks"]
    assert ours[-1]["junction"] == lookup["junction"]


@pytest.mark.parametrize("retention", RETENTIONS)
def test_scenario_7_free_order(retention: str) -> None:
    """One full group, 11 blocks; req0 55 tokens, req1 shares 3 blocks; both freed: vLLM 0.33
    (post-#42656) order [5,4,6,7,8,9,10,3,2,1]: unhashed tails prepended, hashed appended."""
    fixture = load(f"scenario7_{retention}")
    assert fixture["records"][-1]["free_queue"] == [5, 4, 6, 7, 8, 9, 10, 3, 2, 1]
    assert replay_ours(fixture["scenario"])[-1]["free_queue"] == [5, 4, 6, 7, 8, 9, 10, 3, 2, 1]


def test_scenario_4_retention_0_hashes_only_the_replay_tail_in_sliding_window_groups() -> None:
    """Retention 0, req0 of 55 tokens: replay boundary 54 -> the SWA(32) tail [1, 3) (need 2
    blocks), so SWA block 0 carries no hash; full attention hashes every full block."""
    cache = make_cache(
        "hashchain",
        CacheConfig(21 * 16, 16),
        attention_groups=[("full",), ("sliding_window", 32), ("sliding_window", 32)],
    )
    req = Request("r0", tokens(55))
    assert cache.allocate(req, 55)
    full, sw1, sw2 = cache.manager.get_blocks("r0")
    assert [b.block_hash is not None for b in full] == [True, True, True, False]
    for group in (sw1, sw2):
        assert [b.block_hash is not None for b in group] == [False, True, True, False]


# ---------------------------------------------------------------- 10, 11: Mamba ("align")
@pytest.mark.parametrize("retention", RETENTIONS)
def test_scenario_10_mamba_hit_is_the_latest_cached_state(retention: str) -> None:
    """Full + Mamba, bs 16, states cached at every block (block-aligned chunks): req1 hits 96
    with Mamba blocks [null x 5, state]. Its state evicted: dense falls back to the state at 80
    (older states were freed but kept their hash); retention 0 kept only the replay-boundary
    state, so nothing is left (0)."""
    for evict, dense, sparse in ((False, 96, 96), (True, 80, 0)):
        name = f"scenario10{'_evict_state' if evict else ''}_{retention}"
        fixture = load(name)
        lookup = next(
            r
            for op, r in zip(fixture["scenario"]["ops"], fixture["records"], strict=True)
            if op["op"] == "lookup"
        )
        assert lookup["hit"] == (dense if retention == "dense" else sparse)
        if lookup["hit"]:
            state = lookup["blocks"][1]
            assert state[:-1] == [0] * (len(state) - 1) and state[-1] != 0
        ours = replay_ours(fixture["scenario"])
        assert ours == fixture["records"]


def test_scenario_11_block_floor() -> None:
    """mamba-hybrid, block raised to 528 (#40696): a 480-token shared prefix caches nothing (0);
    a repeated 552-token prompt hits 528."""
    fixture = load("scenario11_block_floor_ret0")
    assert fixture["block_size"] == 528
    hits = {
        op["rid"]: r["hit"]
        for op, r in zip(fixture["scenario"]["ops"], fixture["records"], strict=True)
        if "hit" in r and r["hit"] is not None
    }
    assert hits["b"] == 0 and hits["c2"] == 528
    assert replay_ours(fixture["scenario"]) == fixture["records"]


# ---------------------------------------------------------------- 8, 9: planning
@pytest.mark.parametrize("name", sorted(UNITS["scenario8_grouping"]))
def test_scenario_8_grouping(name: str) -> None:
    """vLLM 0.33 _get_kv_cache_groups_uniform_page_size: buckets by spec, group size (min, or
    max below 1.5 x min), stride split, padding. 52 SW + 10 full -> 6 SW groups + 1 full, 8
    padding layers; 12 SW + 13 full -> group size 13."""
    case = UNITS["scenario8_grouping"][name]
    plan = plan_kv_cache_groups(ModelLayout.parse([tuple(x) for x in case["layout"]]))
    assert plan.group_size == case["group_size"]
    got = [
        {
            "spec": [g.spec.kind] + ([g.spec.sliding_window] if g.spec.sliding_window else []),
            "layers": list(g.layers),
        }
        for g in plan.groups
    ]
    assert got == case["groups"]
    if name == "gemma3_27b":
        assert len(plan.groups) == 7 and plan.num_padding_layers == 8


@pytest.mark.parametrize("case", UNITS["scenario9_block_sizes"], ids=str)
def test_scenario_9_block_sizes(case: dict[str, Any]) -> None:
    """vLLM 0.33 resolve_kv_cache_block_sizes: one group -> (B, B), a unit other than B is an
    error; several -> (LCM, unit or GCD), a unit must divide every block size."""
    if case["error"] is not None:
        with pytest.raises(ValueError, match="Invalid prefix_match_unit"):
            resolve_hash_block_size(case["block_sizes"], case["prefix_match_unit"])
    else:
        assert list(resolve_hash_block_size(case["block_sizes"], case["prefix_match_unit"])) == case["result"]


@pytest.mark.parametrize("case", UNITS["scenario9_partial_hits"], ids=str)
def test_scenario_9_partial_hash_hits_enabled(case: dict[str, Any]) -> None:
    """vLLM 0.33 partial_hash_hits_enabled: Mamba "align" with a block above the hash unit and
    every other group able to look up at the unit (a sliding window cannot)."""
    got = partial_hash_hits_enabled(case["kinds"], case["block_size"], case["hash_block_size"])
    assert got == case["enabled"]


# ---------------------------------------------------------------- construction and options
def test_layout_forms_vllm_groups_and_sizes_the_pool_from_the_layer_budget() -> None:
    """gemma3-like (5 SW + 1 full per unit): group size 1, six groups; num_blocks =
    budget // (block_size x 1) = 6 x capacity // B; each KVGroup lists its model layer."""
    cache = make_cache("hashchain", CacheConfig(1024, 16, layout="gemma3-like"))
    groups = cache.kv_groups()
    assert [(g.kind, g.window, g.layers) for g in groups] == [
        ("sliding_window", 1024, (i,)) for i in range(5)
    ] + [("full", None, (5,))]
    assert {g.pool for g in groups} == {"blocks"} and {g.num_pages for g in groups} == {6 * 1024 // 16}
    assert cache.block_pool.num_gpu_blocks == 6 * 1024 // 16
    cache.check_invariants()


def test_padding_layers_hold_memory_but_are_not_model_layers() -> None:
    """12 SW + 13 full (gpt-oss + EAGLE): group size 13, the SW group padded with one layer."""
    layout = [("sliding_window", 8), ("full",)] * 12 + [("full",)]
    cache = make_cache("hashchain", CacheConfig(64, 4, layout=layout))
    sw, full = cache.kv_groups()
    assert len(sw.layers) == 12 and len(full.layers) == 13
    assert cache.num_padding_layers == 1
    assert cache.block_pool.num_gpu_blocks == 64 * 25 // (4 * 13)


def test_dense_layout_is_byte_for_byte_the_plain_backend() -> None:
    """An all-full layout: one group over config.num_pages blocks, the unitary coordinator."""
    plain = make_cache("hashchain", CacheConfig(256, 4))
    dense = make_cache("hashchain", CacheConfig(256, 4, layout=[("full",)] * 3))
    assert type(dense.manager.coordinator) is type(plain.manager.coordinator)
    assert dense.block_pool.num_gpu_blocks == plain.block_pool.num_gpu_blocks == 64
    prompt = tokens(30)
    for cache in (plain, dense):
        r = Request("a", prompt)
        assert cache.allocate(r, 30)
    assert [b.block_id for b in plain.manager.get_blocks("a")[0]] == [
        b.block_id for b in dense.manager.get_blocks("a")[0]
    ]
    assert dense.kv_groups()[0].layers == (0, 1, 2)


def test_layout_and_attention_groups_together_are_a_value_error() -> None:
    with pytest.raises(ValueError, match="not both"):
        make_cache("hashchain", CacheConfig(256, 4, layout="gpt-oss-like"), attention_groups=[("full",)])


def test_mamba_layout_raises_the_block_so_a_page_holds_one_state() -> None:
    """mamba-hybrid (3 x Mamba(528) + full), block 16: vLLM raises the block to 528 tokens
    (#40696); groups by spec (group size 1: three Mamba groups, one full), kind "mamba"."""
    cache = make_cache("hashchain", CacheConfig(528 * 8, 16, layout="mamba-hybrid"))
    groups = cache.kv_groups()
    assert [(g.kind, g.layers) for g in groups] == [
        ("mamba", (0,)),
        ("mamba", (1,)),
        ("mamba", (2,)),
        ("full", (3,)),
    ]
    assert cache.page_size == 528 and {g.page_size for g in groups} == {528}
    assert cache.primary_group == 3  # page_table: the full-attention group, not a Mamba one
    req = Request("a", tokens(600))
    assert cache.allocate(req, 600)
    assert cache.page_table(req) == cache.page_tables(req)[3] and 0 not in cache.page_table(req)
    assert cache.block_pool.num_gpu_blocks == 528 * 8 * 4 // 528
    cache.check_invariants()


def test_prefix_match_unit_below_the_block_with_mamba_is_refused_where_vllm_hits_partially() -> None:
    """vLLM 0.33 partial_hash_hits_enabled: Mamba "align" with a block above the unit and no
    group that cannot look up at the unit (a sliding window) -> sub-block hits, which we do not
    have: refused. With a sliding window vLLM keeps hits block-aligned: accepted."""
    with pytest.raises(ValueError, match="partial hits"):
        make_cache("hashchain", CacheConfig(528 * 8, 16, layout="mamba-hybrid"), prefix_match_unit=16)
    layout = [("mamba", 8), ("full",), ("sliding_window", 12)]
    cache = make_cache("hashchain", CacheConfig(64, 4, layout=layout), prefix_match_unit=4)
    assert (cache.page_size, cache.scheduler_block_size, cache.hash_block_size) == (8, 8, 4)


@pytest.mark.parametrize(
    ("groups", "retention"),
    [
        ([("full",)], 16),
        ([("full",), ("sliding_window", 8)], 6),
        ([("full",), ("sliding_window", 8)], -4),
        ([("full",), ("sliding_window", 8)], 2.0),
    ],
)
def test_bad_retention_interval_is_a_value_error(groups: list[Any], retention: Any) -> None:
    """vLLM 0.33 _validate_prefix_cache_retention_interval: >0 with no sliding window, negative,
    or not a multiple of the block size."""
    with pytest.raises(ValueError, match="prefix_cache_retention_interval"):
        make_cache(
            "hashchain",
            CacheConfig(256, 4),
            attention_groups=groups,
            prefix_cache_retention_interval=retention,
        )


def test_retention_defaults_to_vllm_engine_default_0() -> None:
    cache = make_cache("hashchain", CacheConfig(256, 4, layout="gpt-oss-like"))
    assert cache.prefix_cache_retention_interval == 0
    assert cache.manager.coordinator.retention_interval == 0


@pytest.mark.parametrize(
    ("layout", "unit", "ok"),
    [(None, 4, True), (None, 2, False), ("gpt-oss-like", 2, True), ("gpt-oss-like", 3, False)],
)
def test_prefix_match_unit(layout: str | None, unit: int, ok: bool) -> None:
    """One group: only the block size; several: a divisor of it (vLLM 0.33)."""
    config = CacheConfig(256, 4, layout=layout)
    if ok:
        assert make_cache("hashchain", config, prefix_match_unit=unit).hash_block_size == unit
    else:
        with pytest.raises(ValueError, match="prefix_match_unit"):
            make_cache("hashchain", config, prefix_match_unit=unit)


def test_prefix_match_unit_keys_a_block_by_its_last_units_hash() -> None:
    """vLLM 0.33: hashes per hash unit (--prefix-match-unit), a block keyed by the hash at its
    last unit (BlockHashListWithBlockSize). The replay fixtures *_unit* show the same hits and
    ids as with the unit = the block size."""
    cache = make_cache("hashchain", CacheConfig(64, 4, layout="gpt-oss-like"), prefix_match_unit=2)
    req = Request("a", tokens(10))
    hashes = cache.manager.hasher.request_hashes(req)
    assert len(hashes.hashes) == 5 and hashes.num_blocks == 2
    assert hashes.keys(1) == [hashes.hashes[1] + group_id_suffix(1), hashes.hashes[3] + group_id_suffix(1)]
    assert hashes.hashes == BlockHasher(2, get_hash_fn("sha256")).block_hashes(Request("b", tokens(10)))


def test_mamba_prefill_chunks_end_on_block_boundaries_as_vllms_align_scheduler() -> None:
    """vLLM 0.33 ``Scheduler._mamba_block_aligned_split``: a chunk short of the prompt's end
    ends on a block boundary (a state is cached only where a chunk ends); a block wider than
    the step advances sub-block first. The last chunk and every dense cache are left alone."""
    from prefixcache import Engine, Request

    cache = make_cache("hashchain", CacheConfig(1 << 16, 16, layout="mamba-hybrid"))
    B = cache.page_size
    assert B == 528
    req = Request("m", list(range(1, 3001)))
    assert cache.prefill_chunking.chunk(req, 0, 2048, 2048) == 3 * B  # 2048 -> 1584
    assert cache.prefill_chunking.chunk(req, 0, 512, 512) == 512  # no boundary within reach, block > step
    assert cache.prefill_chunking.chunk(req, 512, 512, 512) == B - 512  # re-align at 528
    assert cache.prefill_chunking.chunk(req, 2500, 500, 2048) == 5 * B - 2500  # mid-block: to the boundary
    assert cache.prefill_chunking.chunk(req, 5 * B, 3000 - 5 * B, 2048) == 3000 - 5 * B  # the last chunk
    assert cache.prefill_chunking.chunk(req, 2 * B, 3000 - 2 * B, 4096) == 3 * B  # stops at the last boundary
    assert cache.prefill_chunking.chunk(req, 0, 400, 600) == 0  # the boundary is one step away: wait
    dense = make_cache("hashchain", CacheConfig(1 << 16, 16))
    assert dense.prefill_chunking.chunk(req, 0, 1000, 1000) == 1000

    # Through the engine: every prefill chunk that stops short of the prompt ends on a block
    # boundary (or advances sub-block when no boundary is in reach), so the state the second
    # request reuses at 2 blocks is the one a chunk really ended on.
    shared = list(range(5, 1205))
    reqs = [
        Request("a", shared + [7] * 50, max_new_tokens=2),
        Request("b", shared + [9] * 50, max_new_tokens=2, arrival_time=1e6),
    ]
    ends: list[tuple[int, int]] = []
    allocate = cache.allocate

    def spy(r: Request, n: int, match: object = None) -> bool:
        start = match.tokens if match is not None else r.num_computed_tokens  # type: ignore[attr-defined]
        if start + n < r.num_prompt_tokens:
            ends.append((start, start + n))
        return allocate(r, n, match)  # type: ignore[arg-type]

    cache.allocate = spy  # type: ignore[method-assign]
    Engine(cache, "fcfs", 512, check_invariants=True).run(reqs)
    # a: 512 (no boundary in reach, block wider than the step), to the boundary 528, 512
    # again, to the boundary 1056 (its last cacheable one); b starts at its hit, 1056
    assert ends == [(0, 512), (512, B), (B, B + 512), (B + 512, 2 * B)]
    assert cache.stats.hits == 2 * B


def test_mamba_prefill_stops_at_the_shared_prefix_junction_so_a_third_request_hits_it() -> None:
    """vLLM 0.33 (``enable_mamba_shared_prefix_checkpoint`` off): a request whose admission
    found a longer full-attention hit than the joint one (the junction) ends a chunk at the
    junction floored to a block, so its state there is cached (sparse retention keeps
    junction tails) and the next request sharing the prefix resumes from it."""
    from prefixcache import Engine, Request

    cache = make_cache("hashchain", CacheConfig(1 << 17, 16, layout="mamba-hybrid"))
    B = cache.page_size
    shared = list(range(7, 1707))  # 1700 tokens: 3 whole blocks (1584)
    a = Request("a", shared + [1] * 500, max_new_tokens=1)
    b = Request("b", shared + [2] * 1000, max_new_tokens=1, arrival_time=1e6)
    c = Request("c", shared + [3] * 300, max_new_tokens=1, arrival_time=2e6)
    match_b: list[int] = []
    lookup = cache.lookup

    def spy(r: Request):
        m = lookup(r)
        if r is b:
            match_b.append(m.shared_prefix_boundary)  # type: ignore[attr-defined]
        return m

    cache.lookup = spy  # type: ignore[method-assign]
    Engine(cache, "fcfs", 4096, check_invariants=True).run([a, b, c])
    assert match_b and match_b[0] == 3 * B, "b's admission found no junction: the test proves nothing"
    assert cache.stats.hits == 3 * B  # c resumed at the junction b checkpointed (a and b: 0)
