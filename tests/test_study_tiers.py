"""The tier study's full grid: every (trace, device, host, write policy) cell and every pooled
bound, a committed summary holding exactly the cells of the part it says it ran, and its table's
rates over the whole trace's prompt tokens."""

from __future__ import annotations

import json
from itertools import product
from pathlib import Path

import pandas as pd
import pytest
from prefixcache.experiments.figures import fig_tiers_full
from prefixcache.experiments.figures import study_tiers as st
from prefixcache.experiments.figures.common import MOONCAKE_TRACES, REPO_ROOT, cell_name, run_cells

FULL = REPO_ROOT / "results" / st.FULL


def key(c: dict) -> tuple:
    device = {"tiers": c["capacity_tokens"], "pooled": c.get("gpu_tokens"), "host-pool": 0}[c["part"]]
    return c["source"], c["part"], c["label"], device, c["host_tokens"]


def test_the_full_grid_runs_every_write_policy_at_every_host_point_with_its_pooled_bound() -> None:
    s = st.SCALE["full"]
    cells = st.configs("full")
    keys = [key(c) for c in cells]
    assert len(keys) == len(set(keys))
    assert set(s["traces"]) == set(MOONCAKE_TRACES) and s["gpus"] == [1_000_000, 3_000_000]
    assert s["hosts"] == [0, 10_000_000, 50_000_000, st.UNBOUNDED]
    want = set()
    for source, gpu, name in product(s["traces"], s["gpus"], s["hosts"]):
        host = st.host_size(name, source, None)
        labels = st.POLICIES if host else st.DESIGNS  # no host tier: no write policy
        want |= {(source, "tiers", label, gpu, host) for label in labels}
        want |= {(source, "pooled", f"pooled-{d}", gpu, host) for d in st.DESIGNS}
        if host:  # the inclusive bound: a pool of the host's size alone
            want |= {(source, "host-pool", f"host-pool-{d}", 0, host) for d in st.DESIGNS}
    assert set(keys) == want
    assert set(st.POLICIES) == {"hashchain", "hashchain-arc", "radix", "radix-selective", "radix-write-back"}
    for c in cells:
        assert c["limit"] is None  # whole traces
        if c["part"] == "pooled":
            assert c["mode"] == "replay" and c["capacity_tokens"] == c["gpu_tokens"] + c["host_tokens"]
        elif c["part"] == "host-pool":
            assert c["mode"] == "replay" and c["capacity_tokens"] == c["host_tokens"] > 0
        elif c["host_tokens"]:
            tier = c["options"]["host_tier"]
            assert tier["capacity_tokens"] == c["host_tokens"]
            assert tier == dict(st.POLICIES[c["label"]][1], capacity_tokens=c["host_tokens"])


def test_the_unbounded_host_holds_every_token_of_the_trace() -> None:
    from prefixcache.experiments.inputs.traces import read_mooncake

    for source in MOONCAKE_TRACES:
        tokens = sum(r.input_length + r.output_length for r in read_mooncake(MOONCAKE_TRACES[source]))
        host = st.host_size(st.UNBOUNDED, source, None)
        assert tokens <= host < tokens + st.PAGE and host % st.PAGE == 0
        assert st.host_name(host, source, None) == st.UNBOUNDED
        assert host > max(st.SCALE["full"]["hosts"][1:-1])


def test_a_part_of_the_full_grid_is_its_cells_of_those_traces_and_devices() -> None:
    part = st.configs("full", traces=["mooncake-conversation"], gpus=[1_000_000])
    every = st.configs("full")
    assert {cell_name(c) for c in part} == {
        cell_name(c)
        for c in every
        if c["source"] == "mooncake-conversation" and key(c)[3] in (1_000_000, 0)  # 0: a host-sized pool
    }
    with pytest.raises(ValueError, match="not a device size"):
        st.configs("full", gpus=[2_000_000])
    with pytest.raises(ValueError, match="need --scale full"):
        st.run(Path("/nonexistent"), "default", traces=["mooncake-conversation"])


@pytest.mark.skipif(not (FULL / "summary.csv").exists(), reason="the full grid is not committed")
def test_the_committed_full_summary_holds_exactly_the_cells_of_the_part_it_ran() -> None:
    meta = json.loads((FULL / "meta.json").read_text())
    table = pd.read_csv(FULL / "summary.csv")
    cells = st.configs("full", meta["clock"], meta["traces"], meta["gpus"])
    assert sorted(table["cell"]) == sorted(cell_name(c) for c in cells)
    assert meta["cells"] == len(cells) and meta["grid_cells"] == len(st.configs("full", meta["clock"]))
    assert sorted(pd.read_csv(FULL / "runtime.csv")["cell"]) == sorted(table["cell"])
    # one denominator a trace: every prompt token of the whole trace, as in the engine study
    assert (table.groupby("trace")["prompt_tokens"].nunique() == 1).all()
    assert (table[table["host"] == st.UNBOUNDED]["host_evicted_tokens"] == 0).all()


