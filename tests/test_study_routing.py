"""The routing study's cells: the arrival rescale gives the load asked for, a rerun reads the
stored cell back, and cells run as Ray tasks give joblib's results in every column but the
measured wall time (issue 17: cluster studies run their cells as a sweep does)."""

from __future__ import annotations

import itertools
import json
import shutil

import pandas as pd
import pytest
from prefixcache.experiments.figures import study_routing as sr
from prefixcache.experiments.figures.common import read_table

from prefixcache import CostModel, RooflineClock
from prefixcache.cost_model import named_clock


def cells() -> list[dict]:
    return [sr.cluster_config(source="mooncake-conversation", design=d, router=r, replicas=2,
                              capacity=1 << 16, limit=30) for d, r in (("hashchain", "round-robin"),
                                                                        ("radix", "oracle"))]


@pytest.mark.parametrize("clock", ["cpu", sr.CLOCK])
def test_the_rescaled_arrivals_offer_the_load_asked_for(trace_data, clock) -> None:
    c = sr.cluster_config(source="mooncake-conversation", design="hashchain", router="round-robin",
                          replicas=2, capacity=1 << 16, limit=30, clock=clock)
    reqs = sr.rescaled_requests(c)
    cm = named_clock(clock)
    work = sum(cm.saturated_request_s(r.num_prompt_tokens, r.max_new_tokens, 2048) for r in reqs)
    span = reqs[-1].arrival_time - reqs[0].arrival_time
    assert reqs[0].arrival_time == 0.0
    assert work / (span * c["replicas"]) == pytest.approx(sr.LOAD)
    assert [r.arrival_time for r in reqs] == sorted(r.arrival_time for r in reqs)


def test_cells_run_under_the_gpu_roofline_by_default_and_the_cpu_clock_when_asked() -> None:
    default, _ = sr.configs("tiny")
    cpu, _ = sr.configs("tiny", "cpu")
    assert sr.CLOCK == "h100-llama3-8b"
    assert all(c["clock"] == sr.CLOCK and c["cost_model"] == RooflineClock.named(sr.CLOCK).constants()
               for c in default)
    assert all(c["clock"] == "cpu" and c["cost_model"] == CostModel.measured().constants() for c in cpu)
    # a clock change is a new cell: nothing stored under the other clock is read back
    assert not {sr.cell_name(c) for c in default} & {sr.cell_name(c) for c in cpu}


def test_every_scale_has_one_lag_zero_cell_per_exact_router_and_no_duplicate() -> None:
    for scale in sr.SCALE:
        clusters, pooled = sr.configs(scale)
        names = [json.dumps(c, sort_keys=True) for c in clusters + pooled]
        assert len(set(names)) == len(names), scale
        lags = [c for c in clusters if c["part"] == "lag"]
        assert all(c["kv_events"] and c["event_lag_s"] > 0 for c in lags)


def _table(rows: list[dict]) -> pd.DataFrame:
    return pd.DataFrame(rows).drop(columns=["wall_s"]).sort_values("cell").reset_index(drop=True)


def test_cells_on_a_local_ray_match_joblib_and_are_read_back(tmp_path, trace_data) -> None:
    ray = pytest.importorskip("ray", reason="the ray extra is not installed (pip install '.[ray]')")
    todo = cells()
    joblib_rows = list(sr._cells(todo, tmp_path / "joblib", False, 2, "joblib", None, sr.STUDY))
    try:
        ray_rows = list(sr._cells(todo, tmp_path / "ray", False, 2, "ray", None, sr.STUDY))
    except Exception as e:  # only a machine where Ray cannot start at all may skip
        pytest.skip(f"a local Ray could not start here: {type(e).__name__}: {e}")
    assert not ray.is_initialized()
    pd.testing.assert_frame_equal(_table(ray_rows), _table(joblib_rows))
    again = list(sr._cells(todo, tmp_path / "joblib", False, 1, "joblib", None, sr.STUDY))
    assert again == joblib_rows  # stored cells come back as they were written (wall time included)


def test_a_cells_hit_interval_resamples_whole_conversations(trace_data) -> None:
    """Requests of one conversation are correlated: the interval resamples conversations
    (study_engine_traces' grouping), and differs from one that takes requests as independent."""
    import numpy as np
    from prefixcache.experiments.analysis.metrics import grouped_ratio_ci95
    from prefixcache.experiments.figures.study_engine_traces import conversations_by_id

    c = sr.cluster_config(source="mooncake-conversation", design="radix", router="round-robin",
                          replicas=2, capacity=1 << 16, limit=300)
    row, rows = sr.simulate_cluster(c)
    ok = rows[~rows["rejected"]]
    hits, prompts = ok["hit_tokens"].to_numpy(float), ok["prompt_tokens"].to_numpy(float)
    groups = conversations_by_id(c["source"], c["limit"]).loc[ok["request_id"]].to_numpy()
    assert len(set(groups)) < len(groups)  # some conversation has several requests here
    assert (row["hit_rate_lo"], row["hit_rate_hi"]) == grouped_ratio_ci95(hits, prompts, groups)
    assert (row["hit_rate_lo"], row["hit_rate_hi"]) != grouped_ratio_ci95(hits, prompts, np.arange(len(ok)))
    assert row["ci_unit"] == sr.CI_UNIT


