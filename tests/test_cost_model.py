"""The cost model's constants come from the calibration file: the fit that makes them, the
file that holds them, the errors when it is missing or malformed, and the study cells that
record which clock they ran under."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from prefixcache.experiments.bench import cost_model as calibration

from prefixcache import CacheConfig, CostModel, Engine, make_cache
from prefixcache.cost_model import CONSTANTS, MEASURED_PATH, named_clock, read_measured

SHAPES = calibration.shapes_of(calibration.PLANS["cpu"])
PREFILL = np.array([s.prefill for s in SHAPES])
DECODE = np.array([s.decode for s in SHAPES])


def timings(overhead: float, prefill: float, decode: float) -> np.ndarray:
    return overhead + prefill * PREFILL + decode * DECODE


@given(
    overhead=st.floats(1e-5, 0.1),
    prefill=st.floats(1e-7, 1e-2),
    decode=st.floats(1e-7, 1e-2),
)
def test_fit_recovers_the_constants_of_exact_linear_timings(
    overhead: float, prefill: float, decode: float
) -> None:
    fit = calibration.fit_linear(PREFILL, DECODE, timings(overhead, prefill, decode))
    assert fit.constants == pytest.approx(
        dict(step_overhead_s=overhead, prefill_token_s=prefill, decode_token_s=decode), rel=1e-6
    )
    assert fit.r2 == pytest.approx(1.0) and fit.max_rel_residual < 1e-9 and fit.pinned_at_zero == []


def test_fit_recovers_constants_through_noise_and_reports_it() -> None:
    true = dict(step_overhead_s=0.02, prefill_token_s=4e-4, decode_token_s=3e-3)
    noise = np.random.default_rng(0).normal(1.0, 0.03, len(SHAPES))  # 3% multiplicative
    fit = calibration.fit_linear(PREFILL, DECODE, timings(*true.values()) * noise)
    assert fit.constants == pytest.approx(true, rel=0.15)
    assert 0.9 < fit.r2 < 1.0 and 0.0 < fit.max_rel_residual < 0.2


def test_a_negative_fitted_constant_is_pinned_at_zero_and_the_rest_refitted() -> None:
    seconds = 1e-4 * PREFILL + 2e-4 * DECODE - 1e-4  # unconstrained, the overhead is negative
    fit = calibration.fit_linear(PREFILL, DECODE, seconds)
    assert fit.pinned_at_zero == ["step_overhead_s"] and fit.constants["step_overhead_s"] == 0.0
    assert all(v > 0 for k, v in fit.constants.items() if k != "step_overhead_s")
    refit, *_ = np.linalg.lstsq(np.stack([PREFILL, DECODE], 1).astype(float), seconds, rcond=None)
    assert [fit.constants["prefill_token_s"], fit.constants["decode_token_s"]] == pytest.approx(refit)


def test_the_default_cost_model_is_the_calibration_file() -> None:
    record = json.loads(MEASURED_PATH.read_text())
    cost = CostModel.measured()
    assert cost.constants() == record["constants"]
    assert cost.source == record["label"] and cost.source
    engine = Engine(make_cache("radix", CacheConfig(64, 1)))
    assert engine.cost_model == cost and engine.cost_model.source == record["label"]
    assert engine.cost_model.step_time(3, 2) == (
        record["constants"]["step_overhead_s"] + 3 * record["constants"]["prefill_token_s"]
        + 2 * record["constants"]["decode_token_s"]
    )


def test_the_calibration_file_says_what_was_timed_and_where() -> None:
    record = read_measured()
    assert {"platform", "cpu_count", "device", "device_name", "torch"} <= set(record["machine"])
    assert {"r2", "max_rel_residual", "points", "repeats"} <= set(record["fit"])
    assert record["model"]["attention_impl"] in ("reference", "triton")
    assert ("GPU" if record["machine"]["device"] == "cuda" else "CPU") in record["label"]


def test_explicit_constants_still_work_and_equality_ignores_the_source() -> None:
    a = CostModel(step_overhead_s=0.0, prefill_token_s=0.01, decode_token_s=0.0)
    b = CostModel(0.0, 0.01, 0.0, source="elsewhere")
    assert a == b and a.step_time(5, 7) == pytest.approx(0.05)
    with pytest.raises(TypeError):
        CostModel()  # type: ignore[call-arg]  # no typed defaults left


@pytest.mark.parametrize("bad", [-1e-3, float("nan"), float("inf"), "0.01", True])
def test_a_constant_that_is_not_a_finite_non_negative_number_is_rejected(bad: object) -> None:
    with pytest.raises(ValueError, match="prefill_token_s"):
        CostModel(0.0, bad, 0.0)  # type: ignore[arg-type]


def good_record() -> dict:
    return json.loads(MEASURED_PATH.read_text())


def without(key: str) -> dict:
    record = good_record()
    del record[key]
    return record


def with_constants(**constants: float) -> dict:
    return {**good_record(), "constants": constants}


MALFORMED = {
    "not JSON": "{ this is not json",
    "a list": json.dumps([1, 2, 3]),
    "no label": json.dumps(without("label")),
    "no machine": json.dumps(without("machine")),
    "empty label": json.dumps({**good_record(), "label": "  "}),
    "a constant missing": json.dumps(with_constants(step_overhead_s=0.1, prefill_token_s=0.1)),
    "an unknown constant": json.dumps(with_constants(**dict.fromkeys(CONSTANTS, 0.1), x=1.0)),
    "a negative constant": json.dumps(with_constants(**dict(zip(CONSTANTS, (0.1, 0.1, -0.1), strict=True)))),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_a_malformed_calibration_file_is_a_clear_error(case: str, tmp_path: Path) -> None:
    path = tmp_path / "cost.json"
    path.write_text(MALFORMED[case])
    with pytest.raises(ValueError, match="cost-model calibration file") as err:
        CostModel.measured(path)
    assert str(path) in str(err.value)


def test_a_missing_calibration_file_says_how_to_make_one(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="make calibrate"):
        CostModel.measured(tmp_path / "absent.json")


def test_calibration_quick_mode_writes_a_well_formed_file_elsewhere(tmp_path: Path) -> None:
    committed = MEASURED_PATH.read_bytes()
    constants, points = tmp_path / "c.json", tmp_path / "p.csv"
    argv = ["--quick", "--device", "cpu", "--constants", str(constants), "--points", str(points)]
    assert calibration.main(argv) == 0
    assert MEASURED_PATH.read_bytes() == committed  # the quick run never touches the real file
    record = read_measured(constants)
    assert record["label"].startswith("QUICK CHECK") and record["machine"]["device"] == "cpu"
    assert record["model"]["dim"] == calibration.PLANS["quick"].model.dim
    rows = list(csv.DictReader(points.open()))
    assert len(rows) == record["fit"]["points"] == len(calibration.shapes_of(calibration.PLANS["quick"]))
    assert all(float(r["median_s"]) > 0 for r in rows)
    cost = CostModel.measured(constants)
    for r in rows:  # the CSV's predictions are the file's constants
        expect = cost.step_time(int(r["prefill_tokens"]), int(r["decode_tokens"]))
        assert float(r["predicted_s"]) == pytest.approx(expect)


def test_engine_cells_record_their_clock_and_replay_cells_have_none() -> None:
    from prefixcache.experiments.figures.common import cell_config, cell_name

    kw = dict(source="multi-turn-chat", backend="radix", page_size=1, capacity_tokens=8192)
    engine_cell = cell_config("t", **kw)
    assert engine_cell["cost_model"] == CostModel.measured().constants()
    assert "cost_model" not in cell_config("t", mode="replay", **kw)
    other_clock = {**engine_cell, "cost_model": {**engine_cell["cost_model"], "step_overhead_s": 1.0}}
    assert cell_name(other_clock) != cell_name(engine_cell)  # a recalibration reruns the cell
    gpu = named_clock("h100-llama3-8b")
    gpu_cell = cell_config("t", clock=gpu, **kw)
    assert gpu_cell["cost_model"] == gpu.constants() and cell_name(gpu_cell) != cell_name(engine_cell)
    with pytest.raises(ValueError, match="has no clock"):
        cell_config("t", mode="replay", clock=gpu, **kw)


def test_an_engine_cell_runs_under_the_clock_its_config_records(tmp_path: Path) -> None:
    from prefixcache.experiments.figures.common import cell_config, run_cell

    config = cell_config("t", source="generated-shared-prefix", backend="radix", page_size=1,
                         capacity_tokens=8192, params=dict(num_groups=2, prompts_per_group=2, output_len=2))
    config["cost_model"] = dict(step_overhead_s=1.0, prefill_token_s=0.0, decode_token_s=0.0)
    row = run_cell(config, tmp_path)  # every request arrives at 0: the clock only counts steps
    assert row["sim_seconds"] == row["steps"] > 0


def test_the_paper_macros_name_the_calibration_and_refuse_studies_of_another_clock(tmp_path: Path) -> None:
    pytest.importorskip("pandas")
    import pandas as pd
    from prefixcache.experiments.figures import tab_cost_model
    from prefixcache.experiments.figures.common import write_table
    from prefixcache.experiments.figures.plotting import tex_escape

    results, paper = tmp_path / "results", tmp_path / "paper"
    cost = CostModel.measured()
    same = pd.DataFrame({"cost_model": [json.dumps(cost.constants())] * 2})
    write_table(same, results / "ttft" / "summary")
    (path,) = tab_cost_model.make(results, paper)
    tex = path.read_text()
    assert tex_escape(cost.source) in tex and "\\newcommand{\\costDevice}" in tex
    optimum_row = None  # the scheduling study's computed optimum ran no engine
    write_table(pd.DataFrame({"cost_model": [json.dumps(cost.constants()), optimum_row]}),
                results / "scheduling" / "summary")
    assert tab_cost_model.make(results, paper) == [path]
    other = {**cost.constants(), "decode_token_s": cost.decode_token_s * 2}
    write_table(pd.DataFrame({"cost_model": [json.dumps(other)]}), results / "scheduling" / "summary")
    with pytest.raises(ValueError, match="scheduling ran under"):
        tab_cost_model.make(results, paper)
    # the GPU roofline beside the calibrated clock (the ttft study runs both) is no contradiction
    gpu = json.dumps(named_clock("h100-llama3-8b").constants())
    write_table(pd.DataFrame({"cost_model": [json.dumps(cost.constants()), gpu]}),
                results / "scheduling" / "summary")
    assert tab_cost_model.make(results, paper) == [path]