def test_the_full_table_counts_hits_over_every_prompt_token_and_pairs_each_tier_with_its_bound(
    tmp_path: Path,
) -> None:
    cfgs = [c for c in st.configs("tiny") if c["label"] in ("hashchain", "pooled-hashchain")]
    host = st.SCALE["tiny"]["hosts"][1]
    cfgs.append(
        st.host_pool_cell("mooncake-synthetic", st.SCALE["tiny"]["limit"], "hashchain", "hashchain", host)
    )
    table = st.full_table(cfgs, run_cells(cfgs, tmp_path, jobs=1), tmp_path)
    assert len(table) == len(cfgs) == 4  # host 0, host 512k, its pooled bound and its host-sized pool
    assert (table["device_hit_tokens"] + table["host_hit_tokens"] == table["hit_tokens"]).all()
    assert (table["token_hit_rate"] == table["hit_tokens"] / table["prompt_tokens"]).all()
    assert table["prompt_tokens"].nunique() == 1
    tier = table[(table["part"] == "tiers") & (table["host_tokens"] > 0)].iloc[0]
    pooled = table[table["part"] == "pooled"].iloc[0]
    assert tier["pooled_hit_rate"] == pooled["token_hit_rate"]
    assert tier["gap_to_pooled"] == pytest.approx(tier["token_hit_rate"] - pooled["token_hit_rate"])
    assert tier["gap_lo"] <= tier["gap_to_pooled"] <= tier["gap_hi"]
    alone = table[table["part"] == "host-pool"].iloc[0]
    assert tier["host_pool_hit_rate"] == alone["token_hit_rate"]
    assert tier["host_pool_gap"] == pytest.approx(tier["token_hit_rate"] - alone["token_hit_rate"])
    assert tier["host_pool_gap_lo"] <= tier["host_pool_gap"] <= tier["host_pool_gap_hi"]
    assert tier["token_hit_rate_lo"] <= tier["token_hit_rate"] <= tier["token_hit_rate_hi"]
    # the paper's table and values are made from the folder write_full leaves
    meta = dict(
        executor="joblib",
        jobs=1,
        clock=st.CLOCK,
        traces=["mooncake-synthetic"],
        gpus=[1 << 17],
        cells=len(cfgs),
        grid_cells=len(cfgs),
    )
    st.write_full(tmp_path, cfgs, run_cells(cfgs, tmp_path, jobs=1), meta, 1.0)
    tex, values = fig_tiers_full.make(tmp_path, tmp_path / "paper")
    assert tex.read_text().count("synthetic &") == 2  # one row per tier cell
    macros = values.read_text()
    assert "\\newcommand{\\tierFullRan}{yes}" in macros
    assert f"{{{tier['token_hit_rate'] * 100:.2f}}}" in macros


def _rows(df: pd.DataFrame) -> pd.DataFrame:
    wall_clocks = ["wall_s", "cache_op_s"]
    return df.drop(columns=wall_clocks).sort_values("cell").reset_index(drop=True)


def test_cells_run_as_ray_tasks_match_joblib_and_a_rerun_reads_them_back(tmp_path: Path) -> None:
    ray = pytest.importorskip("ray", reason="the ray extra is not installed (pip install '.[ray]')")
    cfgs = [c for c in st.configs("tiny") if c["backend"] == "hashchain"]
    joblib_rows = run_cells(cfgs, tmp_path / "joblib", jobs=1)
    try:
        ray_rows = run_cells(cfgs, tmp_path / "ray", jobs=1, executor="ray")
    except Exception as e:  # only a machine where Ray cannot start at all may skip
        pytest.skip(f"a local Ray could not start here: {type(e).__name__}: {e}")
    assert not ray.is_initialized()
    pd.testing.assert_frame_equal(_rows(ray_rows), _rows(joblib_rows))
    again = run_cells(cfgs, tmp_path / "ray", jobs=1)  # resumed: every cell read back, none rerun
    pd.testing.assert_frame_equal(again, ray_rows)


def test_a_cluster_address_needs_the_ray_executor(capsys) -> None:
    with pytest.raises(SystemExit):
        st.main(["--address", "auto", "--out", "/nonexistent"])
    assert "needs --executor ray" in capsys.readouterr().err