def test_the_full_grid_is_every_router_at_every_point_and_load() -> None:
    """Issue 32's grid: both traces, 4/8/16 replicas, 1M/3M tokens a replica, both designs,
    loads 0.5/0.8/1.0, every router (the events modes included); the event lags at one point
    and load; a pooled replay per (trace, replicas, design)."""
    clusters, pooled = sr.configs("full")
    routers = [c for c in clusters if c["part"] == "routers"]
    got = sorted((c["source"], c["replicas"], c["capacity_tokens"], c["design"], c["load"], c["label"])
                 for c in routers)
    want = sorted(itertools.product(sr.MOONCAKE_TRACES, [4, 8, 16], [1_000_000, 3_000_000], sr.DESIGNS,
                                    [0.5, 0.8, 1.0], [r[0] for r in sr.ROUTERS]))
    assert got == want
    assert {"dynamo-events", "dynamo-current-events", "llm-d-precise"} <= {
        c["label"] for c in routers if c["kv_events"]}
    lags = [c for c in clusters if c["part"] == "lag"]
    assert lags and {(c["replicas"], c["capacity_tokens"], c["load"]) for c in lags} == {(4, 1_000_000, 0.8)}
    assert all(c["limit"] is None for c in clusters) and len(pooled) == 2 * 3 * 2
    assert {c["study"] for c in pooled} == {sr.FULL}


def test_a_rerun_runs_only_the_cells_its_summary_lacks(tmp_path, trace_data, monkeypatch) -> None:
    """The full grid spans sessions: a run of some cells leaves a summary; a later run (its
    cell folders gone, as in a fresh clone with the committed table) reads those rows back and
    runs only the others, ending with the table one run of every cell writes."""
    clusters, _ = sr.configs("tiny")
    sr.run(tmp_path, "tiny", jobs=1, max_cells=3)
    first = read_table(tmp_path / sr.STUDY / "summary")
    assert (first["part"] != "global").sum() == 3
    for folder in (tmp_path / sr.STUDY).iterdir():
        if folder.is_dir() and folder.name.startswith("mooncake") and "cluster" in folder.name:
            shutil.rmtree(folder)
    ran: list[str] = []
    real = sr.run_cluster_cell
    monkeypatch.setattr(sr, "run_cluster_cell", lambda c, *a: ran.append(sr.cell_name(c)) or real(c, *a))
    sr.run(tmp_path, "tiny", jobs=1)
    assert len(ran) == len(clusters) - 3 and not set(ran) & set(first["cell"].dropna())
    resumed = read_table(tmp_path / sr.STUDY / "summary")
    sr.run(tmp_path / "once", "tiny", jobs=1)
    once = read_table(tmp_path / "once" / sr.STUDY / "summary")
    measured = [c for c in once.columns if "wall" in c or c.startswith("cache_op")]  # this machine's clock
    pd.testing.assert_frame_equal(resumed.drop(columns=measured), once.drop(columns=measured))


def test_the_full_grid_keeps_each_part_it_runs_and_its_bounds_come_with_the_last(
    tmp_path, trace_data, monkeypatch
) -> None:
    """``--max-cells`` runs of the full grid (here over the tiny grid's cells) each leave the
    committed table with every cell done so far and a meta that counts them; the pooled replays
    run once, with the part that completes the grid."""
    tiny = sr.configs("tiny")
    monkeypatch.setattr(sr, "configs", lambda scale, clock=sr.CLOCK: tiny)
    clusters, pooled = tiny
    sr.run(tmp_path, "full", jobs=1, max_cells=2)
    table = pd.read_csv(tmp_path / sr.FULL / "summary.csv")
    meta = json.loads((tmp_path / sr.FULL / "meta.json").read_text())
    assert len(table) == 2 and set(table["part"]) != {"global"}
    assert (meta["cells_total"], meta["cells_done"], meta["last_run_cells"]) == (len(clusters), 2, 2)
    cell_folders = [f for f in (tmp_path / sr.FULL).iterdir() if f.is_dir()]
    assert len(cell_folders) == 2
    for folder in cell_folders:
        shutil.rmtree(folder)  # a fresh clone: the committed table alone
    ran: list[str] = []
    real = sr.run_cluster_cell
    monkeypatch.setattr(sr, "run_cluster_cell", lambda c, *a: ran.append(sr.cell_name(c)) or real(c, *a))
    sr.run(tmp_path, "full", jobs=1)
    assert len(ran) == len(clusters) - 2
    table = pd.read_csv(tmp_path / sr.FULL / "summary.csv")
    assert (table["part"] != "global").sum() == len(clusters)
    assert (table["part"] == "global").sum() == len(pooled)
