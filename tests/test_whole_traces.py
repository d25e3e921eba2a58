"""The whole-trace study: the two block conventions by hand, and hit_rates.csv against
recomputations by other algorithms (Mattson's one-pass LRU curve, Mooncake's block count)."""

from __future__ import annotations

import math

import pandas as pd
import pytest
from prefixcache.experiments.analysis import bounds
from prefixcache.experiments.analysis.metrics import block_id_hit_rates, block_id_trace
from prefixcache.experiments.inputs.traces import (
    TraceRecord,
    data_dir,
    infinite_cache_block_hit_rate,
    read_mooncake,
)

# ids chain: equal id = equal prefix. 1300 tokens = two full 512-token blocks and a partial one.
RECORDS = [
    TraceRecord(0, 1300, 1, (1, 2, 3)),
    TraceRecord(1, 1300, 1, (1, 2, 3)),
    TraceRecord(2, 1024, 1, (1, 2)),
]


def test_c1_takes_every_id_and_counts_a_partial_block_hit_by_its_tokens() -> None:
    hits = bounds.infinite_cache_hits(block_id_trace(RECORDS, "C1"))
    assert hits == [0, 3 * 512, 2 * 512]
    token_rate, block_rate = block_id_hit_rates(RECORDS, hits)
    assert token_rate == pytest.approx((1300 + 1024) / (1300 + 1300 + 1024))
    assert block_rate == pytest.approx(5 / 8)
    assert block_rate == pytest.approx(infinite_cache_block_hit_rate(RECORDS))


def test_c2_caps_at_n_minus_1_and_caches_full_blocks_only() -> None:
    hits = bounds.infinite_cache_hits(block_id_trace(RECORDS, "C2"))
    # second: full blocks of its first 1299 tokens (2); third: of its first 1023 tokens (1)
    assert hits == [0, 2 * 512, 1 * 512]
    token_rate, block_rate = block_id_hit_rates(RECORDS, hits)
    assert token_rate == pytest.approx(1536 / 3624) and block_rate == pytest.approx(3 / 8)
    with pytest.raises(ValueError, match="valid: C1, C2"):
        block_id_trace(RECORDS, "C3")


@pytest.fixture(scope="module")
def tiny_hit_rates(tmp_path_factory: pytest.TempPathFactory) -> pd.DataFrame:
    try:
        data_dir()
    except FileNotFoundError as e:
        pytest.skip(f"trace data not available: {e}")
    from prefixcache.experiments.figures import study_whole_traces

    out = tmp_path_factory.mktemp("results")
    study_whole_traces.run(out, "tiny", jobs=1)
    return pd.read_csv(out / "whole_traces" / "hit_rates.csv")


def test_hit_rates_csv_has_every_row_kind_with_rates_in_range(tiny_hit_rates: pd.DataFrame) -> None:
    df = tiny_hit_rates
    from prefixcache.experiments.figures.study_whole_traces import COLUMNS, MODEL_POLICIES

    assert COLUMNS == ["trace", "capacity_tokens", "backend", "page_size", "policy", "convention",
                       "token_hit_rate", "block_hit_rate", "requests", "rejected"]
    assert list(df.columns) == COLUMNS
    assert set(df["trace"]) == {"conversation", "synthetic"}
    assert set(df["backend"]) == {"block-model", "hashchain", "radix"}
    model = df[df["backend"] == "block-model"]
    assert set(model["policy"]) == {"lru", "belady", "infinite", *MODEL_POLICIES}
    assert set(model["convention"]) == {"C1", "C2"}
    assert set(model[model["policy"].isin(MODEL_POLICIES)]["convention"]) == {"C2"}
    radix_policies = {"lru", "lfu", "slru", "fifo", "priority", "gdsf", "lrp"}
    assert set(df[df["backend"] == "radix"]["policy"]) == radix_policies
    assert set(df[df["backend"] == "hashchain"]["policy"]) == {"lru", "lrp", "gdsf"}
    assert set(df[df["backend"] != "block-model"]["convention"]) == {"C2"}
    assert df["token_hit_rate"].between(0, 1).all() and df["block_hit_rate"].between(0, 1).all()
    assert math.isinf(model[model["policy"] == "infinite"]["capacity_tokens"].iloc[0])
    for (_, _, _), g in model.groupby(["trace", "convention", "capacity_tokens"]):
        if "belady" in set(g["policy"]):  # at one capacity: no policy above the optimum
            opt = float(g[g["policy"] == "belady"]["token_hit_rate"].iloc[0])
            assert (g["token_hit_rate"] <= opt + 1e-12).all()


