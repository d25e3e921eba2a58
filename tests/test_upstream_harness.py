"""The upstream comparison harness itself (experiments/upstream/vs_upstream.py): what it times
and under which label its totals land. The replays need vLLM / SGLang; these parts do not."""

from __future__ import annotations

import gc
import inspect

import pytest
from prefixcache.experiments.upstream.scenarios import Scenario, all_scenarios
from prefixcache.experiments.upstream.vs_upstream import trace_label, without_gc


def test_scenarios_are_built_one_at_a_time_and_small_without_traces() -> None:
    scenarios = all_scenarios(large=False)
    assert inspect.isgenerator(scenarios)  # a trace scenario is built only when reached
    built = list(scenarios)
    assert built and not any(sc.large for sc in built)
    assert len({sc.name for sc in built}) == len(built)


def test_trace_totals_name_their_page_size() -> None:
    assert trace_label(Scenario("t16", 1 << 19, 16, large=True)) == " (trace)"  # the paper's row
    assert trace_label(Scenario("t1", 1 << 19, 1, large=True)) == " (trace p1)"


def test_replays_are_timed_with_the_collector_off_and_it_comes_back() -> None:
    assert gc.isenabled()
    seen = []

    def replay() -> tuple[str, float]:
        seen.append(gc.isenabled())
        return "records", 1.5

    assert without_gc(replay) == ("records", 1.5)
    assert seen == [False] and gc.isenabled()

    def failing() -> tuple[str, float]:
        raise RuntimeError("replay failed")

    with pytest.raises(RuntimeError, match="replay failed"):
        without_gc(failing)
    assert gc.isenabled()
