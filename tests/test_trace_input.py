"""Trace input a researcher can trust (experiments/inputs/traces.py): every malformed trace is
a ValueError naming the file, the 1-based line and the field, raised while reading; rows out
of order are sorted with one warning; ``scale_arrivals`` rescales the load."""

from __future__ import annotations

import math
import warnings

import pytest
from prefixcache.experiments.inputs import traces
from prefixcache.experiments.inputs.traces import (
    TraceError,
    TraceOrderWarning,
    TraceRecord,
    read_trace,
    scale_arrivals,
)

GOOD = '{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [0]}'
HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens"
GOOD_ROW = "2023-11-16 18:15:46.6805900,374,44"


def mooncake_line(**fields: object) -> str:
    """GOOD with ``fields`` replaced (a value of ... drops the field); values are JSON text."""
    base = {"timestamp": "0", "input_length": "10", "output_length": "1", "hash_ids": "[0]"}
    base.update(fields)  # type: ignore[arg-type]
    return "{" + ", ".join(f'"{k}": {v}' for k, v in base.items() if v is not ...) + "}"


@pytest.mark.parametrize(
    "line, message",
    [
        (mooncake_line(timestamp="NaN"), "field 'timestamp' must be a finite number of ms >= 0, got nan"),
        (mooncake_line(timestamp="Infinity"), "field 'timestamp' must be a finite number .* got inf"),
        (mooncake_line(timestamp="-5"), "field 'timestamp' must be a finite number of ms >= 0, got -5"),
        (mooncake_line(timestamp='"5"'), "field 'timestamp' must be a finite number .* got '5'"),
        (mooncake_line(timestamp="true"), "field 'timestamp' must be a finite number .* got True"),
        (mooncake_line(input_length="-10"), "field 'input_length' must be an integer >= 1, got -10"),
        (mooncake_line(input_length="0", hash_ids="[]"), "field 'input_length' must be an integer >= 1"),
        (mooncake_line(input_length="10.5"), "field 'input_length' must be an integer >= 1, got 10.5"),
        (mooncake_line(output_length="-1"), "field 'output_length' must be an integer >= 0, got -1"),
        (mooncake_line(output_length="1.5"), "field 'output_length' must be an integer >= 0, got 1.5"),
        (mooncake_line(hash_ids="[1.5]"), r"field 'hash_ids' item 0 must be an integer in \[0, 2\*\*64\)"),
        (mooncake_line(input_length="600", hash_ids="[0, -1]"), "field 'hash_ids' item 1 .* got -1"),
        (mooncake_line(hash_ids='["a"]'), "field 'hash_ids' item 0 .* got 'a'"),
        (mooncake_line(hash_ids=f"[{2**64}]"), "field 'hash_ids' item 0 must be an integer in"),
        (mooncake_line(hash_ids="7"), "field 'hash_ids' must be a list of integers, got 7"),
        (mooncake_line(input_length="1000"), "field 'hash_ids': input_length 1000 needs 2 hash ids"),
        (mooncake_line(timestamp=...), "missing field 'timestamp'"),
        (mooncake_line(output_length=..., hash_ids=...), "missing field 'output_length', 'hash_ids'"),
        ('{"timestamp": 0, "input_length": 10', r"not JSON \(Expecting ',' delimiter at column 37\)"),
        ("5", "expected a JSON object with fields timestamp, input_length, output_length, hash_ids"),
        (f"[{GOOD}]", "a JSON array; a Mooncake trace is JSON lines, one object per line"),
    ],
)
def test_a_malformed_mooncake_line_is_an_error_naming_file_line_and_field(tmp_path, line, message) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(f"{GOOD}\n\n{line}\n{GOOD}\n")  # the blank line counts: the bad one is line 3
    with pytest.raises(TraceError, match=rf"bad\.jsonl:3: malformed Mooncake line: {message}"):
        read_trace(path)


