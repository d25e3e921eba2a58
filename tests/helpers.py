"""Test helpers shared by the suites."""

from __future__ import annotations

import random
from typing import Any

from prefixcache.backends.hashchain.hashing import BlockHash, make_block_hash_with_group_id

from prefixcache import CacheConfig, PrefixCache, Request, make_cache


class Checked:
    """Wraps a cache so that ``check_invariants()`` runs after every call that can change it."""

    _MUTATING = {"lookup", "allocate", "commit", "release", "evict", "reset", "page_table"}

    def __init__(self, cache: PrefixCache) -> None:
        self.cache = cache
        cache.check_invariants()

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.cache, name)
        if name not in self._MUTATING:
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            try:
                return attr(*args, **kwargs)
            finally:
                self.cache.check_invariants()

        return call


def checked(name: str, capacity_tokens: int = 1024, page_size: int = 16, **options: Any) -> Any:
    return Checked(make_cache(name, CacheConfig(capacity_tokens, page_size), **options))


def run_to_completion(cache: Any, req: Request) -> int:
    """Admit, prefill in one chunk, commit and release; returns the hit."""
    match = cache.lookup(req)
    assert cache.allocate(req, req.num_tokens - match.tokens, match)
    hit = req.num_computed_tokens
    req.num_computed_tokens = req.num_tokens
    cache.commit(req)
    cache.release(req)
    return hit


def tokens(n: int, seed: int = 0, vocab: int = 50_000) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(vocab) for _ in range(n)]


def keyed(block_hashes: list[BlockHash], group_id: int) -> list[Any]:
    """The hash-map keys of these block hashes in one group."""
    return [make_block_hash_with_group_id(h, group_id) for h in block_hashes]


# The request a test's direct ``BlockPool.cache_full_blocks`` call names: only KV events read
# it, and those tests' pools record none.
DIRECT_REQUEST = Request("direct", [0])


def check_stale_grid_refused(
    make: Any, results: Any, paper: Any, full: Any, tables: dict[str, Any], counts: Any, column: str
) -> None:
    """A figure that puts this run's default-scale cells beside a committed full grid: with
    ``tables`` (stem -> frame) and ``counts`` (runs.csv) written to ``full`` it accepts them;
    with one cell's ``column`` off by one it refuses the grid as stale."""
    import pytest

    full.mkdir()
    for stem, table in tables.items():
        table.to_csv(full / f"{stem}.csv", index=False)
    counts.to_csv(full / "runs.csv", index=False)
    make(results, paper)  # the same counts: accepted
    counts.assign(**{column: counts[column] + 1}).to_csv(full / "runs.csv", index=False)
    with pytest.raises(RuntimeError, match="stale"):
        make(results, paper)
