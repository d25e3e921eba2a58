"""Cost of every cache operation, per backend, and how it grows (``make bench``).

Measures, on this machine and in one run (so ratios are comparable):

* ``lookup`` and the admit cycle (allocate + commit + release) against prompt length
  (1k .. 128k tokens): per-request and per-token cost, and the log-log growth exponent;
* the same cycle against cache size (10^3 .. 10^6 pages, cache full of evictable entries so
  every admission evicts): cost must stay flat as the cache grows 1000x;
* ``evict`` of one request's worth of tokens from a full cache.

Wall time mixes two things as the cache grows: the work an operation does (what an O(cache
size) path would grow) and what each memory access costs (a million-page index no longer fits
in the CPU caches). So beside seconds, each cache-size point records ``calls``: the Python and
C function calls of one operation, counted with ``sys.setprofile``, deterministic and equal at
every size when no path grows with the cache. A control, ``dict-control``, times the bare data
structure work (pop 16 old keys from a dict of N 36-byte keys, insert 16 new ones) at the same
sizes: its growth is the memory hierarchy's alone.

Writes ``results/bench/ops.csv`` (tidy: op, backend, variable, value, seconds, calls) and
``results/bench/summary.json`` (exponents and flatness ratios), which the paper's cost figure
reads, and prints one line per measurement plus a summary.
"""

from __future__ import annotations

import argparse
import csv
import gc
import itertools
import json
import math
import os
import random
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any

from prefixcache import CacheConfig, PrefixCache, Request, available_backends, make_cache

# (label, backend, page size, options)
VARIANTS: list[tuple[str, str, int, dict[str, Any]]] = [
    ("hashchain-sha256", "hashchain", 16, {"hash_fn": "sha256"}),
    ("hashchain-xxhash", "hashchain", 16, {"hash_fn": "xxhash"}),
    ("radix-p1", "radix", 1, {}),
    ("radix-p16", "radix", 16, {}),
]
PROMPT_LENGTHS = [1024, 4096, 16384, 65536, 131072]
CACHE_PAGES = [1_000, 10_000, 100_000, 1_000_000]
QUICK_PROMPT_LENGTHS = [1024, 4096, 16384]
QUICK_CACHE_PAGES = [1_000, 10_000, 100_000]


def best_of(op: Callable[[Request], Any], make: Callable[[], Request], repeat: int,
            before: Callable[[], Any] = lambda: None) -> float:
    """Minimum wall time of ``op(request)`` over ``repeat`` runs; ``before`` and the request's
    construction (``make``) are not timed."""
    best = math.inf
    for _ in range(repeat):
        before()
        req = make()
        t0 = time.perf_counter()
        op(req)
        best = min(best, time.perf_counter() - t0)
    return best


