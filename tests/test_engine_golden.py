"""Today's engine against the engine of c2d2b27 (before the batched step), run by run: every
record field but the wall time, the totals, the usage and stats, what later lookups find (ids
included) and hashchain's free-queue order (tests/engine_golden.py recorded them)."""

from __future__ import annotations

import gzip
import json
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from tests.engine_golden import RECORDED_AT, cells, key, run_cell

FIXTURE = Path(__file__).parent / "fixtures" / "engine" / f"golden_{RECORDED_AT}.json.gz"


@cache
def golden() -> dict[str, Any]:
    with gzip.open(FIXTURE, "rt") as f:
        return json.load(f)  # type: ignore[no-any-return]


def _jsonable(run: dict[str, Any]) -> dict[str, Any]:
    return json.loads(json.dumps(run))  # tuples -> lists, as the fixture stores them


@pytest.mark.parametrize(("source", "backend", "page", "label", "capacity"), cells(),
                         ids=[key(*c[:4]) for c in cells()])
def test_engine_gives_the_recorded_results(source: str, backend: str, page: int, label: str,
                                           capacity: int, request: pytest.FixtureRequest) -> None:
    if source.endswith(".jsonl"):  # a slice of a real trace
        request.getfixturevalue("trace_data")
    expected = golden()["runs"][key(source, backend, page, label)]
    got = _jsonable(run_cell(source, backend, page, capacity))
    fields = golden()["fields"]
    for i, (g, e) in enumerate(zip(got["rows"], expected["rows"], strict=True)):
        assert g == e, f"request {i}: " + ", ".join(
            f"{f} {x!r} != {y!r}" for f, x, y in zip(fields, g, e, strict=True) if x != y)
    assert got == expected


def test_the_fixture_covers_eviction_preemption_and_rejection() -> None:
    """Not vacuous: the recorded runs evict, preempt and reject."""
    fields = golden()["fields"]
    rows = [r for run in golden()["runs"].values() for r in run["rows"]]
    for name in ("preemptions", "evicted_tokens", "rejected", "hit_tokens"):
        assert sum(r[fields.index(name)] for r in rows) > 0, name
