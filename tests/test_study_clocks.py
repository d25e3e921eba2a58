"""The tier and side-channel studies' clock: the GPU roofline (Llama-3-8B on an H100 SXM, the
TTFT and engine-trace studies' clock) by default, the measured CPU clock when asked, recorded
in every engine cell so that a clock change reruns it."""

from __future__ import annotations

import pytest
from prefixcache.experiments.analysis.side_channel import poisson_rate
from prefixcache.experiments.figures import study_side_channel as ssc
from prefixcache.experiments.figures import study_tiers as st
from prefixcache.experiments.figures.common import REPLAY_MODES, cell_name

from prefixcache import CostModel, RooflineClock
from prefixcache.cost_model import named_clock

GPU = RooflineClock.named("h100-llama3-8b").constants()
CPU = CostModel.measured().constants()


def engine_cells(cells: list[dict]) -> list[dict]:
    return [c for c in cells if c["mode"] not in REPLAY_MODES]


@pytest.mark.parametrize("study", [st, ssc])
def test_the_default_clock_is_the_gpu_roofline_the_ttft_study_uses(study) -> None:
    from prefixcache.experiments.figures.study_ttft import CLOCKS

    assert study.CLOCK == CLOCKS[0] == "h100-llama3-8b"


def test_tier_cells_carry_the_roofline_by_default_and_the_cpu_clock_when_asked() -> None:
    default, cpu = engine_cells(st.configs("tiny")), engine_cells(st.configs("tiny", "cpu"))
    assert default and all(c["cost_model"] == GPU for c in default)
    assert cpu and all(c["cost_model"] == CPU for c in cpu)
    assert not {cell_name(c) for c in default} & {cell_name(c) for c in cpu}
    # the arrival rescale is the clock's: the same load, other seconds
    assert {c["arrival_scale"] for c in default}.isdisjoint({c["arrival_scale"] for c in cpu})


def test_side_channel_cells_carry_the_roofline_by_default_and_the_cpu_clock_when_asked() -> None:
    for make in (ssc.attack_configs, ssc.salt_configs):
        default, cpu = make("tiny"), make("tiny", "cpu")
        assert all(c["cost_model"] == GPU for c in default)
        assert all(c["cost_model"] == CPU for c in cpu)
        assert not {cell_name(c) for c in default} & {cell_name(c) for c in cpu}


@pytest.mark.parametrize("clock", ["cpu", "h100-llama3-8b"])
def test_the_background_rate_keeps_the_load_asked_for_of_the_prefill_capacity(clock: str) -> None:
    cost = named_clock(clock)
    rate = poisson_rate(0.5, 512, cost)
    assert rate * cost.saturated_request_s(512, 0, 2048) == pytest.approx(0.5)
    if isinstance(cost, CostModel):  # the linear clock: one prefill_token_s a token
        assert rate == 0.5 / (cost.prefill_token_s * 512)


def test_an_unknown_clock_is_refused_on_the_command_line(capsys) -> None:
    with pytest.raises(SystemExit):
        st.main(["--clock", "tpu", "--out", "/nonexistent"])
    assert "unknown clock 'tpu'" in capsys.readouterr().err
