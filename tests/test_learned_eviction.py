"""The exploratory LRB-style replay (analysis/learned_eviction.py) is a sound cache whatever its
model predicts: unbounded it hits what an infinite cache hits, bounded it never beats Belady
(it would if its leaf bookkeeping let the cache outgrow its capacity)."""

from __future__ import annotations

import random
from types import SimpleNamespace

import numpy as np
from hypothesis import given
from hypothesis import strategies as st
from prefixcache.experiments.analysis import bounds
from prefixcache.experiments.analysis.eviction_model import ReuseOracle
from prefixcache.experiments.analysis.learned_eviction import run

from tests.test_eviction_model import random_trace


def replay(seed: int, capacity: int) -> tuple[bounds.BlockTrace, list[int], list]:
    """Under a model that predicts noise; also the sampled (request, features, labels) rows."""
    trace, prompts, outputs = random_trace(seed)
    records = [SimpleNamespace(input_length=p, output_length=o)
               for p, o in zip(prompts, outputs, strict=True)]
    noise = np.random.default_rng(seed)
    rows: list = []
    hits = run(trace, records, capacity, lambda x: noise.random(len(x)), ReuseOracle(trace).uses,
               random.Random(seed), 50, (rows, 1.0))
    return trace, hits, rows


@given(seed=st.integers(0, 10_000))
def test_unbounded_hits_what_an_infinite_cache_hits(seed: int) -> None:
    trace, hits, rows = replay(seed, 10_000)
    assert hits == bounds.infinite_cache_hits(trace)
    assert rows == []  # nothing was evicted


@given(seed=st.integers(0, 10_000), capacity=st.integers(1, 30))
def test_bounded_never_beats_belady(seed: int, capacity: int) -> None:
    trace, hits, rows = replay(seed, capacity)
    assert sum(hits) <= sum(bounds.belady_hits(trace, capacity))
    if sum(map(len, trace.inserts)) > capacity + 10:  # surely evicted: every round sampled (share 1)
        assert rows
