"""Our backends replay request sequences recorded from vLLM's and SGLang's own code.

The fixtures (tests/fixtures/upstream/*.json) were written by
``experiments/upstream/vs_upstream.py --record`` from vLLM 0.33.0's KVCacheManager and SGLang 0.5.23's
RadixCache + allocator; replaying them needs neither. Per request, the hit length and the
physical page ids (vLLM block ids; SGLang slot // page_size) must match exactly, and so must the
pool usage (free / evictable / in use pages) after every operation.

SGLang fixtures come in both allocator modes, named by it: ``sglang_default_*`` (need_sort=False,
what a plain SGLang server runs) and ``sglang_needsort_*`` (need_sort=True, its PD-disaggregation
mode). Each records its ``options``, which the replay passes to ``make_cache``; a needsort
fixture holds no scenario of its own but names the default fixture that does (``scenario_in``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from prefixcache.experiments.upstream.ours import compare, replay_ours

from prefixcache import available_backends

FIXTURES = sorted((Path(__file__).parent / "fixtures" / "upstream").glob("*.json"))


def _id(path: Path) -> str:
    return path.stem


def scenario_of(path: Path, fixture: dict[str, Any]) -> dict[str, Any]:
    if "scenario" in fixture:
        return fixture["scenario"]  # type: ignore[no-any-return]
    return json.loads((path.parent / fixture["scenario_in"]).read_text())["scenario"]  # type: ignore[no-any-return]


@pytest.mark.parametrize("path", FIXTURES, ids=_id)
def test_replay_matches_upstream(path: Path) -> None:
    fixture = json.loads(path.read_text())
    backend = fixture["backend"]
    if backend not in available_backends():
        pytest.skip(f"backend {backend!r} is not registered yet")
    scenario = scenario_of(path, fixture)
    ours, _ = replay_ours(backend, scenario, **fixture.get("options", {}))
    diffs = compare(ours, fixture["records"], scenario["ops"])
    assert not diffs, f"{fixture['upstream']} disagrees on {len(diffs)} op(s):\n" + "\n".join(diffs[:10])


def test_fixtures_present_and_small() -> None:
    assert len(FIXTURES) >= 20
    assert sum(p.stat().st_size for p in FIXTURES) < 300_000
    fixtures = {p.stem: json.loads(p.read_text()) for p in FIXTURES}
    assert {f["system"] for f in fixtures.values()} == {"vllm", "sglang"}
    # every SGLang scenario in both allocator modes, each fixture saying which it replays
    sglang = {name: f for name, f in fixtures.items() if f["system"] == "sglang"}
    for name, f in sglang.items():
        mode, scenario = name.split("_", 2)[1:]
        assert f["options"] == {"need_sort": mode == "needsort"}, name
        other = f"sglang_{'default' if mode == 'needsort' else 'needsort'}_{scenario}"
        assert other in sglang, f"{name} has no fixture for the other allocator mode"
