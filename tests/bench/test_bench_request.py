"""Benchmark (``make bench`` / ``pytest tests/bench``) of a list prompt's int64 array, which a
radix lookup reads (``Request.prompt_array``): ``_int64_array`` (``struct`` packing in chunks)
against ``np.fromiter``, the form it replaced, on a 14,000-token prompt (the mean of the 200
Mooncake requests ``vs_upstream`` replays)."""

from __future__ import annotations

import numpy as np
import pytest

from prefixcache.request import _int64_array

PROMPT = [(7919 * i + 13) % 128_256 for i in range(14_000)]


@pytest.mark.parametrize("form", ["_int64_array", "np.fromiter"])
def test_bench_prompt_array(benchmark, form: str) -> None:  # type: ignore[no-untyped-def]
    if form == "_int64_array":
        convert = _int64_array
    else:
        def convert(tokens: list[int]) -> np.ndarray:
            return np.fromiter(tokens, dtype=np.int64, count=len(tokens))
    benchmark.group = "a 14,000-token list prompt as an int64 array"
    assert benchmark(convert, PROMPT).tolist() == PROMPT