def write_rows_csv(path: Path, rows: list[dict[str, Any]]) -> None:
    """One CSV of ``rows`` (the first row's keys are the header; None is written empty)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


@contextmanager
def collector_off() -> Iterator[None]:
    """The cyclic collector run once, then held off for the block, as ``timeit`` times, and put
    back as it was: its pauses (and the finalizers they run) belong to whatever allocated
    before, not to the work timed or counted inside."""
    was_enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def count_calls(op: Callable[[], Any]) -> int:
    """Python and C function calls made by ``op()``: the work, independent of memory speed.

    The garbage collector is held off while ``op`` runs: a collection would run finalizers and
    ``gc.callbacks`` of objects that earlier code left behind, calls that are not ``op``'s work
    and that depend on what ran before (a test suite's order)."""
    calls = 0

    def profile(frame: Any, event: str, arg: Any) -> None:
        nonlocal calls
        if event == "call" or event == "c_call":
            calls += 1

    with collector_off():
        sys.setprofile(profile)
        try:
            op()
        finally:
            sys.setprofile(None)
    return calls - 1  # setprofile(None) itself is reported as a c_call


def random_tokens(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(32_000) for _ in range(n)]


def cycle(cache: PrefixCache, req: Request) -> None:
    match = cache.lookup(req)
    assert cache.allocate(req, req.num_tokens - match.tokens, match), "bench cache too small"
    req.num_computed_tokens = req.num_tokens
    cache.commit(req)
    cache.release(req)


def fill(cache: PrefixCache, rng: random.Random, request_tokens: int) -> None:
    """Fill the pool with released (evictable) distinct requests."""
    n = 0
    while cache.usage().free * cache.page_size >= request_tokens:
        cycle(cache, Request(f"fill{n}", random_tokens(rng, request_tokens)))
        n += 1


def requests_of(tokens: Callable[[], list[int]]) -> Callable[[], Request]:
    ids = itertools.count()
    return lambda: Request(f"bench{next(ids)}", tokens())


def row(op: str, label: str, variable: str, value: int, seconds: float, calls: int | None = None) -> dict:
    return dict(op=op, backend=label, variable=variable, value=value, seconds=seconds, calls=calls)


def bench_prompt_length(label: str, name: str, page: int, opts: dict, lengths: list[int],
                        repeat: int) -> list[dict]:
    """Lengths are measured round-robin (best of ``repeat`` rounds), as cache sizes are."""
    rng = random.Random(0)
    setups = {}
    for length in lengths:
        cache = make_cache(name, CacheConfig(4 * length + 64 * page, page), **opts)
        prompt = random_tokens(rng, length)
        miss = random_tokens(rng, length)
        cycle(cache, Request("warm", prompt))
        setups[length] = (cache, prompt, miss)
    best = {(op, length): math.inf for op in ("lookup_hit", "cycle_miss") for length in lengths}
    for _ in range(repeat):
        for length, (cache, prompt, miss) in setups.items():
            # A fresh Request each time: its hashes (hashchain) or key (radix) are built afresh.
            best["lookup_hit", length] = min(best["lookup_hit", length],
                                             best_of(cache.lookup, requests_of(prompt.copy), 1))
            best["cycle_miss", length] = min(best["cycle_miss", length],
                                             best_of(partial(cycle, cache), requests_of(miss.copy), 1,
                                                     before=partial(cache.evict, 10**9)))
    rows = []
    for (op, length), t in sorted(best.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        rows.append(row(op, label, "prompt_tokens", length, t))
        print(f"{label:18s} {op:14s} prompt={length:7d}  {t * 1e3:9.3f} ms  "
              f"{t / length * 1e9:8.1f} ns/token")
    return rows


def bench_cache_size(label: str, name: str, page: int, opts: dict, sizes: list[int],
                     repeat: int) -> list[dict]:
    """Sizes are measured round-robin (every size once per round, best of ``repeat`` rounds),
    so load from other processes on a shared machine hits all sizes alike."""
    request_tokens = 256  # a quarter of the smallest pool at page size 1
    rng = random.Random(1)
    new_request = requests_of(partial(random_tokens, rng, request_tokens))
    caches = {}
    for pages in sizes:
        caches[pages] = make_cache(name, CacheConfig(pages * page, page), **opts)
        fill(caches[pages], rng, request_tokens)
    best = {(op, pages): math.inf for op in ("cycle_evicting", "evict") for pages in sizes}
    for _ in range(repeat):
        for pages, cache in caches.items():
            # The pool is full of cached entries: this admission has to evict.
            best["cycle_evicting", pages] = min(best["cycle_evicting", pages],
                                                best_of(partial(cycle, cache), new_request, 1))
            # evict() from a full pool, refilled by an untimed admission first.
            cycle(cache, new_request())
            t0 = time.perf_counter()
            cache.evict(request_tokens)
            best["evict", pages] = min(best["evict", pages], time.perf_counter() - t0)
    calls = {}
    for pages, cache in caches.items():
        req = new_request()
        calls["cycle_evicting", pages] = count_calls(partial(cycle, cache, req))
        cycle(cache, new_request())
        calls["evict", pages] = count_calls(partial(cache.evict, request_tokens))
    rows = []
    for (op, pages), t in best.items():
        rows.append(row(op, label, "cache_pages", pages, t, calls[op, pages]))
        print(f"{label:18s} {op:14s} pages={pages:8d}  {t * 1e3:9.3f} ms per 256-token request  "
              f"{calls[op, pages]:6d} calls")
    return rows


def bench_dict_control(sizes: list[int], repeat: int) -> list[dict]:
    """The memory hierarchy alone: pop the 16 oldest of N keys (36 random bytes each, as a
    SHA-256 block key) from a dict and insert 16 new ones, round-robin over the sizes."""
    per_op = 16
    tables = {}
    for n in sizes:
        keys = [os.urandom(36) for _ in range(n)]
        tables[n] = (dict.fromkeys(keys, 0), keys)
    best = dict.fromkeys(sizes, math.inf)
    for _ in range(repeat):
        for n, (table, keys) in tables.items():
            fresh = [os.urandom(36) for _ in range(per_op)]
            old = keys[:per_op]
            t0 = time.perf_counter()
            for k in old:
                del table[k]
            for k in fresh:
                table[k] = 0
            best[n] = min(best[n], time.perf_counter() - t0)
            del keys[:per_op]
            keys += fresh
    rows = [row("pop_insert_16", "dict-control", "cache_pages", n, t) for n, t in best.items()]
    for r in rows:
        print(f"{'dict-control':18s} {'pop_insert_16':14s} pages={r['value']:8d}  "
              f"{r['seconds'] * 1e3:9.3f} ms")
    return rows


def exponent(rows: list[dict], op: str, label: str) -> float:
    """Least-squares slope of log(seconds) against log(value)."""
    pts = [(math.log(r["value"]), math.log(r["seconds"]))
           for r in rows if r["op"] == op and r["backend"] == label]
    mx = sum(x for x, _ in pts) / len(pts)
    my = sum(y for _, y in pts) / len(pts)
    return sum((x - mx) * (y - my) for x, y in pts) / sum((x - mx) ** 2 for x, _ in pts)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="results/bench", help="output folder")
    ap.add_argument("--quick", action="store_true", help="small sizes only (a smoke run)")
    ap.add_argument("--repeat", type=int, default=5, help="rounds (cache-size rounds: 8x this)")
    ap.add_argument("--only", nargs="*", default=None, help="variant labels to run")
    args = ap.parse_args(argv)
    lengths = QUICK_PROMPT_LENGTHS if args.quick else PROMPT_LENGTHS
    sizes = QUICK_CACHE_PAGES if args.quick else CACHE_PAGES
    variants = [v for v in VARIANTS
                if v[1] in available_backends() and (args.only is None or v[0] in args.only)]
    rows: list[dict] = []
    for label, name, page, opts in variants:
        rows += bench_prompt_length(label, name, page, opts, lengths, args.repeat)
        rows += bench_cache_size(label, name, page, opts, sizes, 8 * args.repeat)
    rows += bench_dict_control(sizes, 8 * args.repeat)

    def max_over_min(op: str, label: str, column: str) -> float:
        values = [r[column] for r in rows if r["op"] == op and r["backend"] == label]
        return max(values) / min(values)

    control = max_over_min("pop_insert_16", "dict-control", "seconds")
    summary: dict[str, dict[str, float]] = {"dict-control": {"pop_insert_16_max_over_min": control}}
    for label, *_ in variants:
        summary[label] = {
            "lookup_exponent": exponent(rows, "lookup_hit", label),
            "cycle_exponent": exponent(rows, "cycle_miss", label),
            "cycle_evicting_max_over_min": max_over_min("cycle_evicting", label, "seconds"),
            "evict_max_over_min": max_over_min("evict", label, "seconds"),
            "cycle_evicting_calls_max_over_min": max_over_min("cycle_evicting", label, "calls"),
            "evict_calls_max_over_min": max_over_min("evict", label, "calls"),
        }
        s = summary[label]
        print(f"{label:18s} growth exponent vs prompt length: lookup {s['lookup_exponent']:.2f}, "
              f"cycle {s['cycle_exponent']:.2f}; max/min over cache sizes: "
              f"cycle {s['cycle_evicting_max_over_min']:.2f} (calls "
              f"{s['cycle_evicting_calls_max_over_min']:.2f}), evict {s['evict_max_over_min']:.2f} "
              f"(calls {s['evict_calls_max_over_min']:.2f})")
    print(f"{'dict-control':18s} max/min over cache sizes: "
          f"{summary['dict-control']['pop_insert_16_max_over_min']:.2f} (the memory hierarchy alone)")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    write_rows_csv(out / "ops.csv", rows)
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    print(f"wrote {out / 'ops.csv'} and {out / 'summary.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
