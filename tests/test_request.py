"""Request: deferred prompts and the typed planned output."""

from __future__ import annotations

import numpy as np
import pytest
from prefixcache.experiments.inputs.traces import TraceRecord, iter_requests

from prefixcache import CacheConfig, Engine, Request, make_cache


def test_a_deferred_prompt_is_built_on_first_use_and_checked_against_its_length() -> None:
    built: list[int] = []

    def make() -> list[int]:
        built.append(1)
        return [5, 6, 7]

    req = Request.deferred("d", 3, make, max_new_tokens=2)
    assert (req.num_tokens, req.num_prompt_tokens, req.num_output_tokens) == (3, 3, 0)
    assert not built, "the length alone must not build the prompt"
    assert list(req.all_token_ids) == [5, 6, 7] and req.prompt_token_ids == (5, 6, 7)
    assert built == [1]
    req.append_output_token_ids(9)
    assert req.num_tokens == 4 and list(req.output_token_ids) == [9] and built == [1]
    wrong = Request.deferred("w", 4, make)
    with pytest.raises(ValueError, match="deferred prompt has 3 tokens, 4 were announced"):
        list(wrong.all_token_ids)
    with pytest.raises(ValueError, match="empty prompt"):
        Request.deferred("e", 0, make)
    with pytest.raises(ValueError, match="does not fit"):
        Request.deferred("m", 3, make, mm_hashes=[("img", 2, 5)])


def test_trace_requests_hold_no_tokens_until_a_cache_reads_them() -> None:
    records = [TraceRecord(float(i), 600, 2, (0, 1)) for i in range(3)]
    reqs = list(iter_requests(records))
    assert all(r._all_token_ids is None for r in reqs)  # waiting: no token memory
    engine = Engine(make_cache("hashchain", CacheConfig(4096, 16)), "fcfs", check_invariants=True)
    engine.run(reqs)
    assert [r.output_tokens for r in engine.records.values()] == [2, 2, 2]
    assert reqs[1].prompt_token_ids == reqs[0].prompt_token_ids  # same hash ids, same tokens
    assert engine.records["trace-1"].hit_tokens == 592  # (600 - 1) // 16 * 16


def test_planned_output_is_a_typed_checked_field() -> None:
    assert Request("p", [1, 2], planned_output_ids=[3, 4]).planned_output_ids == (3, 4)
    assert Request("q", [1, 2]).planned_output_ids is None
    with pytest.raises(ValueError, match="planned_output_ids"):
        Request("r", [1, 2], planned_output_ids=[-1])


def test_a_deferred_array_prompt_keeps_its_array(monkeypatch: pytest.MonkeyPatch) -> None:
    """A trace's deferred prompt arrives as an int64 array: ``prompt_array`` read first keeps
    that array, and does not convert the token list back (4.7 s of a whole-trace radix run)."""
    import types

    from prefixcache import request as request_module

    rebuilt: list[object] = []
    counting = types.SimpleNamespace(**{k: getattr(np, k) for k in dir(np) if not k.startswith("__")})
    counting.array = lambda *a, **k: rebuilt.append(a) or np.array(*a, **k)
    monkeypatch.setattr(request_module, "np", counting)
    req = Request.deferred("r", 5, lambda: np.arange(10, 15, dtype=np.int64))
    assert req.prompt_array.tolist() == [10, 11, 12, 13, 14] == list(req.all_token_ids)
    assert rebuilt == []


@pytest.mark.parametrize("as_array", [True, False])
def test_output_appended_before_the_token_list_is_built_joins_it_in_order(as_array: bool) -> None:
    """A decode step appends output without building the prompt's token list (a run that
    reads no tokens never builds one); the list, once built, is the prompt then every output
    token in order, and the counts agree before and after."""

    prompt = [5, 6, 7]
    req = Request.deferred("d", 3, lambda: np.array(prompt, dtype=np.int64) if as_array else list(prompt))
    req.append_output_token_ids(9)
    req.append_output_token_ids([10, 11])
    assert req._all_token_ids is None, "appending output must not build the token list"
    assert (req.num_tokens, req.num_output_tokens, list(req.output_token_ids)) == (6, 3, [9, 10, 11])
    if as_array:
        assert req.prompt_array.tolist() == prompt and req._all_token_ids is None  # the array alone
    assert list(req.all_token_ids) == [5, 6, 7, 9, 10, 11]
    req.append_output_token_ids(12)
    assert (req.num_tokens, list(req.output_token_ids)) == (7, [9, 10, 11, 12])
    with pytest.raises(ValueError, match="negative"):
        _ = Request.deferred("n", 2, lambda: np.array([1, -3], dtype=np.int64)).prompt_array


