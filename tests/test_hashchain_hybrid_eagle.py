"""EAGLE in the hashchain backend (``use_eagle=True``), against vLLM 0.33.0's own code.

The fixtures (tests/fixtures/upstream/hybrid/eagle/vllm_eagle_*.json) were written by
``experiments/upstream/vllm_hybrid_driver.py --eagle-only`` from vLLM 0.33.0's KVCacheManager
built with ``use_eagle=True`` and ``num_prefill_lookahead=1`` (what the scheduler passes for an
EAGLE drafter with lookahead block hashes off), no draft layers (so every group is an EAGLE
group) and no lookahead slots (our contract reserves only known tokens). They hold scenario 6
(REFERENCE-hybrid.md: vLLM's ``test_prefill_hybrid_model_eagle``) and its eviction variants,
prompts of k*B +- 1 tokens on one full-attention group, and random traffic on the gpt-oss-,
Gemma-3- and mixed-window stand-ins, at dense retention (None) and the engine default (0), one
at a positive interval. Replay compares every op: hits, junctions, every group's block ids, new
blocks, evicted ids and the whole free queue.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from prefixcache.backends.hashchain.backend import HashChainCache
from prefixcache.backends.hashchain.kv_cache_coordinator import replay_boundaries

from prefixcache import CacheConfig, Request, make_cache
from prefixcache.tiers import HostTierConfig
from tests.test_hashchain_hybrid_fixtures import FIXTURE_DIR, diffs, replay_ours

EAGLE_DIR = FIXTURE_DIR / "eagle"
FIXTURES = sorted(EAGLE_DIR.glob("vllm_eagle_*.json"))
RETENTIONS = ("dense", "ret0")


def load(name: str) -> dict[str, Any]:
    return json.loads((EAGLE_DIR / f"vllm_eagle_{name}.json").read_text())  # type: ignore[no-any-return]


def records_of(fixture: dict[str, Any], kind: str, rid: str) -> list[dict[str, Any]]:
    ops = fixture["scenario"]["ops"]
    return [
        r for op, r in zip(ops, fixture["records"], strict=True) if op["op"] == kind and op.get("rid") == rid
    ]


def test_eagle_fixtures_present_and_small() -> None:
    assert len(FIXTURES) >= 20
    assert sum(p.stat().st_size for p in FIXTURES) < 220_000
    fixtures = [json.loads(p.read_text()) for p in FIXTURES]
    assert {f["upstream"] for f in fixtures} == {"vllm 0.33.0"}
    assert all(f["scenario"]["use_eagle"] is True for f in fixtures)


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.stem)
def test_replay_matches_vllm_0_33_eagle(path: Path) -> None:
    """vLLM 0.33.0 KVCacheManager(use_eagle=True): every record of every op agrees."""
    fixture = json.loads(path.read_text())
    scenario = fixture["scenario"]
    found = diffs(replay_ours(scenario), fixture["records"], scenario["ops"])
    assert not found, f"{path.stem}: {len(found)} difference(s):\n" + "\n".join(found[:12])


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.stem)
def test_eagle_fixtures_see_the_drop(path: Path) -> None:
    """Each recorded run differs from the same ops without EAGLE (the fixtures test it)."""
    fixture = json.loads(path.read_text())
    scenario = {**fixture["scenario"], "use_eagle": False}
    assert diffs(replay_ours(scenario), fixture["records"], scenario["ops"])


@pytest.mark.parametrize("retention", RETENTIONS)
def test_scenario_6_eagle_hybrid(retention: str) -> None:
    """REFERENCE-hybrid.md scenario 6 (vLLM 0.33.0 ``test_prefill_hybrid_model_eagle``): full
    + 2 x SWA(48), bs 16, 31 blocks; req0 103 tokens, req1 = its 96 + 5. The full group looks up
    6 blocks and drops one; the windows need a run of 3 + 1 blocks, then drop one: hit 80,
    [1..5], [0,0,10,11,12], [0,0,17,18,19], new [22,23], [24,25], [26,27]. Same at retention 0
    (the tail [2, 6) ending one block past the replay boundary 80 is hashed)."""
    fixture = load(f"scenario6_{retention}")
    r1 = records_of(fixture, "alloc", "r1")[0]
    assert (r1["hit"], r1["new"]) == (80, [[22, 23], [24, 25], [26, 27]])
    assert r1["ids"] == [[1, 2, 3, 4, 5, 22, 23], [0, 0, 10, 11, 12, 24, 25], [0, 0, 17, 18, 19, 26, 27]]
    ours = replay_ours(fixture["scenario"])
    assert ours == fixture["records"]  # request by request: hits, block ids, free queue


# Scenario 6's eviction variants (dense: vLLM's test's numbers, in blocks); at retention 0 the
# windows hash only the tail at the replay boundary, so every variant that evicts one of its
# blocks misses (the junction then asks req2 to keep that tail).
SCENARIO_6_HITS = {
    "swa_block0": (5, 5),
    "full_block0": (0, 0),
    "last_all": (4, 0),
    "full_last": (4, 0),
    "swa1_second_last": (3, 0),
    "swa2_second_last": (3, 0),
    "full_last_swa_first": (4, 0),
}


@pytest.mark.parametrize("retention", RETENTIONS)
@pytest.mark.parametrize("case", sorted(SCENARIO_6_HITS))
def test_scenario_6_eagle_evictions(case: str, retention: str) -> None:
    """Evict every block under some keys (as vLLM's test pops them), then look up req1 again."""
    fixture = load(f"scenario6_evict_{case}_{retention}")
    (lookup,) = records_of(fixture, "lookup", "r2")
    assert lookup["hit"] == 16 * SCENARIO_6_HITS[case][RETENTIONS.index(retention)]
    ours = replay_ours(fixture["scenario"])
    assert ours == fixture["records"]


def test_scenario_6_dense_eagle_prompt_lengths() -> None:
    """One full-attention group (vLLM 0.33 UnitaryKVCacheCoordinator): no margin, the last
    block of the hit within n - 1 tokens is dropped, so an n-token prompt of a cached sequence
    hits (floor((n - 1) / B) - 1) blocks: 15, 16, 17 -> 0; 32 -> 16; 33 -> 16 ... 64 -> 32,
    65 -> 48, 80 -> 48, 81 -> 64. (#52897's (floor((n + 1) / B) - 1) * B is not 0.33's.)"""
    fixture = load("scenario6_dense_lengths_ret0")
    B = fixture["scenario"]["block_size"]
    ops = fixture["scenario"]["ops"]
    lookups = [
        (len(ops[i - 1]["prompt"]), r["hit"])
        for i, r in enumerate(fixture["records"])
        if ops[i]["op"] == "lookup"
    ]
    assert lookups and all(hit == max((n - 1) // B - 1, 0) * B for n, hit in lookups)
    assert replay_ours(fixture["scenario"]) == fixture["records"]


@pytest.mark.parametrize("case,hit", [("once_per_length", 28), ("redrop_after_shrink", 16)])
def test_eagle_fixed_point_drops_once_per_candidate_length(case: str, hit: int) -> None:
    """vLLM 0.33's ``eagle_verified`` (issue #32802), three spec groups (full, SWA(8), SWA(16),
    bs 4) after evicting window blocks: a group whose drop held is not dropped again when
    another group's drop lowers the length (28; dropping every pass gives 24), and a group
    shrinking the length without a drop makes all drop again (16; never re-dropping gives 20)."""
    fixture = load(f"fixed_point_{case}_dense")
    (lookup,) = records_of(fixture, "lookup", "r2")
    assert lookup["hit"] == hit
    assert replay_ours(fixture["scenario"]) == fixture["records"]


def test_replay_boundaries_follow_vllm_0_33() -> None:
    """``replay_boundaries``: prompt - 1 without EAGLE; with it one block below the resend
    ((P - 1) floored) and the extension (P floored), deduplicated, sorted, clamped at 0."""
    assert replay_boundaries(103, 16, False) == [102]
    assert replay_boundaries(103, 16, True) == [80]
    assert replay_boundaries(96, 16, True) == [64, 80]
    assert replay_boundaries(10, 16, True) == [0]


def eagle_cache(groups: list[tuple[Any, ...]] | None, num_blocks: int = 40, **kw: Any) -> HashChainCache:
    cache = make_cache(
        "hashchain", CacheConfig(num_blocks * 4, 4), attention_groups=groups, use_eagle=True, **kw
    )
    assert isinstance(cache, HashChainCache)
    return cache


def test_use_eagle_is_off_by_default_and_checked() -> None:
    cache = make_cache("hashchain", CacheConfig(64, 4))
    assert isinstance(cache, HashChainCache) and cache.use_eagle is False
    with pytest.raises(ValueError, match="use_eagle must be a bool"):
        make_cache("hashchain", CacheConfig(64, 4), use_eagle=1)
    with pytest.raises(ValueError, match="Mamba"):
        eagle_cache([("full",), ("mamba", 4)])
    with pytest.raises(ValueError, match="prefix_match_unit"):
        eagle_cache([("full",), ("sliding_window", 8)], prefix_match_unit=2)
    with pytest.raises(ValueError, match="host_tier"):
        eagle_cache(None, host_tier=HostTierConfig())


@pytest.mark.parametrize("groups", [None, [("full",), ("sliding_window", 8)]], ids=["unitary", "hybrid"])
def test_eagle_revalidated_match_is_a_fresh_lookup(groups: list[tuple[Any, ...]] | None) -> None:
    """A match taken before the index changed is revalidated at allocate; with EAGLE the
    unitary shortcut (resume the walk after the still-valid blocks) must drop the block again."""
    cache = eagle_cache(groups)
    seq = list(range(1, 41))
    first = Request("a", seq[:24])
    assert cache.allocate(first, 24)
    first.num_computed_tokens = 24
    cache.commit(first)
    late = Request("b", seq[:33])
    match = cache.lookup(late)  # "a"'s 6 blocks, the last dropped: 20 tokens
    grow = Request("c", seq[:36])
    assert cache.allocate(grow, 36 - cache.lookup(grow).tokens)  # caches blocks 6..8 too
    grow.num_computed_tokens = 36
    cache.commit(grow)
    fresh = cache.lookup(late)
    again = cache.revalidate(match)
    assert (match.tokens, fresh.tokens) == (20, 28)  # the index grew under the old match
    assert (again.tokens, again.blocks) == (fresh.tokens, fresh.blocks)
    assert fresh.tokens == ((33 - 1) // 4 - 1) * 4
