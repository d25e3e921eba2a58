"""Our SWA radix tree replays what SGLang 0.5.23's own code did (tests/fixtures/upstream/
sglang_hybrid/sglang_hybrid_*.json, recorded by experiments/upstream/sglang_hybrid_driver.py from
``UnifiedRadixCache`` with the FULL + SWA components, Python tree core, over the real
``SWATokenToKVPoolAllocator``; pool sizes from the real ``HybridSWAPoolConfigurator``).

Per op: insert prefix lengths, match lengths with their full and SWA slot indices, evicted token
counts, and both pools' available and evictable sizes must agree exactly. Fixtures named *eagle*
ran with ``CacheInitParams.is_eagle=True`` (bigram keys) and replay with ``is_eagle=True``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from prefixcache.backends.radix.components.swa import SWAComponent, swa_tree
from prefixcache.backends.radix.events import RadixEventRecorder
from prefixcache.backends.radix.key import RadixKey
from prefixcache.backends.radix.radix_cache import InsertParams, LockReceipt
from prefixcache.backends.radix.swa_pool import SWAPagePool, swa_pool_sizes
from prefixcache.experiments.upstream.kv_event_cases import event_json
from prefixcache.experiments.upstream.sglang_hybrid_driver import replay_requests_ours

from prefixcache import CacheConfig

# A folder of their own, apart from upstream/*.json (test_upstream_fixtures' dense set).
FIXTURES = Path(__file__).parent / "fixtures" / "upstream" / "sglang_hybrid"
TREE_FIXTURES = sorted(FIXTURES.glob("sglang_hybrid_s*.json"))  # scenario12, seeded*: tree ops
REQUEST_FIXTURES = sorted(FIXTURES.glob("sglang_hybrid_req*.json"))  # request lifecycles
POOLS = FIXTURES / "sglang_hybrid_pools.json"  # HybridSWAPoolConfigurator + the allocator


def _load(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())  # type: ignore[no-any-return]


def _diffs(ours: list[dict[str, Any]], fixture: dict[str, Any]) -> list[str]:
    ops = fixture["scenario"]["ops"]
    return [
        f"op {i} {op}: {k} ours={a.get(k)} upstream={v}"
        for i, (a, b, op) in enumerate(zip(ours, fixture["records"], ops, strict=True))
        for k, v in b.items()
        if a.get(k) != v
    ]


def replay_tree(sc: dict[str, Any], events: bool = False) -> list[dict[str, Any]]:
    """The driver's ops through the FULL + SWA tree over SWAPagePool (the same alloc/free calls);
    ``events``: with a KV event recorder, each record holds the events drained after its op."""
    p = sc["page_size"]
    pool = SWAPagePool(sc["full_tokens"] // p + 1, sc["swa_tokens"] // p + 1, page_size=p)
    recorder = RadixEventRecorder(p) if events else None
    swa = SWAComponent(sc["window"], pool)
    tree = swa_tree(p, swa, is_eagle=sc.get("is_eagle", False), events=recorder)
    locks: dict[str, tuple[LockReceipt, list[bool]]] = {}
    out: list[dict[str, Any]] = []

    def slots(pages: np.ndarray) -> np.ndarray:
        return (pages[:, None] * p + np.arange(p)).reshape(-1)

    for op in sc["ops"]:
        rec: dict[str, Any] = {}
        kind = op["op"]
        if kind == "insert":
            n = len(op["tokens"])
            pages = pool.alloc(-(-n // p))
            rec["ok"] = pages is not None
            if pages is not None:
                ev = op.get("evicted", 0)
                pool.free_swa(pages[: ev // p])
                params = InsertParams(0, ev)
                res = tree.insert_ending_at(RadixKey(op["tokens"]), slots(pages)[:n], params=params)
                rec["prefix_len"] = res.prefix_len
        elif kind in ("match", "lock"):
            m = tree.match_prefix(RadixKey(op["tokens"]))
            full = tree.path_indices(m.last_node)
            rec["length"], rec["full"], rec["swa"] = m.length, full.tolist(), swa.to_swa(full).tolist()
            if kind == "lock":
                locks[op["name"]] = (tree.lock(m.last_node), [False])
        elif kind == "unlock":
            receipt, released = locks.pop(op["name"])
            tree.unlock(receipt, swa_released=released[0])
        elif kind == "release_swa":
            receipt, released = locks[op["name"]]
            if not released[0]:
                swa.release_swa_early(receipt)
                released[0] = True
        elif kind == "evict":
            rec["freed"] = list(tree.evict_for_alloc(op["full"], op["swa"]))
        rec["pools"] = [
            pool.full.num_free * p,
            pool.swa.num_free * p,
            tree.evictable_size(),
            swa.evictable,
        ]
        if recorder is not None:
            rec["events"] = [event_json(e) for e in recorder.take_events()]
        tree.check()
        pool.check()
        out.append(rec)
    return out


def test_fixtures_present() -> None:
    assert len(TREE_FIXTURES) >= 5 and len(REQUEST_FIXTURES) >= 4 and POOLS.exists()
    for path in (*TREE_FIXTURES, *REQUEST_FIXTURES, POOLS):
        assert _load(path)["system"] == "sglang-hybrid", path.name


@pytest.mark.parametrize("path", TREE_FIXTURES, ids=lambda p: p.stem)
def test_tree_replays_upstream(path: Path) -> None:
    """Inserts, matches, locks, early SWA releases and both evictions, op by op."""
    fixture = _load(path)
    diffs = _diffs(replay_tree(fixture["scenario"]), fixture)
    assert not diffs, f"{len(diffs)} disagreements:\n" + "\n".join(diffs[:8])


@pytest.mark.parametrize("path", REQUEST_FIXTURES, ids=lambda p: p.stem)
def test_requests_replay_upstream(path: Path) -> None:
    """Whole request lifecycles through make_cache("radix", layout=...): hits, full and SWA
    page tables (0 where the SWA KV was freed), evictions and both pools' usage, op by op.
    Upstream: UnifiedRadixCache.checkpoint / free_kv_row / evict_sliding_windows as the
    scheduler calls them (experiments/upstream/sglang_hybrid_driver.py)."""
    fixture = _load(path)
    diffs = _diffs(replay_requests_ours(fixture["scenario"]), fixture)
    assert not diffs, f"{len(diffs)} disagreements:\n" + "\n".join(diffs[:8])


def test_scenario_12_swa_radix_cache_1() -> None:
    """``test_swa_radix_cache_1`` (window 4, page 1) as 0.5.23 runs it: inserts return 0, 3,
    0, 5; evict(1, 0) deletes [10, 11, 12]; evict(0, 1) deletes the leaf [6, 7] (not a
    tombstone of [1, 2, 3]); evict(1, 2) deletes [60, 70]; both matches give 5 tokens
    [1, 2, 3, 7, 8]. A larger evict(0, 5) then empties the SWA pool's evictable part and
    deletes the last leaf: nothing matches."""
    fixture = _load(FIXTURES / "sglang_hybrid_scenario12.json")
    ours = replay_tree(fixture["scenario"])
    assert not _diffs(ours, fixture)
    assert [r["prefix_len"] for r in ours[:4]] == [0, 3, 0, 5]
    assert [r["freed"] for r in ours[4:7]] == [[3, 3], [2, 2], [2, 2]]
    assert [(r["length"], r["full"]) for r in ours[7:9]] == [(5, [1, 2, 3, 7, 8])] * 2
    assert ours[9]["freed"] == [2, 5] and [r["length"] for r in ours[10:]] == [0, 0]


def test_scenario_12_eagle_bigram_variant() -> None:
    """``test_swa_radix_cache_eagle`` (scenario 12 on an ``is_eagle=True`` tree) as SGLang 0.5.23
    runs it (fixture recorded from its UnifiedRadixCache FULL + SWA, Python core): bigram keys, so
    each insert caches one fewer token than it hands over and reports bigrams already cached:
    0, 2, 0, 4. evict(1, 0) deletes [10, 11, 12]'s 2 bigrams, evict(0, 1) the leaf [6, 7]'s,
    evict(1, 2) [60, 70]'s; both matches then give 4 bigrams ([1..5]: 4 bigrams, all under one
    live window) with full slots [1, 2, 6, 7] (the slot of bigram i is token i's). A larger
    evict(0, 5) tombstones the rest: nothing matches."""
    fixture = _load(FIXTURES / "sglang_hybrid_scenario12_eagle.json")
    assert fixture["scenario"]["is_eagle"] is True
    ours = replay_tree(fixture["scenario"])
    diffs = _diffs(ours, fixture)
    assert not diffs, "\n".join(diffs)
    assert [r["prefix_len"] for r in ours[:4]] == [0, 2, 0, 4]
    assert [r["freed"] for r in ours[4:7]] == [[2, 2], [2, 2], [2, 2]]
    assert [(r["length"], r["full"]) for r in ours[7:9]] == [(4, [1, 2, 6, 7])] * 2
    assert ours[9]["freed"] == [2, 4] and [r["length"] for r in ours[10:]] == [0, 0]


def test_scenario_13_sglang_sizing() -> None:
    """HybridSWAPoolConfigurator's split in layer-token units (52 SW + 10 full layers, 1000
    tokens per layer: full 1201, SWA 960), its page alignment, and its ValueError when the SWA
    pool cannot hold a window plus a page, against the real configurator's outputs."""
    for case in _load(POOLS)["sizing"]:
        layout = [("sliding_window", case["window"])] * case["n_swa"] + [("full",)] * case["n_full"]
        cfg = CacheConfig(case["per_layer_tokens"], case["page_size"], layout=layout)
        if "error" in case:
            with pytest.raises(ValueError, match="cannot hold even one request"):
                swa_pool_sizes(cfg, case["ratio"])
        else:
            assert tuple(swa_pool_sizes(cfg, case["ratio"])) == (case["full"], case["swa"]), case
    first = _load(POOLS)["sizing"][0]
    assert (first["full"], first["swa"]) == (1201, 960)


