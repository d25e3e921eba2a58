"""Benchmark (run with ``make bench`` / ``pytest tests/bench``): how a text router sees a
12k-token prompt (a Mooncake conversation turn). Spelling it through ``SpellingTable`` (numpy
gathers) against the join of a spelling per token it replaced, and walking a char-tree edge
with ``common_prefix_length`` against ``os.path.commonprefix`` over a copy of the text's tail
(a Python step per character), for an edge matched whole and one that differs halfway."""

from __future__ import annotations

import os

import numpy as np
import pytest

from prefixcache.cluster.routers.char_tree import common_prefix_length
from prefixcache.cluster.text import TokenText

PROMPT = np.random.default_rng(0).integers(0, 32_000, size=12_000, dtype=np.int64)
TEXT = TokenText(seed=0)
SPELLED = TEXT.text(PROMPT)


def test_bench_spelling_table(benchmark) -> None:  # type: ignore[no-untyped-def]
    benchmark.group = "spell a 12k-token prompt"
    assert benchmark(TEXT.text, PROMPT) == SPELLED


def test_bench_spelling_join(benchmark) -> None:  # type: ignore[no-untyped-def]
    benchmark.group = "spell a 12k-token prompt"
    table = [TEXT.spell(t) for t in range(1 << 16)]
    tokens = PROMPT.tolist()
    assert benchmark(lambda: "".join(map(table.__getitem__, tokens))) == SPELLED


EDGES = {"whole": SPELLED[1000:], "differs": SPELLED[1000:25_000] + "#" + SPELLED[25_001:]}


@pytest.mark.parametrize("edge", list(EDGES))
def test_bench_common_prefix_length(benchmark, edge: str) -> None:  # type: ignore[no-untyped-def]
    benchmark.group = f"char-tree edge, {edge}"
    expected = len(os.path.commonprefix([EDGES[edge], SPELLED[1000:]]))
    assert benchmark(common_prefix_length, EDGES[edge], SPELLED, 1000) == expected


@pytest.mark.parametrize("edge", list(EDGES))
def test_bench_commonprefix_of_the_tail(benchmark, edge: str) -> None:  # type: ignore[no-untyped-def]
    benchmark.group = f"char-tree edge, {edge}"
    expected = len(os.path.commonprefix([EDGES[edge], SPELLED[1000:]]))
    assert benchmark(lambda: len(os.path.commonprefix([EDGES[edge], SPELLED[1000:]]))) == expected