def test_a_trace_run_without_a_cache_that_reads_tokens_builds_no_token_list() -> None:
    records = [TraceRecord(float(i), 600, 3, (0, 1)) for i in range(3)]
    reqs = list(iter_requests(records))
    engine = Engine(make_cache("none", CacheConfig(4096, 16)), "fcfs", check_invariants=True)
    engine.run(reqs)
    assert [r.output_tokens for r in engine.records.values()] == [3, 3, 3]
    assert all(r._all_token_ids is None and r.num_output_tokens == 3 for r in reqs)


@pytest.mark.parametrize("as_array", [True, False])
def test_token_ids_reads_any_range_without_building_the_token_list_of_an_array_prompt(as_array: bool) -> None:
    """``token_ids(start, end)`` equals ``list(all_token_ids[start:end])`` for every range
    (inside the prompt, across its end, in the output, past the end, empty), before and
    after the list is built; an array prompt stays an array alone while only ranges are read."""

    prompt = [5, 6, 7, 8]
    built = []
    req = Request.deferred(
        "d", 4, lambda: built.append(1) or (np.array(prompt, dtype=np.int64) if as_array else list(prompt))
    )
    req.append_output_token_ids([9, 10, 11])
    full = prompt + [9, 10, 11]
    assert [req.token_ids(s, e) for s, e in [(4, 6), (5, 9), (2, 2), (7, 3)]] == [[9, 10], [10, 11], [], []]
    assert not built, "a range past the prompt built the deferred prompt"
    ranges = [(s, e) for s in range(9) for e in range(9)]
    assert [req.token_ids(s, e) for s, e in ranges] == [full[s:e] for s, e in ranges]
    assert all(type(t) is int for t in req.token_ids(0, 9))
    assert (req._all_token_ids is None) == as_array, "a range read built the token list"
    assert list(req.all_token_ids) == full
    req.append_output_token_ids(12)
    full.append(12)
    assert [req.token_ids(s, e) for s, e in ranges] == [full[s:e] for s, e in ranges]


def test_known_output_appends_as_the_checked_append_does_before_and_after_the_list_is_built() -> None:
    """``append_known_output`` (the engine's catch-up of deferred steps) leaves a request as
    ``append_output_token_ids`` would: tokens, counts and ranges, whether or not its token
    list was built yet."""
    for build_first in (False, True):
        checked = Request.deferred("c", 3, lambda: [1, 2, 3])
        known = Request.deferred("k", 3, lambda: [1, 2, 3])
        for req in (checked, known):
            req.append_output_token_ids(4)
            if build_first:
                assert list(req.all_token_ids) == [1, 2, 3, 4]
        checked.append_output_token_ids([5, 6])
        known.append_known_output([5, 6])
        assert known.num_output_tokens == checked.num_output_tokens == 3
        assert known.num_tokens == checked.num_tokens == 6
        assert known.token_ids(2, 6) == checked.token_ids(2, 6) == [3, 4, 5, 6]
        assert list(known.all_token_ids) == list(checked.all_token_ids) == [1, 2, 3, 4, 5, 6]


def test_a_deferred_prompt_with_a_range_maker_is_read_by_range_and_checked() -> None:
    """``Request.deferred(..., make_range)``: a range of the prompt comes from the range maker
    (the prompt stays unbuilt), checked as a prompt is; building it later changes no range."""
    prompt = list(range(10, 20))
    req = Request.deferred("r", 10, lambda: list(prompt), lambda s, e: prompt[s:e])
    req.append_output_token_ids([1, 2])
    assert req.token_ids(8, 12) == [18, 19, 1, 2] and req.token_ids(0, 3) == [10, 11, 12]
    assert req._make_prompt is not None, "a range read built the prompt"
    assert list(req.all_token_ids) == prompt + [1, 2] and req.token_ids(8, 12) == [18, 19, 1, 2]
    bad = Request.deferred("b", 3, lambda: [1, 2, 3], lambda s, e: [-1] * (e - s))
    with pytest.raises(ValueError):
        bad.token_ids(0, 2)


@pytest.mark.parametrize("length", [1, 4095, 4096, 4097, 2 * 4096 + 5])
@pytest.mark.parametrize("outputs", [0, 3])
def test_a_list_prompt_array_holds_the_prompt_ids_around_the_pack_chunks(length: int, outputs: int) -> None:
    """``prompt_array`` of a list prompt (made in chunks of 4096 ids): every prompt id, at both
    ends of each chunk, none of the output after it, read-only."""
    prompt = [(7919 * i + 2**62 * (i % 2)) % 2**63 for i in range(length)]  # up to int64's top
    req = Request("r", prompt)
    req.append_output_token_ids(list(range(outputs)))
    arr = req.prompt_array
    assert arr.dtype == np.int64 and arr.tolist() == prompt
    assert not arr.flags.writeable


def test_a_prompt_id_past_int64_has_no_array_and_says_so() -> None:
    req = Request("big", [1, 2**63])
    assert req.all_token_ids == [1, 2**63]  # a valid id to the request itself
    with pytest.raises(ValueError, match="past int64"):
        _ = req.prompt_array