@pytest.mark.parametrize("page_size", [1, 4])
def test_scenario_14_sglang_allocator(page_size: int) -> None:
    """SWATokenToKVPoolAllocator: alloc takes the same count from both pools (ids mapped),
    free_swa frees only the SWA pool, free both; available is the min."""
    rec = _load(POOLS)["allocator"][f"p{page_size}"]
    p = page_size
    pool = SWAPagePool(16 + 1, 12 + 1, page_size=p)

    def avail() -> list[int]:
        return [pool.full.num_free * p, pool.swa.num_free * p, pool.available * p]

    steps = [avail()]
    first, second = pool.alloc(1), pool.alloc(3)
    assert first is not None and second is not None
    steps.append(avail())
    pages = lambda slots: sorted({s // p for s in slots})  # noqa: E731
    assert first.tolist() == pages(rec["first"]) and second.tolist() == pages(rec["second"])
    assert pool.full_to_swa[second].tolist() == pages(rec["second_swa"])
    pool.free_swa(second)
    steps.append(avail())
    pool.free(first)
    steps.append(avail())
    assert steps == rec["available"]
    assert steps[1][:2] == [steps[0][0] - 4 * p, steps[0][1] - 4 * p]  # both pools, same count
    assert steps[2][0] == steps[1][0]  # free_swa leaves the full pool alone
