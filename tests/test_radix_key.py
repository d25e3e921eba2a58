"""REFERENCE B1: RadixKey slicing, page alignment, galloping match, child keys."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from prefixcache.backends.radix import RadixKey
from prefixcache.backends.radix import key as key_module


def test_slicing_returns_a_radixkey_in_the_same_namespace() -> None:
    key = RadixKey([1, 2, 3, 4], extra_key="ns")
    part = key[1:3]
    assert isinstance(part, RadixKey) and part.tolist() == [2, 3] and part.extra_key == "ns"
    assert key[-1].tolist() == [4] and key[-1].extra_key == "ns"
    assert key[0].tolist() == [1]


def test_token_ids_are_a_compact_int64_array() -> None:
    key = RadixKey([5, 6, 7])
    assert isinstance(key.token_ids, np.ndarray) and key.token_ids.dtype == np.int64


@pytest.mark.parametrize("idx", [4, -5, 100])
def test_int_index_out_of_range_raises_indexerror(idx: int) -> None:
    with pytest.raises(IndexError):
        RadixKey([1, 2, 3, 4])[idx]


@pytest.mark.parametrize("step", [2, -1, 0])
def test_slice_step_other_than_one_raises_valueerror(step: int) -> None:
    with pytest.raises(ValueError, match="step"):
        RadixKey([1, 2, 3, 4])[::step]


@pytest.mark.parametrize("page, expected", [(1, 10), (2, 10), (4, 8), (3, 9), (16, 0)])
def test_page_aligned_truncates_to_whole_pages(page: int, expected: int) -> None:
    key = RadixKey(list(range(10)), extra_key="x").page_aligned(page)
    assert key.tolist() == list(range(expected)) and key.extra_key == "x"


@given(
    st.lists(st.integers(0, 3), max_size=40),
    st.lists(st.integers(0, 3), max_size=40),
    st.lists(st.integers(0, 3), max_size=40),
    st.sampled_from([1, 2, 4]),
)
def test_galloping_match_equals_the_token_by_token_prefix_rounded_to_pages(
    common: list[int], a: list[int], b: list[int], page: int
) -> None:
    x, y = common + a, common + b
    n = 0
    while n < min(len(x), len(y)) and x[n] == y[n]:
        n += 1
    assert RadixKey(x).match(RadixKey(y), page) == n // page * page
    assert RadixKey(y).match(RadixKey(x), page) == n // page * page


@pytest.mark.parametrize("page, expected", [(1, 5), (2, 4), (4, 4), (8, 0)])
def test_match_rounds_down_to_page_size(page: int, expected: int) -> None:
    a = RadixKey([0, 1, 2, 3, 4, 5, 6, 7])
    b = RadixKey([0, 1, 2, 3, 4, 9, 6, 7])
    assert a.match(b, page) == expected


def test_match_across_namespaces_raises_valueerror() -> None:
    with pytest.raises(ValueError, match="namespace"):
        RadixKey([1, 2], extra_key="a").match(RadixKey([1, 2], extra_key="b"))
    with pytest.raises(ValueError, match="namespace"):
        RadixKey([1, 2]).match(RadixKey([1, 2], extra_key="b"))


@pytest.mark.parametrize("n", [1, 2, 4095, 4096, 4097, 1 << 16])
@pytest.mark.parametrize("where", ["first", "second", "middle", "last", "none", "shorter"])
def test_common_prefix_length_is_exact_on_both_sides_of_the_bytes_threshold(n: int, where: str) -> None:
    """Up to 4096 tokens a byte compare settles equal runs; past it (or on a difference) one
    elementwise compare: both must find the first difference exactly."""
    a = np.arange(n, dtype=np.int64)
    b = a.copy()
    at = {"first": 0, "second": 1, "middle": n // 2, "last": n - 1}.get(where)
    if at is not None and at < n:
        b[at] = -1
    if where == "shorter":
        b = b[: n // 2]
    expected = at if at is not None and at < n else len(b)
    assert key_module.common_prefix_length(a, b) == expected
    assert key_module.common_prefix_length(b, a) == expected
    assert RadixKey(a).match(RadixKey(b)) == expected
    assert RadixKey(a).match(RadixKey(b), page_size=16) == expected // 16 * 16


@given(st.lists(st.integers(0, 3), max_size=40), st.lists(st.integers(0, 3), max_size=40))
def test_common_prefix_length_equals_a_token_loop(x: list[int], y: list[int]) -> None:
    expected = next((i for i, (p, q) in enumerate(zip(x, y, strict=False)) if p != q), min(len(x), len(y)))
    a, b = np.array(x, dtype=np.int64), np.array(y, dtype=np.int64)
    assert key_module.common_prefix_length(a, b) == expected


def test_child_key_is_first_token_or_first_page_wrapped_in_namespace() -> None:
    key = RadixKey([7, 8, 9, 10])
    assert key.child_key(1) == 7
    assert key.child_key(2) == (7, 8)
    assert key.child_key(4) == (7, 8, 9, 10)
    ns = RadixKey([7, 8, 9, 10], extra_key="lora-a")
    assert ns.child_key(1) == ("lora-a", 7)
    assert ns.child_key(2) == ("lora-a", (7, 8))
    assert ns.child_key(1) != RadixKey([7], extra_key="lora-b").child_key(1) != key.child_key(1)
