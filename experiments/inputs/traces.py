"""Trace readers and writers: Mooncake JSONL (with prefix sharing) and Azure LLM inference CSV
(arrivals and lengths only, no sharing).

Mooncake lines are ``{"timestamp": ms, "input_length", "output_length", "hash_ids"}``: one
hash id per 512-token block of the prompt, equal ids = equal content (chained, so an equal id
also means an equal prefix). We expand each id to a deterministic 512-token block, the last one
cut to ``input_length``. The trace cannot tell designs apart below 512 tokens: a hit inside a
block that the trace calls different never happens here.

Traces are read in place (never copied into the repo): a bare file name is looked up in the
data directory, ``../shared/data`` beside the repo if present, else ``$PREFIXCACHE_DATA``.
"""

from __future__ import annotations

import csv
import json
import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from prefixcache import Request

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
    """A malformed trace line; the message names the file and line number."""


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
    candidate = data_dir() / p.name
    if candidate.exists():
        return candidate
    raise FileNotFoundError(f"trace {str(path)!r} not found (also looked in {data_dir()})")


# ------------------------------------------------------------------------------ Mooncake
def read_mooncake(path: str | Path) -> list[TraceRecord]:
    p = resolve(path)
    out: list[TraceRecord] = []
    with p.open() as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
                rec = TraceRecord(
                    float(obj["timestamp"]) / 1000.0,  # ms -> s
                    _nonneg_int(obj["input_length"], "input_length"),
                    _nonneg_int(obj["output_length"], "output_length"),
                    tuple(_nonneg_int(h, "hash id") for h in obj["hash_ids"]),
                )
                blocks = -(-rec.input_length // MOONCAKE_BLOCK)
                if rec.input_length == 0 or len(rec.hash_ids) != blocks:
                    raise ValueError(
                        f"input_length {rec.input_length} needs {blocks} hash ids of "
                        f"{MOONCAKE_BLOCK}-token blocks, got {len(rec.hash_ids)}"
                    )
            except (ValueError, KeyError, TypeError) as e:
                raise TraceError(f"{p}:{lineno}: malformed Mooncake record: {e!r}") from None
            out.append(rec)
    return out


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
    with np.errstate(over="ignore"):  # wrap-around is the point
        x *= np.uint64(0x9E3779B97F4A7C15)
        x ^= x >> np.uint64(30)
        x *= np.uint64(0xBF58476D1CE4E5B9)
        x ^= x >> np.uint64(27)
    return (x % np.uint64(vocab_size)).astype(np.int64)


def mooncake_prompt(rec: TraceRecord, vocab_size: int = 32_000) -> list[int]:
    return _mooncake_prompt_array(rec, vocab_size).tolist()  # type: ignore[no-any-return]


def _mooncake_prompt_array(rec: TraceRecord, vocab_size: int) -> np.ndarray:
    return _blocks_tokens(rec.hash_ids, vocab_size)[: rec.input_length]


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
def read_azure(path: str | Path) -> list[TraceRecord]:
    """Azure LLM inference trace (TIMESTAMP, ContextTokens, GeneratedTokens); arrivals are
    seconds after the first request."""
    p = resolve(path)
    out: list[TraceRecord] = []
    t0: datetime | None = None
    with p.open(newline="") as f:
        reader = csv.reader(f)
        header = next(reader, None)
        expected = ["TIMESTAMP", "ContextTokens", "GeneratedTokens"]
        if header is None or [h.strip() for h in header[:3]] != expected:
            raise TraceError(f"{p}:1: expected header {','.join(expected)}, got {header}")
        for lineno, row in enumerate(reader, 2):
            try:
                stamp = datetime.fromisoformat(row[0].strip())
                t0 = t0 or stamp
                ctx = _nonneg_int(int(row[1]), "ContextTokens")
                if ctx == 0:
                    raise ValueError("ContextTokens is 0")
                gen = _nonneg_int(int(row[2]), "GeneratedTokens")
                out.append(TraceRecord((stamp - t0).total_seconds(), ctx, gen))
            except (ValueError, IndexError) as e:
                raise TraceError(f"{p}:{lineno}: malformed Azure row {row}: {e!r}") from None
    return out


def read_trace(path: str | Path) -> list[TraceRecord]:
    """Mooncake for .jsonl, Azure for .csv."""
    p = resolve(path)
    if p.suffix == ".jsonl":
        return read_mooncake(p)
    if p.suffix == ".csv":
        return read_azure(p)
    raise ValueError(f"unknown trace format {p.suffix!r} for {p}; expected .jsonl (Mooncake) or .csv (Azure)")


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
            yield Request.deferred(f"{prefix}-{i}", rec.input_length, make, **kwargs)
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


def _nonneg_int(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{what} must be an int >= 0, got {value!r}")
    return value
