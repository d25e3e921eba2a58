"""Benchmark (run with ``make bench`` / ``pytest tests/bench``): RadixKey.match (one vectorised
compare) against the galloping search it replaced and SGLang's token-by-token Python loop
(``_key_match_page_size1``), on edges matched whole and edges that differ inside."""

from __future__ import annotations

import pytest
from prefixcache.backends.radix import RadixKey
from prefixcache.experiments.bench.radix_match import SIZES, galloping_match, loop_match, pair

CASES = [(size, differ) for size in SIZES for differ in (False, True)]
IDS = [f"{size}-{'differs' if differ else 'whole'}" for size, differ in CASES]


@pytest.mark.parametrize(("size", "differ"), CASES, ids=IDS)
def test_bench_vectorised_match(benchmark, size: str, differ: bool) -> None:  # type: ignore[no-untyped-def]
    ka, kb = (RadixKey(x) for x in pair(SIZES[size], differ))
    benchmark.group = f"match {size} {'differs' if differ else 'whole'}"
    assert benchmark(ka.match, kb) == SIZES[size]


@pytest.mark.parametrize(("size", "differ"), CASES, ids=IDS)
def test_bench_galloping_match(benchmark, size: str, differ: bool) -> None:  # type: ignore[no-untyped-def]
    ka, kb = (RadixKey(x) for x in pair(SIZES[size], differ))
    benchmark.group = f"match {size} {'differs' if differ else 'whole'}"
    assert benchmark(galloping_match, ka.token_ids, kb.token_ids) == SIZES[size]


@pytest.mark.parametrize(("size", "differ"), CASES, ids=IDS)
def test_bench_token_loop_match(benchmark, size: str, differ: bool) -> None:  # type: ignore[no-untyped-def]
    a, b = pair(SIZES[size], differ)
    benchmark.group = f"match {size} {'differs' if differ else 'whole'}"
    assert benchmark(loop_match, a, b) == SIZES[size]