def test_a_mooncake_line_that_is_not_utf8_names_its_line(tmp_path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_bytes(f"{GOOD}\n".encode() + b'{"timestamp": 0, "x": "\xff"}\n')
    with pytest.raises(TraceError, match=r"bad\.jsonl:2: malformed Mooncake line: not UTF-8 text .* byte 24"):
        read_trace(path)


def test_a_json_array_file_is_refused_at_its_first_line(tmp_path) -> None:
    path = tmp_path / "array.jsonl"
    path.write_text(f"[\n{GOOD},\n{GOOD}\n]\n")
    with pytest.raises(TraceError, match=r"array\.jsonl:1: .*a JSON array; a Mooncake trace is JSON lines"):
        read_trace(path)


@pytest.mark.parametrize(
    "row, message",
    [
        ("nan,374,44", "field 'TIMESTAMP' must be an ISO date and time, got 'nan'"),
        ("2023-11-16 18:15:50,-3,44", "field 'ContextTokens' must be an integer >= 1, got '-3'"),
        ("2023-11-16 18:15:50,0,44", "field 'ContextTokens' must be an integer >= 1, got '0'"),
        ("2023-11-16 18:15:50,3.5,44", "field 'ContextTokens' must be an integer >= 1, got '3.5'"),
        ("2023-11-16 18:15:50,374,-1", "field 'GeneratedTokens' must be an integer >= 0, got '-1'"),
        ("2023-11-16 18:15:50,374,x", "field 'GeneratedTokens' must be an integer >= 0, got 'x'"),
        ("2023-11-16 18:15:50,374", "missing field 'GeneratedTokens'"),
        ("2023-11-16 18:15:50", "missing field 'ContextTokens', 'GeneratedTokens'"),
    ],
)
def test_a_malformed_azure_row_is_an_error_naming_file_line_and_field(tmp_path, row, message) -> None:
    path = tmp_path / "bad.csv"
    path.write_text(f"{HEADER}\n{GOOD_ROW}\n\n{row}\n{GOOD_ROW}\n")
    with pytest.raises(TraceError, match=rf"bad\.csv:4: malformed Azure row .*: {message}"):
        read_trace(path)


@pytest.mark.parametrize(
    "data, message",
    [
        (b"TIMESTAMP,Tokens\n" + GOOD_ROW.encode() + b"\n", r"bad\.csv:1: expected header TIMESTAMP,"),
        (f"{HEADER}\n{GOOD_ROW}\n2023-11-16 18:15:50+00:00,1,1\n".encode(),
         r"bad\.csv:3: field 'TIMESTAMP' mixes time-zone-aware and naive times"),
        (f"{HEADER}\n{GOOD_ROW}\n".encode() + b"2023-11-16 18:15:50,1,\xff\n", r"bad\.csv:3: not UTF-8 text"),
    ],
)
def test_a_malformed_azure_file_is_an_error_naming_file_and_line(tmp_path, data, message) -> None:
    path = tmp_path / "bad.csv"
    path.write_bytes(data)
    with pytest.raises(TraceError, match=message):
        read_trace(path)


@pytest.mark.parametrize(
    "name, text",
    [("empty.jsonl", ""), ("blank.jsonl", "\n  \n\n"), ("empty.csv", ""), ("header.csv", f"{HEADER}\n\n")],
)
def test_a_trace_without_requests_is_an_error(tmp_path, name, text) -> None:
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(TraceError, match=rf"{name}: .*it holds no requests"):
        read_trace(path)


@pytest.mark.parametrize("name", ["folder.jsonl", "folder.csv", "folder"])
def test_a_folder_is_not_a_trace(tmp_path, name) -> None:
    (tmp_path / name).mkdir()
    with pytest.raises(TraceError, match=rf"{name}: is a folder; a trace is one .jsonl"):
        read_trace(tmp_path / name)


def test_a_missing_trace_is_file_not_found_naming_it(tmp_path, monkeypatch) -> None:
    with pytest.raises(FileNotFoundError, match="trace '.*no-such-trace.jsonl' not found"):
        read_trace(tmp_path / "no-such-trace.jsonl")
    # without a data folder too (it used to name only the missing folder)
    monkeypatch.setattr(traces, "_REPO_ROOT", tmp_path)
    monkeypatch.delenv("PREFIXCACHE_DATA", raising=False)
    with pytest.raises(FileNotFoundError, match="'.*no-such-trace.jsonl' not found .*no trace directory"):
        read_trace(tmp_path / "no-such-trace.jsonl")


def test_blank_lines_are_skipped(tmp_path) -> None:
    mooncake, azure = tmp_path / "t.jsonl", tmp_path / "t.csv"
    mooncake.write_text(f"\n{GOOD}\n   \n{GOOD}\n\n")
    azure.write_text(f"{HEADER}\n\n{GOOD_ROW}\n \n{GOOD_ROW}\n")
    assert read_trace(mooncake) == [TraceRecord(0.0, 10, 1, (0,))] * 2
    assert read_trace(azure) == [TraceRecord(0.0, 374, 44)] * 2


def read_warning_once(path) -> tuple[list[TraceRecord], str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        records = read_trace(path)
    assert [w.category for w in caught] == [TraceOrderWarning]
    return records, str(caught[0].message)


def test_azure_rows_out_of_order_are_sorted_with_one_warning_and_no_negative_arrival(tmp_path) -> None:
    path = tmp_path / "azure.csv"
    path.write_text(
        f"{HEADER}\n2023-11-16 18:15:50,1,1\n2023-11-16 18:15:40,2,2\n\n"
        "2023-11-16 18:15:55,3,3\n2023-11-16 18:15:45,4,4\n"
    )
    records, message = read_warning_once(path)
    assert [(r.timestamp, r.input_length) for r in records] == [(0.0, 2), (5.0, 4), (10.0, 1), (15.0, 3)]
    assert f"{path}: 2 of 4 rows are out of timestamp order (the first at line 3); sorted them" in message


def test_descending_mooncake_timestamps_are_sorted_stably_with_one_warning(tmp_path) -> None:
    path = tmp_path / "down.jsonl"
    rows = [(3000, 1), (2000, 2), (2000, 3), (1000, 4)]
    path.write_text("".join(mooncake_line(timestamp=str(t), output_length=str(o)) + "\n" for t, o in rows))
    records, message = read_warning_once(path)
    assert [(r.timestamp, r.output_length) for r in records] == [(1.0, 4), (2.0, 2), (2.0, 3), (3.0, 1)]
    assert "down.jsonl: 3 of 4 rows are out of timestamp order (the first at line 2)" in message


def test_a_trace_in_order_reads_without_a_warning(tmp_path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text(mooncake_line(timestamp="0") + "\n" + mooncake_line(timestamp="0") + "\n"
                    + mooncake_line(timestamp="7") + "\n")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert [r.timestamp for r in read_trace(path)] == [0.0, 0.0, 0.007]


# ------------------------------------------------------------------------------ scale_arrivals
RECORDS = [TraceRecord(10.0, 5, 1, (0,)), TraceRecord(12.0, 6, 2, (1,)), TraceRecord(20.0, 7, 3, (2,))]


@pytest.mark.parametrize("factor, expected", [(0.5, [10.0, 11.0, 15.0]), (2, [10.0, 14.0, 30.0]),
                                              (1.0, [10.0, 12.0, 20.0])])
def test_scale_arrivals_scales_gaps_from_the_first_and_keeps_the_rest(factor, expected) -> None:
    before = list(RECORDS)
    scaled = scale_arrivals(RECORDS, factor)
    assert [r.timestamp for r in scaled] == pytest.approx(expected)
    assert [(r.input_length, r.output_length, r.hash_ids) for r in scaled] == [
        (r.input_length, r.output_length, r.hash_ids) for r in RECORDS
    ]
    assert before == RECORDS and scaled is not RECORDS


def test_scale_arrivals_of_nothing_is_nothing() -> None:
    assert scale_arrivals([], 0.5) == []


@pytest.mark.parametrize("factor", [0, -1.0, math.nan, math.inf, "0.5", True, None])
def test_scale_arrivals_refuses_a_factor_that_is_not_a_finite_positive_number(factor) -> None:
    with pytest.raises(ValueError, match="arrival scale must be a finite number > 0"):
        scale_arrivals(RECORDS, factor)
