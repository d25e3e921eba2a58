"""The upstream comparison harness itself (experiments/upstream/vs_upstream.py): what it times
and under which label its totals land. The replays need vLLM / SGLang; these parts do not."""

from __future__ import annotations

import gc
import inspect
import sys
import types
from pathlib import Path
from typing import Any

import pandas as pd
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


def test_main_times_like_for_like_and_labels_a_page_one_trace(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """``vs_upstream.main`` with SGLang standing in (its replay is ours, recording what it runs
    under): torch goes to one thread before any replay, every replay runs with the collector
    off, and a page-1 trace scenario's totals land under its own label."""
    import torch
    from prefixcache.experiments.upstream import shim, vs_upstream
    from prefixcache.experiments.upstream.ours import replay_ours

    threads: list[int] = []
    monkeypatch.setattr(torch, "set_num_threads", threads.append)
    monkeypatch.setattr(shim, "unavailable_reason", lambda: {"vllm": "not here"})
    collector_on: list[bool] = []

    def replay_sglang(scj: dict[str, Any], **options: Any) -> tuple[list[dict[str, Any]], float]:
        collector_on.append(gc.isenabled())
        assert threads == [1], "a replay ran before torch was pinned to one thread"
        return replay_ours("radix", scj, **options)[0], 1.0

    monkeypatch.setitem(sys.modules, "prefixcache.experiments.upstream.sglang_driver",
                        types.SimpleNamespace(replay_sglang=replay_sglang))
    trace = Scenario("tiny_trace_p1", 64, 1, systems=("sglang",), large=True)
    trace.whole("a", list(range(1, 13))).whole("b", list(range(1, 9)) + [50, 51])
    monkeypatch.setattr(vs_upstream, "all_scenarios", lambda: iter([trace]))
    out = tmp_path / "upstream.csv"

    assert vs_upstream.main(["--out", str(out)]) == 0
    assert threads == [1]
    assert collector_on and not any(collector_on)  # every run of every mode, best of 5
    rows = pd.read_csv(out).set_index("backend")
    assert list(rows.index) == ["radix default (trace p1)", "radix needsort (trace p1)"]
    assert (rows["ids_agree"] == rows["requests"]).all() and (rows["requests"] == 2).all()