def test_block_model_rows_agree_with_independent_recomputations(tiny_hit_rates: pd.DataFrame) -> None:
    from prefixcache.experiments.figures.common import MOONCAKE_TRACES
    from prefixcache.experiments.figures.study_whole_traces import SCALE, TRACES

    df = tiny_hit_rates[tiny_hit_rates["backend"] == "block-model"]
    limit, caps = SCALE["tiny"]["limit"], SCALE["tiny"]["capacities"]
    for trace, source in TRACES.items():
        records = read_mooncake(MOONCAKE_TRACES[source])[:limit]
        rows = df[(df["trace"] == trace) & (df["convention"] == "C2")]
        # LRU by stack distances (one pass), against the CSV's direct replays
        curve = bounds.lru_hit_curve(block_id_trace(records, "C2"), [c // 512 for c in caps])
        prompt = sum(r.input_length for r in records)
        for cap, hits in zip(caps, curve, strict=True):
            row = rows[(rows["policy"] == "lru") & (rows["capacity_tokens"] == cap)]
            assert float(row["token_hit_rate"].iloc[0]) == pytest.approx(hits / prompt)
        c1 = df[(df["trace"] == trace) & (df["convention"] == "C1") & (df["policy"] == "infinite")]
        assert float(c1["block_hit_rate"].iloc[0]) == pytest.approx(infinite_cache_block_hit_rate(records))


def test_whole_trace_table_reads_the_committed_full_result_or_says_it_is_absent(
    tiny_hit_rates: pd.DataFrame, tmp_path
) -> None:
    from prefixcache.experiments.figures import tab_whole_traces

    tab_whole_traces.make(tmp_path / "none", tmp_path / "paper")
    generated = tmp_path / "paper" / "generated"
    assert "make whole-traces-full" in (generated / "whole_traces.tex").read_text()
    assert "\\newcommand{\\wtConvRadixLfu}{--}" in (generated / "whole_traces_values.tex").read_text()

    (tmp_path / "r" / "whole_traces_full").mkdir(parents=True)
    tiny_hit_rates.to_csv(tmp_path / "r" / "whole_traces_full" / "hit_rates.csv", index=False)
    tab_whole_traces.make(tmp_path / "r", tmp_path / "paper")
    table = (generated / "whole_traces.tex").read_text()
    assert "\\label{tab:whole-traces}" in table and "radix, $B=16$ & SLRU" in table
    conv = tiny_hit_rates[(tiny_hit_rates["trace"] == "conversation") & (tiny_hit_rates["backend"] == "radix")
                          & (tiny_hit_rates["page_size"] == 16) & (tiny_hit_rates["policy"] == "lfu")
                          & (tiny_hit_rates["capacity_tokens"] == 3_000_000)]
    expected = f"{float(conv['token_hit_rate'].iloc[0]) * 100:.1f}"
    values = (generated / "whole_traces_values.tex").read_text()
    assert f"\\newcommand{{\\wtConvRadixLfu}}{{{expected}}}" in values


def test_rates_are_looked_up_by_row_and_a_missing_row_is_named(tiny_hit_rates: pd.DataFrame) -> None:
    from prefixcache.experiments.figures.study_whole_traces import find_rate, hit_rate

    df = tiny_hit_rates
    row = df[(df["trace"] == "conversation") & (df["backend"] == "radix") & (df["page_size"] == 16)
             & (df["policy"] == "lfu") & (df["capacity_tokens"] == 3_000_000)]
    assert find_rate(df, "conversation", "lfu", 3_000_000, backend="radix", page_size=16) == float(
        row["token_hit_rate"].iloc[0])
    inf = df[(df["backend"] == "block-model") & (df["policy"] == "infinite") & (df["convention"] == "C1")
             & (df["trace"] == "synthetic")]
    assert hit_rate(df, "synthetic", "infinite", math.inf, convention="C1", column="block_hit_rate") == float(
        inf["block_hit_rate"].iloc[0])
    assert find_rate(df, "conversation", "lfu", 7, backend="radix", page_size=16) is None
    with pytest.raises(ValueError, match="no row for conversation, lru"):
        hit_rate(df, "conversation", "lru", 123)
