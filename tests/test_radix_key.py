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


@pytest.mark.parametrize("diverge_at", [0, 1, 2, 3, 1000, 65_535, 65_536, None])
def test_match_gallops_with_logarithmically_many_slice_compares(monkeypatch, diverge_at: int | None) -> None:
    n = 1 << 16
    a = np.arange(n, dtype=np.int64)
    b = a.copy()
    if diverge_at is not None and diverge_at < n:
        b[diverge_at] = -1
    calls = 0
    real = key_module._same

    def counting(x, y):  # type: ignore[no-untyped-def]
        nonlocal calls
        calls += 1
        return real(x, y)

    monkeypatch.setattr(key_module, "_same", counting)
    got = RadixKey(a).match(RadixKey(b))
    assert got == (n if diverge_at is None or diverge_at >= n else diverge_at)
    assert calls <= 2 * 17 + 2, f"{calls} slice compares for {n} tokens: not galloping"


def test_child_key_is_first_token_or_first_page_wrapped_in_namespace() -> None:
    key = RadixKey([7, 8, 9, 10])
    assert key.child_key(1) == 7
    assert key.child_key(2) == (7, 8)
    assert key.child_key(4) == (7, 8, 9, 10)
    ns = RadixKey([7, 8, 9, 10], extra_key="lora-a")
    assert ns.child_key(1) == ("lora-a", 7)
    assert ns.child_key(2) == ("lora-a", (7, 8))
    assert ns.child_key(1) != RadixKey([7], extra_key="lora-b").child_key(1) != key.child_key(1)
