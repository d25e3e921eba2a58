"""What vLLM's data layout costs at page size 1, against the radix engine on the same requests
(issue 28: "300 trace requests at page size 1: hashchain within 3x of radix").

At page size 1 every prompt token is a block. vLLM's design, which the hashchain backend
reproduces, keeps one Python object per block (``KVCacheBlock``) and a dict keyed by each
block's hash bytes with the group id appended (``BlockHashWithGroupId``). Whatever else a
faithful implementation does, each block it caches is an object made, a key built and a key
inserted into that dict, a reference counted and a place in the free queue's links when its
request frees it; each block a lookup hits is a probe of the dict, and each block's hash is read
(a prompt's, from a store) or computed (a decoded one's). This script times
exactly those operations, alone, for the blocks the run really caches and hits, and sets them
beside the engine's wall time for radix and for hashchain on the same requests (the first
``--limit`` of the Mooncake conversation trace, ``prefixcache run``'s defaults: fcfs,
4,194,304 tokens; hashchain reads its prompt hashes from a store filled before, untimed):
a floor for the per-block design, not an estimate of ours.

    python -m prefixcache.experiments.bench.block_floor [--limit 300] [--rounds 3]
"""

from __future__ import annotations

import argparse
import gc
import os
import time
from collections.abc import Callable, Sequence
from typing import Any

from prefixcache.backends.hashchain.block import KVCacheBlock
from prefixcache.backends.hashchain.hashing import (
    BlockHash,
    chain_block_hashes,
    group_id_suffix,
    none_hash,
    sha256,
)
from prefixcache.experiments.bench.replay import TRACES, filled_store
from prefixcache.experiments.inputs.traces import iter_requests, read_mooncake

from prefixcache import CacheConfig, Engine, make_cache

CAPACITY = 4_194_304


def engine_seconds(backend: str, records: Sequence[Any], limit: int) -> tuple[float, int, int, int]:
    """(wall seconds of ``Engine.run``, prompt tokens, hit tokens, decode tokens) at page size 1."""
    options: dict[str, Any] = {}
    if backend == "hashchain":
        options["known_prompt_hashes"] = filled_store(records, limit, 1, "sha256")
    cache = make_cache(backend, CacheConfig(CAPACITY, 1), **options)
    engine = Engine(cache, "fcfs")
    requests = list(iter_requests(records, limit=limit))
    t0 = time.perf_counter()
    recs = engine.run(requests)
    wall = time.perf_counter() - t0
    return wall, sum(r.prompt_tokens for r in recs), sum(r.hit_tokens for r in recs), engine.decode_tokens


def timed(step: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    step()
    return time.perf_counter() - t0


def _count_references(blocks: list[KVCacheBlock]) -> None:
    """A block's reference taken at allocation and given back at its request's release."""
    for block in blocks:
        block.ref_cnt += 1
    for block in blocks:
        block.ref_cnt -= 1


def _link(blocks: list[KVCacheBlock]) -> None:
    """Freed blocks threaded into the free queue, each behind the one before (its two links)."""
    prev = KVCacheBlock(-1)
    for block in blocks:
        prev.next_free_block = block
        block.prev_free_block = prev
        prev = block


def floor_seconds(num_cached: int, num_hits: int, num_decoded: int) -> dict[str, float]:
    """The per-block operations vLLM's layout cannot skip: each cached prompt block's hash read
    from a store (cut from its 512-hash row, as ``trace_hashes`` does), each decoded block's
    hash computed (sha256 of the pickle, ``chain_block_hashes``), a key built and inserted, an
    object made, a reference taken and given back and two free-queue links per cached block, a
    probe per hit block."""
    rows = [os.urandom(32 * 512) for _ in range(-(-num_cached // 512))]
    units = [slice(32 * j, 32 * (j + 1)) for j in range(512)]
    hashes: list[bytes] = []
    out: dict[str, float] = {}
    out["read stored hashes"] = timed(
        lambda: [hashes.extend(map(row.__getitem__, units)) for row in rows]
    )
    del hashes[num_cached:]
    decoded: list[BlockHash] = []
    tokens = [(t % 32_000,) for t in range(num_decoded)]
    out["hash decoded blocks"] = timed(
        lambda: chain_block_hashes(sha256, none_hash(sha256), tokens, decoded)
    )
    suffix = group_id_suffix(0)
    keys: list[bytes] = []
    out["build keys"] = timed(lambda: keys.extend([h + suffix for h in hashes]))
    blocks: list[KVCacheBlock] = []
    out["make block objects"] = timed(lambda: blocks.extend(map(KVCacheBlock, range(num_cached))))
    index: dict[bytes, KVCacheBlock] = {}
    out["insert keys"] = timed(lambda: list(map(index.setdefault, keys, blocks)))
    out["count references"] = timed(lambda: _count_references(blocks))
    out["link freed blocks"] = timed(lambda: _link(blocks))
    probes = keys[:num_hits] if num_hits <= num_cached else (keys * (num_hits // num_cached + 1))[:num_hits]
    out["probe hit keys"] = timed(lambda: list(map(index.get, probes)))
    return out


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--limit", type=int, default=300, help="first N requests of the conversation trace")
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds; each part keeps its best")
    args = ap.parse_args(argv)
    records = read_mooncake(TRACES["conversation"])
    best: dict[str, float] = {}
    prompt = hits = decoded = 0
    for _ in range(args.rounds):
        for backend in ("radix", "hashchain"):
            wall, prompt, hits, decoded = engine_seconds(backend, records, args.limit)
            best[backend] = min(best.get(backend, wall), wall)
        gc.collect()
        gc.disable()  # the floor builds millions of objects: no collector pass among them
        try:
            parts = floor_seconds(prompt - hits, hits, decoded)
        finally:
            gc.enable()
        for name, seconds in parts.items():
            best[name] = min(best.get(name, seconds), seconds)
    floor = sum(best[name] for name in parts)
    print(f"first {args.limit} conversation requests, page size 1: {prompt:,} prompt tokens, "
          f"{hits:,} hit, {prompt - hits:,} prompt blocks cached, {decoded:,} decoded; "
          f"best of {args.rounds} rounds")
    radix = best["radix"]
    print(f"  radix engine               {radix:7.2f} s")
    print(f"  hashchain engine           {best['hashchain']:7.2f} s {best['hashchain'] / radix:6.1f}x radix")
    for name in parts:
        print(f"    floor: {name:<20}{best[name]:7.2f} s")
    print(f"  floor of the layout        {floor:7.2f} s {floor / radix:6.1f}x radix")


if __name__ == "__main__":
    main()
