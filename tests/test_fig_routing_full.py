"""The full routing grid's reading: a slice counts only when every router ran on both designs,
and two routers are said to differ only when their 95% intervals do not overlap."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from prefixcache.experiments.figures import fig_routing_full as f
from prefixcache.experiments.figures.study_routing import DESIGNS, SCALE


def grid(rates: dict[str, float], half_width: float = 0.01, replicas: int = 4,
         cvs: dict[str, float] | None = None) -> list[dict]:
    rows = []
    for d in DESIGNS:
        for r in SCALE["full"]["routers"]:
            rate = rates.get(r, 0.1)
            rows.append(dict(part="routers", source="mooncake-conversation", replicas=replicas,
                             capacity_tokens=1_000_000, load=0.8, design=d, label=r, token_hit_rate=rate,
                             hit_rate_lo=rate - half_width, hit_rate_hi=rate + half_width, wall_s=60.0,
                             requests=12031, imbalance_cv=(cvs or {}).get(r, 0.2)))
    return rows


def test_a_slice_is_complete_only_with_every_router_on_every_design() -> None:
    whole = pd.DataFrame(grid({}))
    assert f.complete_slices(whole) == [("mooncake-conversation", 4, 1_000_000, 0.8)]
    partial = pd.DataFrame(grid({}, replicas=8)[:-1])  # one router of one design missing
    assert f.complete_slices(pd.concat([whole, partial])) == [("mooncake-conversation", 4, 1_000_000, 0.8)]


def test_routers_differ_only_where_their_intervals_do_not_overlap() -> None:
    rows = pd.DataFrame([
        dict(label="a", token_hit_rate=0.20, hit_rate_lo=0.18, hit_rate_hi=0.22),
        dict(label="b", token_hit_rate=0.17, hit_rate_lo=0.15, hit_rate_hi=0.19),  # overlaps a
        dict(label="c", token_hit_rate=0.10, hit_rate_lo=0.09, hit_rate_hi=0.11),
    ])
    assert sorted(f.separated_pairs(rows)) == [("a", "c"), ("b", "c")]
    assert f.best_group(rows) == ["a", "b"]


def write_grid(tmp_path: Path, rows: list[dict]) -> Path:
    results = tmp_path / "results"
    (results / "routing_full").mkdir(parents=True)
    pd.DataFrame(rows).to_csv(results / "routing_full" / "summary.csv", index=False)
    (results / "routing_full" / "meta.json").write_text(json.dumps({"cells_total": 984, "executor": "ray",
                                                                    "machine": "test"}))
    return results


def test_the_values_describe_the_first_complete_slice(tmp_path: Path) -> None:
    rates = {"oracle": 0.3, "round-robin": 0.05}
    f.make(write_grid(tmp_path, grid(rates)), tmp_path / "paper")
    tex = (tmp_path / "paper" / "generated" / "routing_full_values.tex").read_text()
    assert "\\newcommand{\\routFullRan}{yes}" in tex
    assert "\\newcommand{\\routFullComplete}{no}" in tex  # 26 of the full grid's cells
    assert "\\newcommand{\\routFullHashBest}{\\texttt{oracle}}" in tex
    n = len(SCALE["full"]["routers"])
    # oracle beats every other router, round-robin loses to every other; the rest tie
    assert f"\\newcommand{{\\routFullHashPairs}}{{{2 * (n - 1) - 1}}}" in tex
    assert "tab:routing-full" in (tmp_path / "paper" / "generated" / "routing_full.tex").read_text()


def test_without_a_grid_the_paper_is_told_it_did_not_run(tmp_path: Path) -> None:
    f.make(tmp_path / "results", tmp_path / "paper")
    tex = (tmp_path / "paper" / "generated" / "routing_full_values.tex").read_text()
    assert "\\newcommand{\\routFullRan}{no}" in tex
    assert "no slice yet" in (tmp_path / "paper" / "generated" / "routing_full_rank.tex").read_text()


def test_the_ranking_reads_every_complete_slice(tmp_path: Path) -> None:
    """On 4 replicas the oracle ties sglang at the top; on 16 it falls below sglang's interval
    with a higher imbalance: it is in the best group of one slice of two, sglang of both, and the
    values give the oracle's imbalance where it fell out against the best router's there."""
    small = grid({"oracle": 0.30, "sglang": 0.30, "round-robin": 0.05})
    large = grid({"oracle": 0.20, "sglang": 0.33, "round-robin": 0.05}, replicas=16,
                 cvs={"oracle": 0.9, "sglang": 0.15})
    paper = tmp_path / "paper"
    f.make(write_grid(tmp_path, small + large), paper)
    tex = (paper / "generated" / "routing_full_values.tex").read_text()
    assert "\\newcommand{\\routFullSlices}{2}" in tex
    assert "\\newcommand{\\routFullHashAlwaysBest}{\\texttt{sglang}}" in tex
    assert "\\newcommand{\\routFullRadixOracleOut}{1}" in tex
    assert "\\newcommand{\\routFullHashOracleOutCv}{0.90}" in tex
    assert "\\newcommand{\\routFullHashOracleOutTopCv}{0.15}" in tex
    n = len(SCALE["full"]["routers"])
    # 4 replicas: the two at the top beat all but each other, round-robin loses to the rest;
    # 16: sglang beats all, the oracle all but sglang, round-robin loses to the rest
    low, high = 2 * (n - 2) + (n - 3), (n - 1) + (n - 2) + (n - 3)
    assert f"\\newcommand{{\\routFullHashPairsMin}}{{{low}}}" in tex
    assert f"\\newcommand{{\\routFullHashPairsMax}}{{{high}}}" in tex
    table = (paper / "generated" / "routing_full_rank.tex").read_text()
    assert "oracle & 1/2 & 20.0--30.0 & 1/2 & 20.0--30.0 \\\\" in table
    assert "sglang & 2/2 & 30.0--33.0 & 2/2 & 30.0--33.0 \\\\" in table
    assert "round-robin & 0/2 & 5.0--5.0" in table


def test_a_grid_with_every_cell_is_complete(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rows = grid({"oracle": 0.3})
    monkeypatch.setattr(f, "configs", lambda scale: (rows, []))  # the study: these cells only
    results = write_grid(tmp_path, rows)
    meta = json.loads((results / "routing_full" / "meta.json").read_text())
    (results / "routing_full" / "meta.json").write_text(json.dumps({**meta, "cells_total": len(rows)}))
    f.make(results, tmp_path / "paper")
    tex = (tmp_path / "paper" / "generated" / "routing_full_values.tex").read_text()
    assert "\\newcommand{\\routFullComplete}{yes}" in tex
