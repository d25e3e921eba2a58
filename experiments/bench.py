"""Cost of every cache operation, per backend, and how it grows (``make bench``).

Measures, on this machine and in one run (so ratios are comparable):

* ``lookup`` and the admit cycle (allocate + commit + release) against prompt length
  (1k .. 128k tokens): per-request and per-token cost, and the log-log growth exponent;
* the same cycle against cache size (10^3 .. 10^6 pages, cache full of evictable entries so
  every admission evicts): cost must stay flat as the cache grows 1000x;
* ``evict`` of one request's worth of tokens from a full cache.

Writes ``results/bench/ops.csv`` (tidy: op, backend, variable, value, seconds) and
``results/bench/summary.json`` (exponents and flatness ratios), which the paper's cost figure
reads, and prints one line per measurement plus a summary.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import random
import time
from collections.abc import Callable
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


def random_tokens(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(32_000) for _ in range(n)]


def cycle(cache: PrefixCache, req: Request) -> None:
    hit = cache.lookup(req)
    assert cache.allocate(req, req.num_tokens - hit), "bench cache too small"
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


def row(op: str, label: str, variable: str, value: int, seconds: float) -> dict:
    return dict(op=op, backend=label, variable=variable, value=value, seconds=seconds)


def bench_prompt_length(label: str, name: str, page: int, opts: dict, lengths: list[int],
                        repeat: int) -> list[dict]:
    rows = []
    rng = random.Random(0)
    for length in lengths:
        cache = make_cache(name, CacheConfig(4 * length + 64 * page, page), **opts)
        prompt = random_tokens(rng, length)
        miss = random_tokens(rng, length)
        cycle(cache, Request("warm", prompt))
        # A fresh Request each time: its hashes (hashchain) or key (radix) are built afresh.
        t_lookup = best_of(cache.lookup, requests_of(prompt.copy), repeat)
        t_cycle = best_of(partial(cycle, cache), requests_of(miss.copy), repeat,
                          before=partial(cache.evict, 10**9))
        for op, t in (("lookup_hit", t_lookup), ("cycle_miss", t_cycle)):
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
    rows = []
    for (op, pages), t in best.items():
        rows.append(row(op, label, "cache_pages", pages, t))
        print(f"{label:18s} {op:14s} pages={pages:8d}  {t * 1e3:9.3f} ms per 256-token request")
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
    args = ap.parse_args(argv)
    lengths = QUICK_PROMPT_LENGTHS if args.quick else PROMPT_LENGTHS
    sizes = QUICK_CACHE_PAGES if args.quick else CACHE_PAGES
    variants = [v for v in VARIANTS if v[1] in available_backends()]
    rows: list[dict] = []
    for label, name, page, opts in variants:
        rows += bench_prompt_length(label, name, page, opts, lengths, args.repeat)
        rows += bench_cache_size(label, name, page, opts, sizes, 8 * args.repeat)
    summary: dict[str, dict[str, float]] = {}
    for label, *_ in variants:
        flat = {}
        for op in ("cycle_evicting", "evict"):
            times = [r["seconds"] for r in rows if r["op"] == op and r["backend"] == label]
            flat[op] = max(times) / min(times)
        summary[label] = {
            "lookup_exponent": exponent(rows, "lookup_hit", label),
            "cycle_exponent": exponent(rows, "cycle_miss", label),
            "cycle_evicting_max_over_min": flat["cycle_evicting"],
            "evict_max_over_min": flat["evict"],
        }
        s = summary[label]
        print(f"{label:18s} growth exponent vs prompt length: lookup {s['lookup_exponent']:.2f}, "
              f"cycle {s['cycle_exponent']:.2f}; cost max/min over cache sizes: "
              f"cycle {flat['cycle_evicting']:.2f}, evict {flat['evict']:.2f}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "ops.csv", "w") as f:
        f.write("op,backend,variable,value,seconds\n")
        for r in rows:
            f.write(f"{r['op']},{r['backend']},{r['variable']},{r['value']},{r['seconds']:.9f}\n")
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    print(f"wrote {out / 'ops.csv'} and {out / 'summary.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
