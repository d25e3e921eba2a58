"""The hybrid-causes study: every layout's chain of causes sums to its measured gap (by
construction, and in the numbers the tiny run writes), each run's rate is its cells' own
token hit rate, and the figure refuses a committed full grid whose cells count otherwise."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from prefixcache.experiments.figures import fig_hybrid_causes
from prefixcache.experiments.figures import study_hybrid_causes as sh
from prefixcache.experiments.figures.common import read_table

from tests.helpers import check_stale_grid_refused


@pytest.mark.parametrize("panel", list(sh.PANELS))
def test_each_chain_telescopes_to_the_measured_gap(panel: str) -> None:
    _, _, variants, causes = sh.PANELS[panel]
    labels = {v[0] for v in variants}
    total: Counter[str] = Counter()
    for coefs in causes.values():
        assert set(coefs) <= labels, f"{panel}: a cause reads a run the panel does not have"
        total.update(coefs)
    assert {k: v for k, v in total.items() if v} == dict(sh.MEASURED)
    # every cause is a difference of two runs or a sum of them: its coefficients cancel
    assert all(sum(c.values()) == 0 for c in causes.values())


def test_tiny_run_sums_rates_and_refuses_a_stale_full_grid(tmp_path: Path) -> None:
    results, paper = tmp_path / "results", tmp_path / "paper"
    sh.run(results, "tiny", jobs=1)
    cells = read_table(results / sh.STUDY / "summary")
    causes, rates = sh.tables(cells, results)
    assert len(causes) == sum(len(p[3]) for p in sh.PANELS.values())
    for _, part in causes.groupby("panel"):
        assert part["chain_pt"].sum() == pytest.approx(part["measured_pt"].iloc[0], abs=1e-9)
        assert (part["measured_lo"] <= part["measured_pt"]).all()
        assert (part["measured_pt"] <= part["measured_hi"]).all()
    # a run's rate is its own cell's token hit rate (one seed: no pooling)
    own = cells.set_index(["panel", "label"])
    for r in rates.itertuples():
        cell = own.loc[(r.panel, r.label)]
        assert r.hit_rate_pt == pytest.approx(100 * cell["hit_tokens"] / cell["prompt_tokens"])
        assert r.hit_rate_lo <= r.hit_rate_pt <= r.hit_rate_hi
    gemma = rates[rates["panel"] == "gemma3-like"].set_index("label")["hit_rate_pt"]
    retention = causes[(causes["panel"] == "gemma3-like") & (causes["cause"] == "sparse retention")]
    assert retention["chain_pt"].iloc[0] == pytest.approx(gemma["hashchain-dense"] - gemma["hashchain"])

    fig_hybrid_causes.make(results, paper)
    values = (paper / "generated" / "hybrid_causes_values.tex").read_text()
    assert "\\newcommand{\\hybcTraceRan}{no}" in values
    assert "\\newcommand{\\hybcConvGemmaGap}{--}" in values  # no full grid here
    # a committed grid holding exactly this run's cells
    check_stale_grid_refused(fig_hybrid_causes.make, results, paper, results / sh.FULL,
                             {"causes": causes, "rates": rates}, cells[sh.RUN_KEYS + sh.RUN_COUNTS],
                             "hit_tokens")


def test_a_wrong_chain_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    results = tmp_path / "results"
    sh.run(results, "tiny", jobs=1)
    cells = read_table(results / sh.STUDY / "summary")
    layout, window, variants, causes = sh.PANELS["gpt-oss-like"]
    broken = {k: v for k, v in causes.items() if k != "pool share"}  # a step left out
    monkeypatch.setitem(sh.PANELS, "gpt-oss-like", (layout, window, variants, broken))
    with pytest.raises(RuntimeError, match="do not sum"):
        sh.tables(cells, results)
