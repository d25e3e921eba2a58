"""KV events of the hybrid radix trees, event by event against SGLang 0.5.23's own streams
(tests/fixtures/upstream/events/sglang_*_streams/, recorded by ``record_events`` of
experiments/upstream/sglang_hybrid_driver.py, sglang_mamba_driver.py and
sglang_hicache_driver.py: ``UnifiedRadixCache`` with ``enable_kv_cache_events``, drained after
every op). The unified tree core records them as
SGLang's does: BlockStored for each new leaf's pages, BlockRemoved for each deleted node (an SWA
or Mamba tombstone keeps its full KV and emits nothing), AllBlocksCleared at every reset."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from prefixcache.experiments.upstream.sglang_hicache_driver import replay_ours as replay_hicache

from tests.test_radix_mamba_upstream import replay_tree as replay_mamba_tree
from tests.test_radix_swa_upstream import replay_tree as replay_swa_tree

pytest.importorskip("msgspec")

EVENTS = Path(__file__).parent / "fixtures" / "upstream" / "events"
SWA_STREAMS = sorted((EVENTS / "sglang_swa_streams").glob("sglang_swa_events_*.json"))
MAMBA_STREAMS = sorted((EVENTS / "sglang_mamba_streams").glob("sglang_mamba_events_*.json"))
HICACHE_STREAMS = sorted((EVENTS / "sglang_hicache_streams").glob("sglang_hicache_events_*.json"))


def _records(path: Path) -> list[dict[str, Any]]:
    return json.loads(path.read_text())["records"]  # type: ignore[no-any-return]


@pytest.mark.parametrize(
    "streams", [SWA_STREAMS, MAMBA_STREAMS, HICACHE_STREAMS], ids=["swa", "mamba", "hicache"]
)
def test_the_event_fixtures_hold_every_kind(streams: list[Path]) -> None:
    assert len(streams) >= 5
    kinds = {(e["type"], e.get("medium")) for p in streams for r in _records(p) for e in r["events"]}
    media = ["GPU", "CPU_PINNED"] if streams is HICACHE_STREAMS else ["GPU"]
    assert kinds == {("AllBlocksCleared", None)} | {
        (kind, medium) for kind in ("BlockStored", "BlockRemoved") for medium in media
    }


def _check_stream(ours: list[dict[str, Any]], fixture: dict[str, Any], ops: list[Any] | None = None) -> None:
    ops = fixture["scenario"]["ops"] if ops is None else ops
    for i, (mine, theirs) in enumerate(zip(ours, fixture["records"], strict=True)):
        upstream = [{k: v for k, v in e.items() if k != "cache_salt"} for e in theirs["events"]]
        assert mine.get("events", []) == upstream, f"record {i}: {ops[i]}"
        if "pools" in theirs:
            assert mine["pools"] == theirs["pools"], f"record {i}"


@pytest.mark.parametrize("path", SWA_STREAMS, ids=lambda p: p.stem)
def test_swa_tree_emits_sglangs_event_stream(path: Path) -> None:
    fixture = json.loads(path.read_text())
    _check_stream(replay_swa_tree(fixture["scenario"], events=True), fixture)


@pytest.mark.parametrize("path", MAMBA_STREAMS, ids=lambda p: p.stem)
def test_mamba_tree_emits_sglangs_event_stream(path: Path) -> None:
    fixture = json.loads(path.read_text())
    _check_stream(replay_mamba_tree(fixture["scenario"], events=True), fixture)


@pytest.mark.parametrize("path", HICACHE_STREAMS, ids=lambda p: p.stem)
def test_hicache_emits_sglangs_event_stream(path: Path) -> None:
    """HiCache (SGLang 0.5.23's unified tree with a host tier): BlockStored on the device for a
    new leaf, an insert's or a load's revival; on the host (CPU_PINNED) when a write-through
    copy acks (each split fragment, the upper first) or a write-back copy is made; BlockRemoved
    on the device at a demotion or a deletion, on the host at host eviction, a reclaimed
    duplicate or a subtree dropped for host pressure (the deepest first)."""
    fixture = json.loads(path.read_text())
    ours = replay_hicache(fixture["scenario"], events=True)
    _check_stream(ours, fixture, [{"op": "setup"}, *fixture["scenario"]["ops"]])


def test_hybrid_caches_take_kv_events_off_by_default_and_refuse_what_is_not_modelled() -> None:
    from prefixcache import CacheConfig, make_cache
    from prefixcache.tiers import HostTierConfig

    swa = CacheConfig(120, 4, layout=(("sliding_window", 8), ("full",)))
    mamba = CacheConfig(120, 1, layout=(("mamba", 4), ("full",)))
    for config in (swa, mamba):
        assert make_cache("radix", config).kv_events is None
        on = make_cache("radix", config, kv_events=True)
        assert [type(e).__name__ for e in on.kv_events.take_events()] == ["AllBlocksCleared"]
        with pytest.raises(ValueError, match="kv_events must be a bool"):
            make_cache("radix", config, kv_events="yes")
    with pytest.raises(ValueError, match="is_eagle"):
        make_cache("radix", swa, kv_events=True, is_eagle=True)
    hicache = make_cache("radix", CacheConfig(120, 4), kv_events=True, host_tier=HostTierConfig())
    assert [type(e).__name__ for e in hicache.kv_events.take_events()] == ["AllBlocksCleared"]
