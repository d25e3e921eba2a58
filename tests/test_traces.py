"""Trace readers and writers."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from prefixcache.experiments.inputs.traces import (
    MOONCAKE_BLOCK,
    TraceError,
    TraceRecord,
    block_tokens,
    data_dir,
    hash_ids_of,
    infinite_cache_block_hit_rate,
    read_azure,
    read_mooncake,
    to_requests,
    write_mooncake,
)

from prefixcache import Request, hashes_to_token_ids
from prefixcache.synthesis import output_tokens, simulated_tokens


def test_mooncake_round_trip(tmp_path) -> None:
    records = [TraceRecord(0.0, 1000, 5, (0, 1)), TraceRecord(1.5, 600, 7, (0, 2))]
    write_mooncake(tmp_path / "t.jsonl", records)
    assert read_mooncake(tmp_path / "t.jsonl") == records


def test_mooncake_blocks_expand_deterministically_and_share_equal_ids() -> None:
    a, b = to_requests([TraceRecord(0.0, 1000, 5, (0, 1)), TraceRecord(1.0, 600, 7, (0, 2))])
    assert a.num_prompt_tokens == 1000 and b.num_prompt_tokens == 600
    assert a.prompt_token_ids[:MOONCAKE_BLOCK] == b.prompt_token_ids[:MOONCAKE_BLOCK]
    assert a.prompt_token_ids[MOONCAKE_BLOCK : MOONCAKE_BLOCK + 88] != b.prompt_token_ids[MOONCAKE_BLOCK:]
    assert (a.arrival_time, a.max_new_tokens) == (0.0, 5)
    again = to_requests([TraceRecord(0.0, 1000, 5, (0, 1))])[0]
    assert again.prompt_token_ids == a.prompt_token_ids


def test_hash_ids_of_token_prompts_round_trip_through_the_expansion() -> None:
    reqs = to_requests([TraceRecord(0.0, 1100, 1, (0, 1, 2)), TraceRecord(0.0, 700, 1, (0, 3))])
    assert hash_ids_of([r.prompt_token_ids for r in reqs]) == [(0, 1, 2), (0, 3)]


@pytest.mark.parametrize(
    "line, message",
    [
        ('{"timestamp": 0, "input_length": 10, "output_length": 1}', "hash_ids"),
        ('{"timestamp": 0, "input_length": 1000, "output_length": 1, "hash_ids": [1]}', "needs 2 hash ids"),
        ("not json", "malformed"),
    ],
)
def test_malformed_mooncake_line_names_file_and_line(tmp_path, line: str, message: str) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(
        '{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [0]}\n' + line + "\n"
    )
    with pytest.raises(TraceError, match=rf"bad.jsonl:2: .*{message}"):
        read_mooncake(path)


def test_azure_csv_gives_arrivals_and_lengths_without_sharing(tmp_path) -> None:
    path = tmp_path / "a.csv"
    path.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:15:46.6805900,374,44\n2023-11-16 18:15:50.1805900,10,2\n"
    )
    records = read_azure(path)
    assert [(r.timestamp, r.input_length, r.output_length) for r in records] == [(0.0, 374, 44), (3.5, 10, 2)]
    assert infinite_cache_block_hit_rate(records) == 0.0
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,x,1\n")
    with pytest.raises(TraceError, match="a.csv:2"):
        read_azure(path)


def test_infinite_cache_block_hit_rate_stops_at_the_first_miss() -> None:
    records = [TraceRecord(0, 1536, 1, (0, 1, 2)), TraceRecord(0, 1536, 1, (0, 5, 2))]
    assert infinite_cache_block_hit_rate(records) == pytest.approx(1 / 6)


def test_shared_mooncake_traces_reproduce_the_published_infinite_cache_hit_rates() -> None:
    try:
        root = data_dir()
    except FileNotFoundError:
        pytest.skip("trace data not available")
    conv = read_mooncake(root / "mooncake_conversation_trace.jsonl")
    assert len(conv) == 12031
    assert infinite_cache_block_hit_rate(conv) == pytest.approx(0.366, abs=0.001)


def test_a_trace_prompt_range_reads_as_the_built_prompt_without_building_it() -> None:
    """``token_ids`` of a trace request reads any range (inside the prompt, across its end into
    the output, at block edges) as the built prompt gives it, and a range alone never builds
    the prompt."""
    rec = TraceRecord(0.0, 1300, 4, (7, 3, 11))  # three blocks, the last one partial
    (req,) = to_requests([rec])
    (built,) = to_requests([rec])
    for r in (req, built):
        r.append_output_token_ids([1, 2, 3])
    full = list(built.all_token_ids)  # builds ``built``'s prompt
    blocks = [t for h in rec.hash_ids for t in block_tokens(h).tolist()]
    assert full[:1300] == blocks[:1300], "the prompt is its blocks' tokens, cut to its length"
    edges = [0, 1, 511, 512, 513, 1023, 1024, 1299, 1300, 1301, 1303]
    ranges = [(s, e) for s in edges for e in edges if s <= e]
    assert [req.token_ids(s, e) for s, e in ranges] == [full[s:e] for s, e in ranges]
    assert req._make_prompt is not None, "a range read built the whole prompt"
    assert list(req.all_token_ids) == full


@given(
    st.lists(st.integers(0, 2**64 - 1), max_size=50),
    st.one_of(st.integers(1, 300), st.sampled_from([32_000, 128_256, 2**40, 2**63 - 1])),
)
def test_hashes_map_to_token_ids_as_their_remainder(hashes: list[int], vocab_size: int) -> None:
    """The trace tokens and the simulated outputs reduce 64-bit hashes to ids by division
    (``hashes_to_token_ids``): the same ids as the remainder, for every hash and vocabulary."""
    x = np.array(hashes, dtype=np.uint64)
    ids = hashes_to_token_ids(x, vocab_size)
    assert ids.dtype == np.int64
    assert ids.tolist() == [h % vocab_size for h in hashes]


@given(
    planned=st.none() | st.lists(st.integers(0, 999), max_size=12),
    max_new=st.integers(0, 16),
    have=st.integers(0, 20),
    seed=st.integers(0, 2**64 - 1),
)
def test_output_tokens_are_the_planned_ones_then_the_simulated_ones_of_each_position(
    planned: list[int] | None, max_new: int, have: int, seed: int
) -> None:
    """The engine reads a request's next output token by position from one list made at its
    admission: its planned tokens, then, past them, the simulated token of each position (a
    function of seed, request id and position only), ``max(max_new_tokens, k + 1)`` of them at
    least (a longer plan is kept whole)."""
    req = Request("r", [1, 2, 3], max_new_tokens=max_new, planned_output_ids=planned)
    req.append_output_token_ids([5] * have)
    tokens = output_tokens(req, seed, 1000)
    n = max(max_new, have + 1)
    assert len(tokens) == max(n, len(planned or ()))
    for pos, token in enumerate(tokens):
        expected = planned[pos] if planned is not None and pos < len(planned) else (
            simulated_tokens(seed, "r", pos + 1, 1000)[pos]
        )
        assert token == expected, pos
