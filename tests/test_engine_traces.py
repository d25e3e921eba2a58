"""The engine-trace study (issue 30, item 1): its conversation bootstrap, its queue series, the
claim that LPM without SGLang's fallback is LPM while the queue stays short, and its tiny scale
end to end (figure and macros included)."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from prefixcache.experiments.figures import fig_engine_traces, study_engine_traces
from prefixcache.experiments.figures.common import make_requests
from prefixcache.experiments.figures.study_engine_traces import (
    bootstrap_by_conversation,
    conversations,
    queue_over_time,
)

from prefixcache import CacheConfig, Engine, make_cache
from prefixcache.cost_model import named_clock
from prefixcache.scheduler import LPM_FALLBACK_QUEUE_LEN


def _table(hits: list[int], prompts: list[int], ttfts: list[float]) -> pd.DataFrame:
    return pd.DataFrame({"hit_tokens": hits, "prompt_tokens": prompts, "ttft_s": ttfts})


def test_one_conversation_leaves_nothing_to_resample() -> None:
    df = _table([10, 0, 30], [100, 100, 100], [0.1, 0.2, 0.3])
    got = bootstrap_by_conversation(df, np.zeros(3, dtype=np.int64))
    assert got["token_hit_rate"] == got["token_hit_rate_lo"] == got["token_hit_rate_hi"]
    assert got["token_hit_rate"] == pytest.approx(40 / 300)
    assert got["ttft_p50_lo"] == got["ttft_p50_hi"] == 0.2


def test_the_bootstrap_resamples_whole_conversations() -> None:
    """Requests of a conversation hit together: resampling them as one unit spreads the hit
    rate wider than resampling requests one by one would, and the intervals hold the point."""
    n = 200
    group = np.repeat(np.arange(n // 4), 4)  # 50 conversations of 4 requests
    hits = np.where(group % 2 == 0, 100, 0)  # a conversation hits whole or not at all
    df = _table(hits.tolist(), [100] * n, np.linspace(0.1, 2.0, n).tolist())
    by_conversation = bootstrap_by_conversation(df, group)
    by_request = bootstrap_by_conversation(df, np.arange(n))
    width = by_conversation["token_hit_rate_hi"] - by_conversation["token_hit_rate_lo"]
    assert width > 1.5 * (by_request["token_hit_rate_hi"] - by_request["token_hit_rate_lo"])
    for q in ("token_hit_rate", "ttft_p50", "ttft_p90", "ttft_p99"):
        point = by_conversation[q if q == "token_hit_rate" else f"{q}_s"]
        assert by_conversation[f"{q}_lo"] <= point <= by_conversation[f"{q}_hi"]
    assert bootstrap_by_conversation(df, group) == by_conversation  # seeded: the same every run


def test_the_queue_by_hand() -> None:
    """Arrivals at 0, 1, 2; admissions at 0, 3, 3: nobody waits on [0, 1), one on [1, 2), two on
    [2, 3); a time average of 1 over the 3 seconds."""
    df = pd.DataFrame({"arrival_time": [0.0, 1.0, 2.0], "admission_time": [0.0, 3.0, 3.0]})
    times, waiting, mean = queue_over_time(df)
    assert mean == pytest.approx(1.0)
    at = {round(float(t), 6): int(w) for t, w in zip(times, waiting, strict=True)}
    assert at[0.0] == 0 and at[3.0] == 0
    assert all(w == (1 if 1 <= t < 2 else 2 if 2 <= t < 3 else 0) for t, w in at.items())


@pytest.mark.parametrize(("source", "depth"), [("mooncake-synthetic", 1), ("mooncake-conversation", 2)])
def test_conversations_group_requests_below_the_blocks_all_share(source: str, depth: int) -> None:
    """The synthetic trace's prompts share no common first block: a conversation is a first
    block. Every conversation-trace prompt opens with one common block: a conversation is the
    first two."""
    from prefixcache.experiments.figures.common import MOONCAKE_TRACES
    from prefixcache.experiments.inputs.traces import read_mooncake

    group = conversations(source, 150)
    records = read_mooncake(MOONCAKE_TRACES[source])[:150]
    assert 1 < len(set(group.tolist())) < 150
    for i in range(150):
        for j in range(i):
            same = records[i].hash_ids[:depth] == records[j].hash_ids[:depth]
            assert (group[i] == group[j]) == same


def _serve(scheduler: str, arrival_scale: float) -> tuple[Engine, list[object]]:
    config = {"source": "mooncake-synthetic", "limit": 150, "arrival_scale": arrival_scale}
    reqs = make_requests(config)
    engine = Engine(make_cache("radix", CacheConfig(1 << 20, 16)), scheduler, 2048,
                    cost_model=named_clock("h100-llama3-8b"))
    records = engine.run(reqs)
    return engine, [[getattr(r, f.name) for f in fields(r) if f.name != "cache_op_ns"] for r in records]


def test_lpm_without_the_fallback_is_lpm_while_the_queue_stays_short() -> None:
    """What lets the study reuse LPM's cells for LPM without the fallback: a run whose queue
    never passed 128 makes the same decisions either way. And where it does pass 128 (every
    request at once), the two differ, so the check is not vacuous."""
    from prefixcache.experiments.figures.common import trace_arrival_scale

    scale = trace_arrival_scale("mooncake-synthetic", 150, named_clock("h100-llama3-8b"), 0.8)
    lpm, lpm_rows = _serve("lpm", scale)
    _, no_fallback_rows = _serve("lpm-no-fallback", scale)
    assert lpm.peak_waiting <= LPM_FALLBACK_QUEUE_LEN and lpm_rows == no_fallback_rows
    crowded, crowded_rows = _serve("lpm", 0.0)  # all 150 at t = 0
    _, crowded_no_fallback = _serve("lpm-no-fallback", 0.0)
    assert crowded.peak_waiting > LPM_FALLBACK_QUEUE_LEN and crowded_rows != crowded_no_fallback


def test_the_tiny_scale_end_to_end(tmp_path: Path) -> None:
    """Cells, the tidy table (lpm-no-fallback rows only where lpm's queue stayed short), the
    figure and the macros; then a full grid that disagrees with the default cells is refused."""
    results, paper = tmp_path / "results", tmp_path / "paper"
    folder = study_engine_traces.run(results, "tiny", jobs=1)
    table = pd.read_csv(folder / "summary.csv")
    assert len(table[table["scheduler"] != "lpm-no-fallback"]) == len(study_engine_traces.configs("tiny"))
    lpm = table[table["scheduler"] == "lpm"]
    short = (lpm["peak_waiting"] <= LPM_FALLBACK_QUEUE_LEN).sum()
    assert (table["scheduler"] == "lpm-no-fallback").sum() == short
    assert (table["token_hit_rate_lo"] <= table["token_hit_rate"]).all()
    assert set(pd.read_csv(folder / "queue.csv")["load"]) == set(table["load"])
    made = fig_engine_traces.make(results, paper)
    assert {p.name for p in made} == {"engine_traces.pdf", "engine_traces.tex", "engine_traces_values.tex"}
    assert "\\newcommand{\\etSynRadixHit}" in (paper / "generated" / "engine_traces_values.tex").read_text()
    full = results / study_engine_traces.FULL
    full.mkdir()
    (folder / "queue.csv").rename(full / "queue.csv")
    stale = table.assign(hit_tokens=table["hit_tokens"] + 1)
    stale.to_csv(full / "summary.csv", index=False)
    with pytest.raises(ValueError, match="stale"):
        fig_engine_traces.make(results, paper)
