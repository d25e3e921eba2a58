"""Per-block cost of the hashchain read path for each block hash function.

For every hash function: a cache holding one long request (all its blocks cached), then a
fresh request with the same tokens is looked up. Measured per block, best of ``--repeat``:

* ``hash``:        hashing the request's blocks (BlockHasher, chained, extra keys included);
* ``hash+lookup``: ``cache.lookup`` of the fresh request, i.e. hashing plus one hash-map
  probe per block (what a scheduler pays per waiting request).

Prints one line per function (microseconds per block, ratio to sha256) and writes
``config.json`` + ``results.csv`` under ``results/bench_hashing-b{block}-n{blocks}/``.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from collections.abc import Callable
from pathlib import Path

from prefixcache.backends.hashchain import HASH_FUNCTIONS, BlockHasher, get_hash_fn
from prefixcache.experiments.bench.ops import write_rows_csv

from prefixcache import CacheConfig, Request, make_cache


def timed(fn: Callable[[Request], object], prompt: list[int], name: str) -> float:
    """Seconds for ``fn`` on a fresh Request (built outside the timer: an empty hash memo)."""
    req = Request(name, prompt)
    start = time.perf_counter()
    fn(req)
    return time.perf_counter() - start


def measure_all(prompt: list[int], block_size: int, repeat: int) -> dict[str, tuple[float, float]]:
    """Seconds per block for (hash, hash+lookup), best of ``repeat``, for every hash function.

    Functions are interleaved round by round so that load from other processes hits all alike.
    """
    num_blocks = len(prompt) // block_size
    setups = {}
    for name in HASH_FUNCTIONS:
        cache = make_cache("hashchain", CacheConfig((num_blocks + 2) * block_size, block_size), hash_fn=name)
        assert cache.allocate(Request("warm", prompt), len(prompt))  # caches every full block
        hits = cache.lookup(Request("check", prompt)).tokens // block_size
        assert hits == num_blocks - 1, f"{name}: expected {num_blocks - 1} hit blocks, got {hits}"
        setups[name] = (cache, get_hash_fn(name))
    best = {name: [float("inf"), float("inf")] for name in HASH_FUNCTIONS}
    for _ in range(repeat):
        for name, (cache, hash_fn) in setups.items():
            hasher = BlockHasher(block_size, hash_fn)
            best[name][0] = min(best[name][0], timed(hasher.block_hashes, prompt, "h"))
            best[name][1] = min(best[name][1], timed(cache.lookup, prompt, "q"))
    return {name: (h / num_blocks, q / num_blocks) for name, (h, q) in best.items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--blocks", type=int, default=20_000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--out", default="results", help="parent folder of the results folder")
    args = ap.parse_args(argv)

    rng = random.Random(0)
    prompt = [rng.randrange(50_000) for _ in range(args.blocks * args.block_size)]
    rows = []
    for name, (hash_s, lookup_s) in measure_all(prompt, args.block_size, args.repeat).items():
        rows.append(
            {"hash_fn": name, "hash_us_per_block": hash_s * 1e6, "lookup_us_per_block": lookup_s * 1e6}
        )
    base = next(r for r in rows if r["hash_fn"] == "sha256")
    for r in rows:
        r["ratio_to_sha256"] = r["lookup_us_per_block"] / base["lookup_us_per_block"]
        unsafe = "  (UNSAFE baseline)" if r["hash_fn"] == "builtin" else ""
        print(
            f"{r['hash_fn']:12s} hash {r['hash_us_per_block']:6.2f} us/block   "
            f"hash+lookup {r['lookup_us_per_block']:6.2f} us/block   "
            f"x{r['ratio_to_sha256']:.2f} of sha256{unsafe}"
        )

    out = Path(args.out) / f"bench_hashing-b{args.block_size}-n{args.blocks}"
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(vars(args), indent=2))
    write_rows_csv(out / "results.csv", rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
