"""Trace readers and writers: Mooncake JSONL (with prefix sharing) and Azure LLM inference CSV
(arrivals and lengths only, no sharing).

Mooncake lines are ``{"timestamp": ms, "input_length", "output_length", "hash_ids"}``: one
hash id per 512-token block of the prompt, equal ids = equal content (chained, so an equal id
also means an equal prefix). We expand each id to a deterministic 512-token block, the last one
cut to ``input_length``. The trace cannot tell designs apart below 512 tokens: a hit inside a
block that the trace calls different never happens here.

Traces are read in place (never copied into the repo): a bare file name is looked up in the
data directory, ``../shared/data`` beside the repo if present, else ``$PREFIXCACHE_DATA``.

Reading checks every row, so a bad trace fails here, before any simulation: a ``TraceError``
(a ValueError) names the file, the 1-based line and the field. Blank lines are skipped (they
hold no request; skipping loses nothing). Rows out of timestamp order are sorted, stably, with
one ``TraceOrderWarning`` (see ``_in_arrival_order``). ``scale_arrivals`` rescales the load.
"""

from __future__ import annotations

import csv
import io
import json
import math
import numbers
import os
import warnings
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from prefixcache import Request, hashes_to_token_ids

MOONCAKE_BLOCK = 512
_REPO_ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True, slots=True)
class TraceRecord:
    """One request of a trace. timestamp in seconds; hash_ids empty when the trace has none."""

    timestamp: float
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...] = ()


class TraceError(ValueError):
    """A malformed trace: the message names the file, and the 1-based line and the field
    where there is one."""


class TraceOrderWarning(UserWarning):
    """A trace's rows were not in timestamp order; the reader sorted them (stably)."""


def data_dir() -> Path:
    local = _REPO_ROOT.parent / "shared" / "data"
    if local.is_dir():
        return local
    env = os.environ.get("PREFIXCACHE_DATA")
    if env:
        return Path(env)
    raise FileNotFoundError(f"no trace directory: {local} does not exist and $PREFIXCACHE_DATA is not set")


def resolve(path: str | Path) -> Path:
    """``path`` itself if it exists, else that name inside ``data_dir()``."""
    p = Path(path)
    if p.exists():
        return p
    try:
        directory = data_dir()
    except FileNotFoundError as e:
        raise FileNotFoundError(f"trace {str(path)!r} not found ({e})") from None
    candidate = directory / p.name
    if candidate.exists():
        return candidate
    raise FileNotFoundError(f"trace {str(path)!r} not found (also looked in {directory})")


# ------------------------------------------------------------------------------ Mooncake
MOONCAKE_FIELDS = ("timestamp", "input_length", "output_length", "hash_ids")
_HASH_ID_END = 1 << 64  # ids are expanded as uint64 (``_blocks_tokens``)


def read_mooncake(path: str | Path) -> list[TraceRecord]:
    """One ``TraceRecord`` per JSON line (blank lines skipped), in arrival order."""
    p = _trace_file(path)
    out: list[TraceRecord] = []
    lines: list[int] = []
    with p.open("rb") as f:  # json.loads takes bytes; a line that is not UTF-8 fails in it
        for lineno, line in enumerate(f, 1):
            if line.isspace():
                continue
            try:
                out.append(_mooncake_record(line))
            except ValueError as e:
                raise TraceError(f"{p}:{lineno}: malformed Mooncake line: {e}") from None
            lines.append(lineno)
    if not out:
        raise TraceError(f"{p}: empty trace: it holds no requests")
    return _in_arrival_order(out, lines, p)


