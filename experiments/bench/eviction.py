"""What each eviction policy costs per evicted page, against LRU, in both backends (issue 14).

A replay under constant eviction pressure: ``--requests`` prompts of 512 tokens (the first
256 shared within one of 32 groups, the rest new) through a cache of ``--capacity`` tokens,
one request at a time (lookup, allocate, commit, release), so after warm-up every request
evicts. Per backend and policy: wall time per evicted page (the whole replay, index upkeep on
every hit and free included, divided by the pages evicted), the ratio to the backend's LRU
measured in the same run (rounds interleaved, the fastest of ``--rounds`` kept), and the peak
Python memory of the cache after the replay (tracemalloc of building and running it).
Hashchain's LRU is vLLM's free queue; its other policies rank leaves (RankedEviction).
Writes ``results/bench/eviction.csv``.
"""

from __future__ import annotations

import argparse
import random
import time
import tracemalloc
from pathlib import Path
from typing import Any

from prefixcache.experiments.bench.ops import write_rows_csv

from prefixcache import CacheConfig, Request, eviction_policies, make_cache

OUT = Path(__file__).resolve().parents[2] / "results" / "bench" / "eviction.csv"
CASES = [("hashchain", 16), ("radix", 16), ("radix", 1)]


def prompts(n: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    heads = [[rng.randrange(50_000) for _ in range(256)] for _ in range(32)]
    return [rng.choice(heads) + [rng.randrange(50_000) for _ in range(256)] for _ in range(n)]


def replay(backend: str, page: int, policy: str, capacity: int, batch: list[list[int]]) -> tuple[float, int]:
    """(seconds, pages evicted) of one replay."""
    options: dict[str, Any] = {"eviction_policy": policy}
    if backend == "radix":
        clock = iter(range(10**12))
        options["clock"] = clock.__next__
    cache = make_cache(backend, CacheConfig(capacity, page), **options)
    t0 = time.perf_counter()
    for i, tokens in enumerate(batch):
        req = Request(f"r{i}", tokens)
        match = cache.lookup(req)
        assert cache.allocate(req, req.num_tokens - match.tokens, match)
        req.num_computed_tokens = req.num_tokens
        cache.commit(req)
        cache.release(req)
    seconds = time.perf_counter() - t0
    return seconds, cache.stats.evicted_tokens // page


def peak_bytes(backend: str, page: int, policy: str, capacity: int, batch: list[list[int]]) -> int:
    tracemalloc.start()
    replay(backend, page, policy, capacity, batch)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return peak


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=1500)
    ap.add_argument("--capacity", type=int, default=65_536, help="cache size in tokens")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", type=Path, default=OUT)
    a = ap.parse_args(argv)
    batch = prompts(a.requests)
    rows = []
    for backend, page in CASES:
        policies = eviction_policies(backend)
        best: dict[str, tuple[float, int]] = {}
        for _ in range(a.rounds):  # interleaved: a noisy second slows every policy alike
            for policy in policies:
                seconds, evicted = replay(backend, page, policy, a.capacity, batch)
                if policy not in best or seconds < best[policy][0]:
                    best[policy] = (seconds, evicted)
        lru_per_page = best["lru"][0] / max(best["lru"][1], 1)
        for policy in policies:
            seconds, evicted = best[policy]
            per_page = seconds / max(evicted, 1)
            rows.append(dict(backend=backend, page_size=page, policy=policy, requests=a.requests,
                             capacity_tokens=a.capacity, seconds=round(seconds, 4), evicted_pages=evicted,
                             us_per_evicted_page=round(per_page * 1e6, 3),
                             ratio_to_lru=round(per_page / lru_per_page, 3),
                             peak_python_bytes=peak_bytes(backend, page, policy, a.capacity, batch)))
            print(f"{backend}-p{page} {policy:8s} {per_page * 1e6:8.2f} us/evicted page "
                  f"({per_page / lru_per_page:.2f}x LRU), {evicted} pages evicted", flush=True)
    write_rows_csv(a.out, rows)
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
