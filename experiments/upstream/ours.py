"""Replay a scenario through one of our backends via the PrefixCache contract (no upstream)."""

from __future__ import annotations

import time
from typing import Any

from prefixcache import CacheConfig, PrefixCache, Request, make_cache


def usage_of(cache: PrefixCache) -> list[int]:
    return list(cache.usage())


def replay_ours(
    backend: str, scenario: dict[str, Any], *, time_requests: bool = True, record: bool = True,
    **options: Any
) -> tuple[list[dict[str, Any]], float]:
    """Returns (one record per op, seconds spent inside cache calls; recording is not timed).

    record: False leaves out each op's page ids and usage (only ok, hit and freed stay): a timed
    run, whose page lists (millions of ints at page size 1) would slow the next calls down.
    time_requests: whether building each ``Request`` (its token ids checked and copied) counts
    too: it is no cache call, but the upstream being compared may do cache work in its own
    request's constructor (vLLM's hashes the prompt's blocks there), and then both count it."""
    cache = make_cache(backend, CacheConfig(scenario["capacity_tokens"], scenario["page_size"]), **options)
    reqs: dict[str, Request] = {}
    records: list[dict[str, Any]] = []
    spent = 0.0
    for op in scenario["ops"]:
        kind = op["op"]
        rec: dict[str, Any] = {}
        t0 = time.perf_counter()
        if kind == "new":
            reqs[op["rid"]] = Request(op["rid"], op["prompt"], cache_salt=op.get("salt"))
            if time_requests:
                spent += time.perf_counter() - t0
        elif kind == "alloc":
            req = reqs[op["rid"]]
            first = not cache.is_live(req)
            match = cache.lookup(req) if first else None
            done = match.tokens if match is not None else req.num_computed_tokens
            n = op["n"] if op.get("n") is not None else req.num_tokens - done
            ok = cache.allocate(req, n, match)
            spent += time.perf_counter() - t0  # what follows only records
            rec["ok"] = ok
            if first:
                rec["hit"] = req.num_computed_tokens if ok else None
            if record:
                rec["pages"] = [int(p) for p in cache.page_table(req)] if ok else None
        elif kind == "run":
            req = reqs[op["rid"]]
            req.num_computed_tokens = cache.reserved_tokens(req)
            cache.commit(req)
            spent += time.perf_counter() - t0
            if record:
                rec["pages"] = [int(p) for p in cache.page_table(req)]
        elif kind == "append":
            reqs[op["rid"]].append_output_token_ids(op["tokens"])
            spent += time.perf_counter() - t0
        elif kind == "release":
            cache.release(reqs[op["rid"]])
            spent += time.perf_counter() - t0
        elif kind == "evict":
            rec["freed"] = cache.evict(op["n"])
            spent += time.perf_counter() - t0
        else:
            raise ValueError(f"unknown op {kind!r}")
        if record:
            rec["usage"] = usage_of(cache)
        records.append(rec)
    return records, spent


def compare(ours: list[dict[str, Any]], upstream: list[dict[str, Any]], ops: list[dict[str, Any]],
            fields: tuple[str, ...] = ("ok", "hit", "pages", "freed", "usage")) -> list[str]:
    """Human-readable differences, one per (op, field); empty when they agree."""
    diffs: list[str] = []
    for i, (a, b, op) in enumerate(zip(ours, upstream, ops, strict=True)):
        for f in fields:
            if f in b and a.get(f) != b[f]:
                diffs.append(f"op {i} {op['op']} {op.get('rid', '')}: {f} ours={a.get(f)} upstream={b[f]}")
    return diffs