def _mooncake_record(line: bytes) -> TraceRecord:
    """The record of one non-blank line; ValueError naming the field that is wrong."""
    if line.lstrip().startswith(b"["):
        raise ValueError("a JSON array; a Mooncake trace is JSON lines, one object per line")
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as e:  # its own "line 1" would be within this one line
        raise ValueError(f"not JSON ({e.msg} at column {e.pos + 1})") from None
    except UnicodeDecodeError as e:
        raise ValueError(f"not UTF-8 text ({e.reason} at byte {e.start + 1})") from None
    if not isinstance(obj, dict):
        raise ValueError(f"expected a JSON object with fields {', '.join(MOONCAKE_FIELDS)}, "
                         f"got {type(obj).__name__}")
    missing = [k for k in MOONCAKE_FIELDS if k not in obj]
    if missing:
        raise ValueError(f"missing field {', '.join(map(repr, missing))}")
    ms = obj["timestamp"]
    try:
        seconds = float(ms) / 1000.0 if type(ms) in (int, float) else math.nan  # not bool, not str
    except OverflowError:  # an int beyond float
        seconds = math.inf
    if not (math.isfinite(seconds) and seconds >= 0):
        raise ValueError(f"field 'timestamp' must be a finite number of ms >= 0, got {ms!r}")
    input_length = _count(obj["input_length"], "input_length", minimum=1)
    output_length = _count(obj["output_length"], "output_length")
    ids = obj["hash_ids"]
    if type(ids) is not list:
        raise ValueError(f"field 'hash_ids' must be a list of integers, got {ids!r}")
    if ids and ({*map(type, ids)} != {int} or min(ids) < 0 or max(ids) >= _HASH_ID_END):
        i = next(i for i, h in enumerate(ids) if type(h) is not int or not 0 <= h < _HASH_ID_END)
        raise ValueError(f"field 'hash_ids' item {i} must be an integer in [0, 2**64), got {ids[i]!r}")
    blocks = -(-input_length // MOONCAKE_BLOCK)
    if len(ids) != blocks:
        raise ValueError(f"field 'hash_ids': input_length {input_length} needs {blocks} hash ids of "
                         f"{MOONCAKE_BLOCK}-token blocks, got {len(ids)}")
    return TraceRecord(seconds, input_length, output_length, tuple(ids))


def write_mooncake(path: str | Path, records: Iterable[TraceRecord]) -> None:
    with Path(path).open("w") as f:
        for r in records:
            obj = {
                "timestamp": round(r.timestamp * 1000.0),
                "input_length": r.input_length,
                "output_length": r.output_length,
                "hash_ids": list(r.hash_ids),
            }
            f.write(json.dumps(obj) + "\n")


def block_tokens(hash_id: int, vocab_size: int = 32_000) -> np.ndarray:
    """The deterministic 512 tokens of block ``hash_id`` (splitmix64 of its positions)."""
    return _blocks_tokens([hash_id], vocab_size)


def _blocks_tokens(hash_ids: Sequence[int], vocab_size: int) -> np.ndarray:
    """``block_tokens`` of each id, concatenated, in one vectorised pass (the replay hot path)."""
    ids = np.asarray(hash_ids, dtype=np.uint64)
    x = (ids[:, None] * np.uint64(MOONCAKE_BLOCK) + np.arange(MOONCAKE_BLOCK, dtype=np.uint64)).reshape(-1)
    shifted = np.empty_like(x)  # one scratch array for both shifts (prompts run to 100k+ tokens)
    with np.errstate(over="ignore"):  # wrap-around is the point
        x *= np.uint64(0x9E3779B97F4A7C15)
        x ^= np.right_shift(x, np.uint64(30), out=shifted)
        x *= np.uint64(0xBF58476D1CE4E5B9)
        x ^= np.right_shift(x, np.uint64(27), out=shifted)
    return hashes_to_token_ids(x, vocab_size)


def mooncake_prompt(rec: TraceRecord, vocab_size: int = 32_000) -> list[int]:
    return _mooncake_prompt_array(rec, vocab_size).tolist()  # type: ignore[no-any-return]


def _mooncake_prompt_array(rec: TraceRecord, vocab_size: int) -> np.ndarray:
    return _mooncake_prompt_range(rec, vocab_size, 0, rec.input_length)


def _mooncake_prompt_range(rec: TraceRecord, vocab_size: int, start: int, end: int) -> np.ndarray:
    """Tokens [start, end) of the prompt, from the blocks they lie in."""
    end = min(end, rec.input_length)
    first = start // MOONCAKE_BLOCK
    offset = first * MOONCAKE_BLOCK
    tokens = _blocks_tokens(rec.hash_ids[first : -(-end // MOONCAKE_BLOCK)], vocab_size)
    return tokens[start - offset : end - offset]


def hash_ids_of(prompts: Sequence[Sequence[int]], block: int = MOONCAKE_BLOCK) -> list[tuple[int, ...]]:
    """Mooncake-style ids for token prompts: a block's id is fixed by its whole prefix
    (chained), numbered in order of first appearance, the partial last block included."""
    ids: dict[tuple[int, tuple[int, ...]], int] = {}
    out = []
    for prompt in prompts:
        parent, row = -1, []
        for start in range(0, len(prompt), block):
            key = (parent, tuple(prompt[start : start + block]))
            parent = ids.setdefault(key, len(ids))
            row.append(parent)
        out.append(tuple(row))
    return out


# ------------------------------------------------------------------------------ Azure
AZURE_FIELDS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")


def read_azure(path: str | Path) -> list[TraceRecord]:
    """Azure LLM inference trace (TIMESTAMP, ContextTokens, GeneratedTokens), blank rows
    skipped, in arrival order; arrivals are seconds after the earliest request."""
    p = _trace_file(path)
    raw = p.read_bytes()
    try:
        text = raw.decode("utf-8-sig")  # a byte-order mark (spreadsheet export) is no error
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        raise TraceError(f"{p}:{line}: not UTF-8 text ({e.reason})") from None
    reader = csv.reader(io.StringIO(text, newline=""))
    header = next(reader, None)
    if header is None:
        raise TraceError(f"{p}: empty trace: it holds no requests")
    if [h.strip() for h in header[:3]] != list(AZURE_FIELDS):
        raise TraceError(f"{p}:1: expected header {','.join(AZURE_FIELDS)}, got {header}")
    stamps: list[datetime] = []
    lengths: list[tuple[int, int]] = []
    lines: list[int] = []
    for row in reader:
        if len(row) <= 1 and not "".join(row).strip():  # a blank line
            continue
        try:
            stamp, ctx, gen = _azure_row(row)
        except ValueError as e:
            raise TraceError(f"{p}:{reader.line_num}: malformed Azure row {row}: {e}") from None
        stamps.append(stamp)
        lengths.append((ctx, gen))
        lines.append(reader.line_num)
    if not stamps:
        raise TraceError(f"{p}: no rows after the header: it holds no requests")
    try:
        t0 = min(stamps)
    except TypeError:  # time-zone-aware and naive datetimes do not compare
        naive = stamps[0].tzinfo is None
        line = next(n for s, n in zip(stamps, lines, strict=True) if (s.tzinfo is None) != naive)
        raise TraceError(f"{p}:{line}: field 'TIMESTAMP' mixes time-zone-aware and naive times") from None
    out = [TraceRecord((s - t0).total_seconds(), c, g) for s, (c, g) in zip(stamps, lengths, strict=True)]
    return _in_arrival_order(out, lines, p)


def _azure_row(row: list[str]) -> tuple[datetime, int, int]:
    if len(row) < len(AZURE_FIELDS):
        raise ValueError(f"missing field {', '.join(map(repr, AZURE_FIELDS[len(row):]))}")
    try:
        stamp = datetime.fromisoformat(row[0].strip())
    except ValueError:
        raise ValueError(f"field 'TIMESTAMP' must be an ISO date and time, got {row[0]!r}") from None
    return stamp, _int(row[1], "ContextTokens", minimum=1), _int(row[2], "GeneratedTokens")


def read_trace(path: str | Path) -> list[TraceRecord]:
    """Mooncake for .jsonl, Azure for .csv; in arrival order (rows out of order are sorted,
    with one TraceOrderWarning: ``_in_arrival_order`` says why)."""
    p = _trace_file(path)
    if p.suffix == ".jsonl":
        return read_mooncake(p)
    if p.suffix == ".csv":
        return read_azure(p)
    raise ValueError(f"unknown trace format {p.suffix!r} for {p}; expected .jsonl (Mooncake) or .csv (Azure)")


def _trace_file(path: str | Path) -> Path:
    """``resolve(path)``, refusing a folder (FileNotFoundError if there is no such file)."""
    p = resolve(path)
    if p.is_dir():
        raise TraceError(f"{p}: is a folder; a trace is one .jsonl (Mooncake) or .csv (Azure) file")
    return p


def _in_arrival_order(records: list[TraceRecord], lines: list[int], path: Path) -> list[TraceRecord]:
    """``records`` sorted by timestamp, stably, with one ``TraceOrderWarning`` if they were not.

    A trace's order is its arrival order: requests are numbered (``trace-i``) and read by the
    engine as listed, and a request listed after a later one joins only when it is read, after
    its own arrival, so its wait counts from the past (an Azure trace with rows out of order
    showed TTFTs 10-20 s too long). Sorting keeps every request and the listed order among equal
    timestamps; refusing would send a researcher to edit a public trace by hand. The warning
    says so, since sorting renumbers requests."""
    ts = np.fromiter((r.timestamp for r in records), dtype=np.float64, count=len(records))
    late = ts[1:] < np.maximum.accumulate(ts)[:-1]  # row i+1 comes after a later arrival
    if not late.any():
        return records
    warnings.warn(
        f"{path}: {int(late.sum())} of {len(records)} rows are out of timestamp order (the first at "
        f"line {lines[int(late.argmax()) + 1]}); sorted them by timestamp (stable), as a trace's "
        "order is its arrival order",
        TraceOrderWarning,
        stacklevel=3,
    )
    return [records[i] for i in np.argsort(ts, kind="stable")]


def check_arrival_scale(factor: object, what: str = "arrival scale") -> float:
    """``factor`` as a float, or ValueError unless it is a finite real number > 0."""
    if isinstance(factor, bool) or not isinstance(factor, numbers.Real) or not (
        math.isfinite(factor) and factor > 0
    ):
        raise ValueError(f"{what} must be a finite number > 0 (0.5 = twice the load), got {factor!r}")
    return float(factor)


def scale_arrivals(records: Sequence[TraceRecord], factor: float) -> list[TraceRecord]:
    """New records whose arrivals lie ``factor`` times as far from the earliest one (the first,
    in a trace read here): 0.5 replays the same requests at twice the load, 2 at half. Lengths
    and hash ids are kept and ``records`` is left as it was. ValueError unless ``factor`` is a
    finite number > 0."""
    factor = check_arrival_scale(factor)
    if not records:
        return []
    t0 = min(r.timestamp for r in records)
    return [TraceRecord(t0 + (r.timestamp - t0) * factor, r.input_length, r.output_length, r.hash_ids)
            for r in records]


# ------------------------------------------------------------------------------ to requests
def iter_requests(
    records: Sequence[TraceRecord],
    *,
    limit: int | None = None,
    vocab_size: int = 32_000,
    seed: int = 0,
    prefix: str = "trace",
) -> Iterator[Request]:
    """Requests for the first ``limit`` records, built one at a time: a whole trace as token
    lists would take gigabytes, and the engine pulls requests only as they arrive. Records
    without hash ids (Azure) get unique random prompts, so they share nothing."""
    rng = np.random.default_rng(seed)
    for i, rec in enumerate(records[:limit]):
        kwargs = {"arrival_time": rec.timestamp, "max_new_tokens": rec.output_length}
        if rec.hash_ids:
            # Built when a cache first reads it: a waiting request holds no tokens.
            make = partial(_mooncake_prompt_array, rec, vocab_size)
            make_range = partial(_mooncake_prompt_range, rec, vocab_size)
            yield Request.deferred(f"{prefix}-{i}", rec.input_length, make, make_range, **kwargs)
        else:
            # Arrays, not lists: Request validates an int64 array in one pass and keeps it.
            prompt = rng.integers(0, vocab_size, rec.input_length, dtype=np.int64)
            yield Request(f"{prefix}-{i}", prompt, **kwargs)  # type: ignore[arg-type]


def to_requests(records: Sequence[TraceRecord], **kwargs: Any) -> list[Request]:
    """``list(iter_requests(records, **kwargs))``: fine for small limits."""
    return list(iter_requests(records, **kwargs))


def infinite_cache_block_hit_rate(records: Iterable[TraceRecord]) -> float:
    """Share of blocks already seen in an earlier request (an unbounded block cache)."""
    seen: set[int] = set()
    hits = total = 0
    for rec in records:
        total += len(rec.hash_ids)
        k = 0
        while k < len(rec.hash_ids) and rec.hash_ids[k] in seen:  # a prefix cache stops at a miss
            k += 1
        hits += k
        seen.update(rec.hash_ids)
    return hits / total if total else 0.0


def _int(text: str, field: str, minimum: int = 0) -> int:
    try:
        return _count(int(text), field, minimum)
    except ValueError:
        raise ValueError(f"field {field!r} must be an integer >= {minimum}, got {text!r}") from None


def _count(value: object, field: str, minimum: int = 0) -> int:
    if type(value) is not int or value < minimum:  # type, not isinstance: bool is no count
        raise ValueError(f"field {field!r} must be an integer >= {minimum}, got {value!r}")
    return value
