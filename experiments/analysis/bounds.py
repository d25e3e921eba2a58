"""What any prefix cache could reach on a request sequence: ceilings to plot measured hit
rates against.

The model (shared by every function here): request r looks up the chained keys of its first
``(n - 1) // B`` full blocks (the last token is always computed, as in both backends) and then
holds all ``n // B`` full blocks of the sequence it leaves behind (prompt, or prompt + output).
Lookups see the cache as it was when the request arrived; the request's blocks are inserted
after it. A block key is the hash of the whole prefix up to it, so equal keys mean equal
prefixes. Capacities are in blocks, and count cached blocks only (a real engine also needs
room for running requests, so it cannot quite reach these).

- ``infinite_cache_hits``: an unbounded cache (the ceiling).
- ``belady_hits``: the offline optimum at a capacity (keep the blocks reused soonest).
- ``lru_hit_curve``: block-LRU hits at *every* capacity in one pass (Mattson stack distances);
  ``lru_hits`` replays one capacity directly, to check it.
Under LRU a request touches its blocks deepest first (vLLM frees a request's blocks in
reverse), so a parent is always more recent than its child and the cache stays prefix-closed:
a block hit therefore always extends a hit prefix.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from collections.abc import Container, Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, slots=True)
class BlockTrace:
    """Per request: keys it looks up, keys it leaves cached (a superset, same order)."""

    lookups: list[list[int]]
    inserts: list[list[int]]
    page_size: int


def block_keys(tokens: Sequence[int], page_size: int) -> list[int]:
    """Chained keys of the full blocks of ``tokens`` (Python's tuple hash: 64-bit, fine for
    bounds; the hashchain backend uses cryptographic hashes)."""
    keys, parent = [], 0
    for start in range(0, len(tokens) - page_size + 1, page_size):
        parent = hash((parent, tuple(tokens[start : start + page_size])))
        keys.append(parent)
    return keys


def block_trace(
    prompts: Sequence[Sequence[int]], page_size: int, inserted: Sequence[Sequence[int]] | None = None
) -> BlockTrace:
    """``inserted[i]``: what request i leaves cached (default: its prompt)."""
    inserted = prompts if inserted is None else inserted
    lookups, inserts = [], []
    for prompt, seq in zip(prompts, inserted, strict=True):
        keys = block_keys(seq, page_size)
        lookups.append(block_keys(prompt[: len(prompt) - 1], page_size))
        if keys[: len(lookups[-1])] != lookups[-1]:
            raise ValueError("inserted sequence must start with the request's prompt")
        inserts.append(keys)
    return BlockTrace(lookups, inserts, page_size)


def cached_prefix(look: Sequence[int], cache: Container[int]) -> int:
    """Blocks of ``look`` found in ``cache`` before the first miss (a prefix cache stops there)."""
    k = 0
    while k < len(look) and look[k] in cache:
        k += 1
    return k


def _hits_per_request(trace: BlockTrace, hit: list[int]) -> list[int]:
    return [h * trace.page_size for h in hit]


# ------------------------------------------------------------------------------ infinite
def infinite_cache_hits(trace: BlockTrace) -> list[int]:
    """Hit tokens per request with unbounded capacity."""
    seen: set[int] = set()
    out = []
    for look, ins in zip(trace.lookups, trace.inserts, strict=True):
        out.append(cached_prefix(look, seen))
        seen.update(ins)
    return _hits_per_request(trace, out)


# ------------------------------------------------------------------------------ Belady
def belady_hits(trace: BlockTrace, capacity_blocks: int) -> list[int]:
    """Hit tokens per request under the offline optimum with ``capacity_blocks`` blocks.

    After each request keep, of the cached and the request's blocks, the ``capacity`` whose
    next lookup is soonest (never-again blocks are dropped). With free choice of what to keep,
    this greedy rule is optimal (Belady's exchange argument). Ties go to the shallower block:
    a parent is looked up whenever its child is, so the kept set stays prefix-closed.

    Only the request's own blocks change their next lookup, so a max-heap of (next lookup,
    depth, key) with stale entries skipped finds what to drop: O(touches log capacity), which
    makes whole traces take seconds (tests/test_bounds.py checks it against ranking the whole
    cache after every request, and both against brute force).
    """
    uses: dict[int, list[int]] = {}  # key -> requests that look it up, ascending
    for r, look in enumerate(trace.lookups):
        for key in look:
            uses.setdefault(key, []).append(r)
    position = dict.fromkeys(uses, 0)  # key -> index in uses[key] of its next lookup

    cache: dict[int, tuple[int, int]] = {}  # key -> (next lookup, depth): its live heap entry
    heap: list[tuple[int, int, int]] = []  # (-next lookup, -depth, -key): the first to drop on top
    out = []
    for r, (look, ins) in enumerate(zip(trace.lookups, trace.inserts, strict=True)):
        out.append(cached_prefix(look, cache))
        for depth, key in enumerate(ins):
            lst = uses.get(key, ())
            i = position.get(key, 0)
            while i < len(lst) and lst[i] <= r:
                i += 1
            if lst:
                position[key] = i
            nxt = lst[i] if i < len(lst) else _NEVER
            if nxt == _NEVER:
                cache.pop(key, None)  # never looked up again: dropped (its heap entry is stale)
                continue
            cache[key] = (nxt, depth)
            heapq.heappush(heap, (-nxt, -depth, -key))
        while len(cache) > capacity_blocks:
            nxt, depth, key = heapq.heappop(heap)
            if cache.get(-key) == (-nxt, -depth):
                del cache[-key]
    return _hits_per_request(trace, out)


_NEVER = 1 << 62


# ------------------------------------------------------------------------------ LRU
def lru_hits(trace: BlockTrace, capacity_blocks: int) -> list[int]:
    """Hit tokens per request under block-LRU with ``capacity_blocks`` blocks (direct replay)."""
    lru: OrderedDict[int, None] = OrderedDict()  # least recent first
    out = []
    for look, ins in zip(trace.lookups, trace.inserts, strict=True):
        out.append(cached_prefix(look, lru))
        for key in reversed(ins):  # deepest first: the root ends most recent
            lru[key] = None
            lru.move_to_end(key)
        while len(lru) > capacity_blocks:
            lru.popitem(last=False)
    return _hits_per_request(trace, out)


def lru_hit_curve(trace: BlockTrace, capacities: Sequence[int]) -> list[int]:
    """Total LRU hit tokens at each capacity, from one pass over the trace.

    A lookup hits under capacity C iff its stack distance (blocks touched at or after its last
    touch) is <= C (LRU's inclusion property). A Fenwick tree over touch times counts them.
    """
    total_touches = sum(len(x) for x in trace.inserts)
    tree = [0] * (total_touches + 1)

    def add(i: int, v: int) -> None:
        i += 1
        while i <= total_touches:
            tree[i] += v
            i += i & -i

    def prefix(i: int) -> int:  # touches with time < i
        s = 0
        while i > 0:
            s += tree[i]
            i -= i & -i
        return s

    last: dict[int, int] = {}
    live = 0
    clock = 0
    distances: list[int] = []
    for look, ins in zip(trace.lookups, trace.inserts, strict=True):
        for key in look:
            t = last.get(key)
            distances.append(_NEVER if t is None else live - prefix(t))
        for key in reversed(ins):
            t = last.get(key)
            if t is not None:
                add(t, -1)
            else:
                live += 1
            add(clock, 1)
            last[key] = clock
            clock += 1
    # Along one request distances strictly grow (a parent is always touched after its child),
    # so the leading hit run at capacity C is just the number of distances <= C.
    ordered = np.sort(np.asarray(distances, dtype=np.int64))
    counts = np.searchsorted(ordered, np.asarray(capacities, dtype=np.int64), side="right")
    return [int(c) * trace.page_size for c in counts]
