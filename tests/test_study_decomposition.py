"""The decomposition study end to end at the tiny scale: the chain's steps add up to the
measured difference, each switch alone is reported beside them, and the figure refuses a
committed full grid whose cells hit otherwise."""

from __future__ import annotations

from pathlib import Path

import pytest
from prefixcache.experiments.figures import fig_decomposition
from prefixcache.experiments.figures import study_decomposition as sd
from prefixcache.experiments.figures.common import read_table

from tests.helpers import check_stale_grid_refused


def test_the_chain_adds_up_and_a_stale_full_grid_is_refused(tmp_path: Path) -> None:
    results, paper = tmp_path / "results", tmp_path / "paper"
    sd.run(results, "tiny", jobs=1)
    cells = read_table(results / sd.STUDY / "summary")
    causes = sd.causes(cells, results)  # (causes.csv holds these to 6 digits)
    assert list(causes["cause"]) == list(sd.CAUSES)  # one cell: every cause once
    # every step of the chain, residual included, sums to radix p1 minus hashchain B=16
    assert causes["chain_pt"].sum() == pytest.approx(causes["measured_pt"].iloc[0], abs=1e-9)
    # the chain's first step and the switch alone start from vLLM's hashchain alike
    first = causes[causes["cause"] == "publication time"].iloc[0]
    assert first["chain_pt"] == first["alone_pt"]
    assert (causes["measured_lo"] <= causes["measured_pt"]).all()
    assert (causes["measured_pt"] <= causes["measured_hi"]).all()
    fig_decomposition.make(results, paper)
    tex = (paper / "generated" / "decomposition.tex").read_text()
    assert "\\newcommand{\\decInside}{1}" in tex and "\\newcommand{\\decCells}{1}" in tex

    # a committed grid holding exactly this run's cells
    check_stale_grid_refused(fig_decomposition.make, results, paper, results / sd.FULL, {"causes": causes},
                             cells[sd.RUN_KEYS + sd.RUN_COUNTS], "hits")
