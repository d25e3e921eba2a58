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
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``vs_upstream.main`` with vLLM and SGLang standing in (their replays are ours, recording
    what they run under): torch goes to one thread before any replay, every replay runs with the
    collector off, each side records once and is timed only in runs that record nothing, our
    request construction is timed against vLLM only (whose constructor hashes the prompt) and
    never against SGLang, and a page-1 trace scenario's totals land under its own label."""
    import torch
    from prefixcache.experiments.upstream import shim, vs_upstream
    from prefixcache.experiments.upstream.ours import replay_ours

    threads: list[int] = []
    monkeypatch.setattr(torch, "set_num_threads", threads.append)
    monkeypatch.setattr(shim, "unavailable_reason", lambda: {})
    collector_on: list[bool] = []
    recorded: dict[str, list[bool]] = {}

    def stand_in(backend: str) -> Any:
        def replay(scj: dict[str, Any], record: bool = True, unified: bool = False,
                   **options: Any) -> tuple[list[dict[str, Any]], float]:
            if unified:  # the unified tree's records are compared, not timed
                return replay_ours(backend, scj, **options)[0], 1.0
            collector_on.append(gc.isenabled())
            recorded.setdefault(f"{backend} upstream", []).append(record)
            assert threads == [1], "a replay ran before torch was pinned to one thread"
            return replay_ours(backend, scj, record=record, **options)[0], 1.0
        return replay

    monkeypatch.setitem(sys.modules, "prefixcache.experiments.upstream.sglang_driver",
                        types.SimpleNamespace(replay_sglang=stand_in("radix")))
    monkeypatch.setitem(sys.modules, "prefixcache.experiments.upstream.vllm_driver",
                        types.SimpleNamespace(replay_vllm=stand_in("hashchain")))
    timed: dict[str, set[bool]] = {}

    def ours(backend: str, scj: dict[str, Any], *, time_requests: bool = True, record: bool = True,
             **options: Any) -> tuple[list[dict[str, Any]], float]:
        timed.setdefault(backend, set()).add(time_requests)
        recorded.setdefault(f"{backend} ours", []).append(record)
        return replay_ours(backend, scj, time_requests=time_requests, record=record, **options)

    monkeypatch.setattr(vs_upstream, "replay_ours", ours)
    trace = Scenario("tiny_trace_p1", 64, 1, systems=("sglang",), large=True)
    trace.whole("a", list(range(1, 13))).whole("b", list(range(1, 9)) + [50, 51])
    blocks = Scenario("tiny_blocks", 64, 4, systems=("vllm",))
    blocks.whole("a", list(range(1, 13)))
    monkeypatch.setattr(vs_upstream, "all_scenarios", lambda: iter([trace, blocks]))
    out = tmp_path / "upstream.csv"

    assert vs_upstream.main(["--out", str(out)]) == 0
    assert "records what RadixCache does on 2 of 2 SGLang scenario-modes" in capsys.readouterr().out
    assert threads == [1]
    assert collector_on and not any(collector_on)  # every run of every mode, best of 5
    assert timed == {"radix": {False}, "hashchain": {True}}
    once = [True] + [False] * vs_upstream.REPEAT  # per scenario and mode: recorded, then timed
    assert recorded == {"hashchain upstream": once, "hashchain ours": once,
                        "radix upstream": once * 2, "radix ours": once * 2}
    rows = pd.read_csv(out).set_index("backend")
    assert list(rows.index) == ["hashchain", "radix default (trace p1)", "radix needsort (trace p1)"]
    assert (rows["ids_agree"] == rows["requests"]).all()
    assert rows["requests"].tolist() == [1, 2, 2]


def test_request_construction_is_timed_only_when_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    """A replay that builds one slow request and makes no cache call: its construction is in
    the time with ``time_requests`` and out of it without."""
    import time

    from prefixcache.experiments.upstream import ours

    from prefixcache.request import Request

    class SlowRequest(Request):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            time.sleep(0.05)
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(ours, "Request", SlowRequest)
    scj = {"capacity_tokens": 64, "page_size": 4, "ops": [{"op": "new", "rid": "a", "prompt": [1, 2, 3]}]}
    assert ours.replay_ours("radix", scj, time_requests=True)[1] >= 0.05
    assert ours.replay_ours("radix", scj, time_requests=False)[1] < 0.01
