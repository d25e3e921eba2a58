"""Random request streams replayed through our radix backend agree, operation by operation,
with what SGLang 0.5.23's own caches recorded (issue 33).

Fixtures: tests/fixtures/upstream/random_sglang/random_<family>_s0.json, 10 seeded streams per
family written by ``experiments/upstream/random_streams_sglang.py --record`` from
UnifiedRadixCache with SWA (page 1 / 16, the scheduler's free groups), Mamba (no_buffer),
HiCache (each write policy), EAGLE (dense and SWA), RadixCache's KV event stream, and the dense
tree and HiCache under each of SGLang's eviction policies in turn, through the drivers of
experiments/upstream/. Per op every recorded field must agree: hits, host hits,
loads, page ids (full and SWA), pool usage, freed counts, held states, node states and events.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from prefixcache.experiments.upstream.random_streams_sglang import (
    FAMILIES,
    FIXTURES,
    SGLANG_POLICIES,
    op_differences,
    replay_ours_family,
    streams_of,
)

PATHS = {family: FIXTURES / f"random_{family}_s0.json" for family in FAMILIES}


def _load(family: str) -> dict[str, Any]:
    return json.loads(PATHS[family].read_text())  # type: ignore[no-any-return]


def test_every_family_has_its_fixture_and_they_stay_small() -> None:
    assert all(p.exists() for p in PATHS.values()), [f for f, p in PATHS.items() if not p.exists()]
    assert sum(p.stat().st_size for p in PATHS.values()) < 3_000_000
    for family in FAMILIES:
        assert len(_load(family)["streams"]) == 10


@pytest.mark.parametrize("family", FAMILIES)
def test_fixture_streams_are_the_generators_streams(family: str) -> None:
    """The recorded streams are the seed-0 streams the generator writes today."""
    recorded = [s["scenario"] for s in _load(family)["streams"]]
    assert recorded == streams_of(family, 0, len(recorded))


@pytest.mark.parametrize("family", FAMILIES)
def test_ours_agrees_with_sglang_0_5_23_on_every_operation(family: str) -> None:
    if family == "events":
        pytest.importorskip("msgspec", reason="needs the events extra")
    failures = []
    for stream in _load(family)["streams"]:
        sc = stream["scenario"]
        diffs = op_differences(family, sc, replay_ours_family(family, sc), stream["records"])
        if diffs:
            failures.append(f"{sc['name']}: {len(diffs)} differences, first: {diffs[0][2]}")
    assert not failures, "\n".join(failures)


def test_the_streams_exercise_what_they_claim() -> None:
    """Hits, evictions, freed SWA windows (page id 0), host hits and loads, copied Mamba
    states and every SGLang event kind all occur in the recorded records."""
    seen: set[str] = set()
    for family in FAMILIES:
        for stream in _load(family)["streams"]:
            for rec in stream["records"]:
                seen |= {k for k in ("hit", "host", "loaded", "freed", "cow_source") if rec.get(k)}
                if 0 in (rec.get("swa") or ()):
                    seen.add("swa_freed")
                seen |= {e["type"] for e in rec.get("events", ())}
    want = {"hit", "host", "loaded", "freed", "cow_source", "swa_freed", "BlockStored", "BlockRemoved"}
    assert want <= seen, want - seen


def test_the_policy_families_take_each_of_sglangs_policies() -> None:
    """The policies were really passed: every one of SGLang's seven is recorded, and the same
    stream under another policy would not have recorded the same (policies change outcomes)."""
    for family in ("policies", "hicache-policies"):
        streams = _load(family)["streams"]
        assert {s["scenario"]["options"]["eviction_policy"] for s in streams} == set(SGLANG_POLICIES)
    differs = 0
    for stream in _load("policies")["streams"]:
        sc = stream["scenario"]
        other = "mru" if sc["options"]["eviction_policy"] != "mru" else "lru"
        swapped = {**sc, "options": {"eviction_policy": other}}
        differs += replay_ours_family("policies", swapped) != stream["records"]
    assert differs >= 3, differs


def test_pages_16_and_1_are_both_recorded_for_swa() -> None:
    pages = {s["scenario"]["page_size"] for s in _load("swa")["streams"]}
    assert pages == {1, 16}


def test_fixture_folder_holds_only_these() -> None:
    assert sorted(p.name for p in FIXTURES.glob("*.json")) == sorted(p.name for p in PATHS.values())
