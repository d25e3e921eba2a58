"""Each metric on a hand-computed example."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pandas as pd
import pytest
from hypothesis import given
from hypothesis import strategies as st
from prefixcache.experiments.analysis.metrics import (
    block_hit_rate,
    dataclass_frame,
    granularity_loss,
    records_frame,
    request_hit_rate,
    summarize,
    token_hit_rate,
)

from prefixcache.cluster.simulator import RouteRecord
from prefixcache.engine import CostModel, RequestRecord


def example() -> list[RequestRecord]:
    a = RequestRecord("a", 0.0, 40, 2, hit_tokens=0, computed_prefill_tokens=40, first_token_time=1.0)
    b = RequestRecord(
        "b",
        0.5,
        40,
        2,
        hit_tokens=32,
        computed_prefill_tokens=8,
        first_token_time=1.5,
        evicted_tokens=16,
        preemptions=1,
        cache_op_ns=3000,
    )
    c = RequestRecord("c", 0.0, 20, 2, hit_tokens=20 - 4, computed_prefill_tokens=4, first_token_time=2.0)
    gone = RequestRecord("gone", 0.0, 999, 1, rejected=True)
    return [a, b, c, gone]


def test_hit_rates_by_hand() -> None:
    recs = example()
    assert token_hit_rate(recs) == pytest.approx(48 / 100)  # the rejected request is left out
    assert request_hit_rate(recs) == pytest.approx(2 / 3)
    # page 16: blocks 3 + 3 + 2 = 8; hit blocks 0 + 2 + 1 = 3
    assert block_hit_rate(recs, 16) == pytest.approx(3 / 8)


def test_summary_by_hand() -> None:
    cost = CostModel(step_overhead_s=0.0, prefill_token_s=0.01, decode_token_s=0.0)
    s = summarize(example(), page_size=16, peak_pages_in_use=7, cost_model=cost)
    assert (s["requests"], s["rejected"], s["prompt_tokens"]) == (4, 1, 100)
    assert (s["prefill_tokens_computed"], s["prefill_tokens_saved"]) == (52, 48)
    assert (s["evicted_tokens"], s["preemptions"], s["peak_pages_in_use"]) == (16, 1, 7)
    assert s["cache_op_us_per_request"] == pytest.approx(1.0)
    assert s["ttft_mean_s"] == pytest.approx((1.0 + 1.0 + 2.0) / 3)
    assert s["isolated_ttft_mean_s"] == pytest.approx(0.01 * 52 / 3)


def test_records_frame_is_tidy_with_derived_columns() -> None:
    df = records_frame(example())
    assert len(df) == 4 and {"ttft_s", "isolated_ttft_s", "cache_op_us"} <= set(df.columns)
    assert df.loc[df.request_id == "b", "ttft_s"].item() == pytest.approx(1.0)


_maybe_int = st.none() | st.integers(-(2**62), 2**62)
_maybe_time = st.none() | st.floats(allow_nan=False)
_request_records = st.builds(
    RequestRecord, st.text(max_size=3), st.floats(allow_nan=False), st.integers(0, 10**9),
    st.integers(0, 10**6), admission_step=_maybe_int, admission_time=_maybe_time,
    hit_tokens=st.integers(0, 10**9),
    first_token_step=_maybe_int, first_token_time=_maybe_time, finish_step=_maybe_int,
    finish_time=_maybe_time, cache_op_ns=st.integers(0, 2**62), rejected=st.booleans(),
)
_route_records = st.builds(
    RouteRecord, st.text(max_size=3), st.integers(0, 8), st.floats(allow_nan=False), st.integers(0, 10**9),
    st.text(max_size=2), st.integers(0, 10**9), st.integers(0, 10**9), hit_tokens=_maybe_int,
    ttft_s=_maybe_time, rejected=st.booleans(),
)


@given(st.lists(_request_records, max_size=6) | st.lists(_route_records, max_size=6))
def test_dataclass_frame_is_the_frame_of_the_records_as_dicts(rows: list[Any]) -> None:
    """Column by column, the same frame (values, dtypes, None and NaN where they fall) as
    the one built from each record's asdict, which it replaces for speed."""
    pd.testing.assert_frame_equal(dataclass_frame(rows), pd.DataFrame([dataclasses.asdict(r) for r in rows]))


def test_granularity_loss_is_the_token_hit_modulo_the_page() -> None:
    shared = list(range(100, 121))  # 21 shared tokens
    prompts = [shared + [1, 2, 3], shared + [4, 5], list(range(30))]
    # token-level hits: 0, 21, 0; a 16-token page cache keeps 16 of the 21
    assert granularity_loss(prompts, 16) == (5, pytest.approx(5 / 3))
    assert granularity_loss(prompts, 1) == (0, 0.0)


@pytest.mark.parametrize("backend, page", [("hashchain", 16), ("radix", 1), ("radix", 16)])
def test_index_memory_grows_with_cached_entries_and_shrinks_when_evicted(backend: str, page: int) -> None:
    from prefixcache.experiments.analysis.metrics import index_memory

    from prefixcache import CacheConfig, Request, make_cache
    from tests.helpers import run_to_completion, tokens

    cache = make_cache(backend, CacheConfig(1 << 15, page))
    empty = index_memory(cache)
    assert empty["index_bytes"] > 0 and empty["index_bytes_per_cached_token"] is None
    for i in range(8):
        run_to_completion(cache, Request(f"r{i}", tokens(1024, seed=i)))
    full = index_memory(cache)
    assert full["index_bytes"] > empty["index_bytes"]
    assert full["index_bytes_per_cached_token"] == pytest.approx(
        full["index_bytes"] / (cache.usage().evictable * page)
    )
    cache.evict(1 << 15)
    assert index_memory(cache)["index_bytes"] < full["index_bytes"]


def test_grouped_ratio_ci_resamples_whole_groups() -> None:
    """A group counts once however many requests it has: 20 conversations of 10 requests give
    the interval of their 20 sums, and a constant ratio an interval of width 0."""
    from prefixcache.experiments.analysis.metrics import grouped_ratio_ci95

    rng = np.random.default_rng(1)
    # a conversation's requests alike (correlated), conversations apart
    hits = np.repeat(rng.integers(0, 50, 20), 10).astype(float)
    prompts = np.repeat(rng.integers(50, 100, 20), 10).astype(float)
    groups = np.repeat(np.arange(20) * 7, 10)  # sparse labels: only the groups present count
    sums = (np.bincount(groups // 7, hits), np.bincount(groups // 7, prompts))
    assert grouped_ratio_ci95(hits, prompts, groups) == grouped_ratio_ci95(*sums, np.arange(20))
    lo, hi = grouped_ratio_ci95(hits, prompts, groups)
    assert lo < hits.sum() / prompts.sum() < hi
    one_each = grouped_ratio_ci95(hits, prompts, np.arange(200))
    assert 2 * (one_each[1] - one_each[0]) < hi - lo  # taken as independent: far too narrow
    assert grouped_ratio_ci95(prompts / 2, prompts, groups) == (0.5, 0.5)
