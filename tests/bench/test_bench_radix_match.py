"""Benchmark (run with ``make bench`` / ``pytest tests/bench``): galloping RadixKey.match
against SGLang's token-by-token Python loop (``_key_match_page_size1``) on long common prefixes."""

from __future__ import annotations

import pytest
from prefixcache.backends.radix import RadixKey
from prefixcache.experiments.bench.radix_match import SIZES, loop_match


def pair(n: int) -> tuple[list[int], list[int]]:
    """Two sequences sharing exactly n tokens, then differing."""
    a = [(7 * i + 3) % 50_000 for i in range(n)]
    return a + [1], a + [2]


@pytest.mark.parametrize("size", list(SIZES))
def test_bench_galloping_match(benchmark, size: str) -> None:  # type: ignore[no-untyped-def]
    a, b = pair(SIZES[size])
    ka, kb = RadixKey(a), RadixKey(b)
    benchmark.group = f"match {size}"
    assert benchmark(ka.match, kb) == SIZES[size]


@pytest.mark.parametrize("size", list(SIZES))
def test_bench_token_loop_match(benchmark, size: str) -> None:  # type: ignore[no-untyped-def]
    a, b = pair(SIZES[size])
    benchmark.group = f"match {size}"
    assert benchmark(loop_match, a, b) == SIZES[size]
