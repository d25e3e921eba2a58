"""The radix host tier against fixtures recorded from SGLang 0.5.23's own ``UnifiedRadixCache``
with HiCache on (experiments/upstream/sglang_hicache_driver.py: the real tree core, FULL
component, token allocator and ``HostKVCache`` slot allocator; ``init_hicache``'s fields set by
hand; a controller whose copies finish at once). Request by request: device hit, host hit
(``host_hit_length``), tokens loaded back, page tables, device usage, free host pages and every
node's state (device / device+host / host) after every op; and the host pool's size and
whether 0.5.23 warned that it is smaller than the device pool."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from prefixcache.experiments.upstream.sglang_hicache_driver import FIXTURES, compare, replay_ours

CASES = sorted(FIXTURES.glob("sglang_hicache_*.json"))


def _load(path: Path) -> dict:
    return json.loads(path.read_text())


def test_fixtures_are_there() -> None:
    names = {p.stem.removeprefix("sglang_hicache_") for p in CASES}
    for want in (
        "scenario1",
        "scenario2_write_through",
        "scenario2_write_through_selective",
        "scenario2_write_back",
        "scenario3",
        "scenario4_device",
        "scenario4_host",
    ):
        assert want in names
    assert sum(n.startswith("seeded") for n in names) >= 12


def _alloc(fx: dict, rid: str) -> dict:
    """The record of ``rid``'s admission (its first alloc op)."""
    ops = fx["scenario"]["ops"]
    i = next(i for i, op in enumerate(ops) if op["op"] == "alloc" and op["rid"] == rid)
    return fx["records"][i + 1]


@pytest.mark.parametrize("path", CASES, ids=lambda p: p.stem.removeprefix("sglang_hicache_"))
def test_matches_sglang_0_5_23_request_by_request(path: Path) -> None:
    fx = _load(path)
    diffs = compare(replay_ours(fx["scenario"]), fx["records"], fx["scenario"]["ops"])
    assert not diffs, f"{len(diffs)} differences, first: " + "; ".join(diffs[:3])


def test_scenario_1_recorded() -> None:
    """0.5.23 write_through: B = A + 10 after A left the device: device 0, host 1000, loaded."""
    b = _alloc(_load(FIXTURES / "sglang_hicache_scenario1.json"), "b")
    assert (b["hit"], b["host"], b["loaded"]) == (0, 1000, 1000)


@pytest.mark.parametrize(
    ("policy", "host"), [("write_through", 1049), ("write_through_selective", 0), ("write_back", 1049)]
)
def test_scenario_2_recorded(policy: str, host: int) -> None:
    """0.5.23: the follow-up turn's host hit: prompt + 49 outputs (write_through, write_back:
    copied at eviction), 0 under selective after one request."""
    t2 = _alloc(_load(FIXTURES / f"sglang_hicache_scenario2_{policy}.json"), "t2")
    assert (t2["hit"], t2["host"], t2["loaded"]) == (0, host, host)


def test_scenario_3_recorded() -> None:
    """0.5.23 load_back_threshold 10: 500 on device, 8 on host -> not loaded."""
    b = _alloc(_load(FIXTURES / "sglang_hicache_scenario3.json"), "b")
    assert (b["hit"], b["host"], b["loaded"]) == (500, 8, 0)


@pytest.mark.parametrize(("where", "want"), [("device", (960, 0, 0)), ("host", (0, 960, 960))])
def test_scenario_4_recorded(where: str, want: tuple[int, int, int]) -> None:
    """0.5.23 page 64, 1000-token prompt cached: key 999 -> 960 reused (device or host)."""
    b = _alloc(_load(FIXTURES / f"sglang_hicache_scenario4_{where}.json"), "b")
    assert (b["hit"], b["host"], b["loaded"]) == want


def test_the_seeded_fixtures_exercise_the_tier() -> None:
    """Not vacuous: the random sequences load from host, skip a short host tail, evict host
    copies (tight pools, where 0.5.23 warned), and leave nodes in every state."""
    loaded = skipped = tight = 0
    states: set[str] = set()
    host_low = False
    for path in CASES:
        fx = _load(path)
        if not path.stem.startswith("sglang_hicache_seeded"):
            continue
        setup, *recs = fx["records"]
        tight += setup["warned"]
        for rec in recs:
            loaded += rec.get("loaded", 0) > 0
            skipped += rec.get("host", 0) > 0 and rec.get("loaded") == 0
            states |= {n[2] for n in rec.get("nodes", [])}
            host_low |= setup["warned"] and rec["host_free"] == 0
    assert loaded >= 10 and skipped >= 1 and tight == 6
    assert states == {"d", "dh", "h"}
    assert host_low, "no tight host pool ever ran full"
