"""Eviction policies on the block-level model of ``bounds.py``: the whole traces in seconds.

The model's cache is a prefix tree of block keys (a block's parent is the block before it in
the request). After each request, while more than ``capacity`` blocks are cached, the leaf
(no cached child) with the smallest key goes, as radix evicts leaves and as our ranked
hashchain policies do, so a policy never orphans a block. Keys are computed when a block is
touched or becomes a leaf, never re-ranked later (what a heap-ordered cache can afford).

Policies: every name of ``prefixcache.eviction`` (the vocabulary both backends take; time is
the request index, every block one page long, priority 0), ``lrp`` (ours, below), and the
offline ``reuse-oracle`` (knows *whether* a block is looked up again, not *when*: LRU among
the reused, never-again blocks first), the ceiling of any policy that predicts reuse.

``LearnedReuse`` (``lrp``, ours): a block's key is ``last_access + alpha * gap * p(class)``,
where ``p(class)`` is the reuse probability of the class of the request that last touched it,
learned online, and ``gap`` the mean reuse gap seen so far (in requests). The class is what
the traces show to predict reuse (see paper/LOG.md): the request's hit fraction as the cache
*would* have seen it (its cached prefix extended through a ghost list of recently evicted
keys), its prompt length and its output length. Labels come from the ghost: a lookup that
reaches a ghost or cached key credits the class that key was last touched under. State:
per-class counters and a ghost of ``ghost_factor * capacity`` keys, O(log n) per operation.
"""

from __future__ import annotations

import bisect
import heapq
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from prefixcache.experiments.analysis.bounds import BlockTrace, _hits_per_request, cached_prefix

from prefixcache.eviction import make_policy


class _Block:
    __slots__ = ("key", "parent", "num_children", "last_access_time", "creation_time", "hit_count",
                 "priority", "num_tokens", "depth", "reuse_class", "credited")

    def __init__(self, key: int, parent: _Block | None, depth: int, now: int, page: int) -> None:
        self.key, self.parent, self.depth = key, parent, depth
        self.num_children = 0
        self.last_access_time = self.creation_time = now
        self.hit_count, self.priority, self.num_tokens = 0, 0, page
        self.reuse_class: tuple = ()
        self.credited = False


class _Named:
    """A ``prefixcache.eviction`` policy, with no request-level state."""

    def __init__(self, name: str) -> None:
        self.policy = make_policy(name)

    def begin(self, r: int, look: list[int], hit: int, prompt: int, output: int) -> None:
        pass

    def touched(self, block: _Block, r: int, hit: bool) -> None:
        pass

    def evicted(self, block: _Block) -> None:
        pass

    def key(self, block: _Block) -> Any:
        return self.policy.priority(block)


def _bucket(x: float, edges: Sequence[float]) -> int:
    return bisect.bisect_right(edges, x)


class LearnedReuse(_Named):
    """Ours (``lrp``); see the module docstring. Defaults tuned on the first half of each
    Mooncake trace (alpha in {2, 4, 8, 16}: 8 gave the best mean gap closed there)."""

    HIT_FRACTION = (0.5, 0.9, 0.99)
    PROMPT_TOKENS = (2048, 8192)
    OUTPUT_TOKENS = (200,)

    def __init__(self, capacity: int, alpha: float = 8.0, ghost_factor: int = 8) -> None:
        self.alpha = alpha
        self.ghost: OrderedDict[int, tuple[tuple, bool, int]] = OrderedDict()
        self.ghost_size = ghost_factor * capacity
        self.touches: dict[tuple, float] = {}
        self.reuses: dict[tuple, float] = {}
        self.gap_sum, self.gaps = 0.0, 0
        self.current: tuple = ()

    def begin(self, r: int, look: list[int], hit: int, prompt: int, output: int) -> None:
        seen = hit
        while seen < len(look) and look[seen] in self.ghost:
            reuse_class, credited, last = self.ghost.pop(look[seen])
            self._reused(reuse_class, credited, r - last)
            seen += 1
        fraction = seen / len(look) if look else 0.0
        self.current = (_bucket(fraction, self.HIT_FRACTION), _bucket(prompt, self.PROMPT_TOKENS),
                        _bucket(output, self.OUTPUT_TOKENS))

    def touched(self, block: _Block, r: int, hit: bool) -> None:
        if hit:
            self._reused(block.reuse_class, block.credited, r - block.last_access_time)
        block.reuse_class, block.credited = self.current, False
        self.touches[self.current] = self.touches.get(self.current, 1.0) + 1

    def _reused(self, reuse_class: tuple, credited: bool, gap: int) -> None:
        if not credited:
            self.reuses[reuse_class] = self.reuses.get(reuse_class, 0.5) + 1
        self.gap_sum += gap
        self.gaps += 1

    def evicted(self, block: _Block) -> None:
        self.ghost[block.key] = (block.reuse_class, block.credited, block.last_access_time)
        if len(self.ghost) > self.ghost_size:
            self.ghost.popitem(last=False)

    def probability(self, reuse_class: tuple) -> float:
        return self.reuses.get(reuse_class, 0.5) / self.touches.get(reuse_class, 1.0)

    def key(self, block: _Block) -> float:
        gap = self.gap_sum / self.gaps if self.gaps else 0.0
        return block.last_access_time + self.alpha * gap * self.probability(block.reuse_class)


class ReuseOracle(_Named):
    """Offline: LRU among blocks looked up again, never-again blocks first."""

    def __init__(self, trace: BlockTrace) -> None:
        self.uses: dict[int, list[int]] = {}
        for r, look in enumerate(trace.lookups):
            for key in look:
                self.uses.setdefault(key, []).append(r)
        self.now = 0

    def begin(self, r: int, look: list[int], hit: int, prompt: int, output: int) -> None:
        self.now = r

    def key(self, block: _Block) -> tuple[bool, int]:
        uses = self.uses.get(block.key, ())
        again = bisect.bisect_right(uses, self.now) < len(uses)  # type: ignore[arg-type]
        return (again, block.last_access_time)


MODEL_POLICIES = ("lrp", "reuse-oracle")  # besides every prefixcache.eviction name


def make_model_policy(name: str, trace: BlockTrace, capacity: int) -> _Named:
    if name == "lrp":
        return LearnedReuse(capacity)
    if name == "reuse-oracle":
        return ReuseOracle(trace)
    return _Named(name)  # ValueError listing the names for an unknown one


def policy_hits(
    trace: BlockTrace,
    capacity_blocks: int,
    policy: str,
    prompt_tokens: Sequence[int] | None = None,
    output_tokens: Sequence[int] | None = None,
) -> list[int]:
    """Hit tokens per request under ``policy`` with ``capacity_blocks`` blocks."""
    n = len(trace.lookups)
    default_prompts = [len(x) * trace.page_size for x in trace.lookups]
    prompts = prompt_tokens if prompt_tokens is not None else default_prompts
    outputs = output_tokens if output_tokens is not None else [0] * n
    pol = make_model_policy(policy, trace, capacity_blocks)
    cache: dict[int, _Block] = {}
    heap: list[tuple[Any, int, int, _Block]] = []  # (key, -depth, version, block): stale ones skipped
    serial = 0

    def push(block: _Block) -> None:
        nonlocal serial
        serial += 1
        heapq.heappush(heap, (pol.key(block), -block.depth, serial, block))
        block_version[block.key] = serial

    block_version: dict[int, int] = {}
    out = []
    for r, (look, ins) in enumerate(zip(trace.lookups, trace.inserts, strict=True)):
        hit = cached_prefix(look, cache)
        out.append(hit)
        pol.begin(r, look, hit, prompts[r], outputs[r])
        parent: _Block | None = None
        touched = []
        for depth, key in enumerate(ins):
            block = cache.get(key)
            if block is None:
                block = _Block(key, parent, depth, r, trace.page_size)
                cache[key] = block
                if parent is not None:
                    parent.num_children += 1
                block.hit_count = 1
                pol.touched(block, r, False)
            else:
                pol.touched(block, r, depth < hit)
                block.hit_count += 1
                block.last_access_time = r
            touched.append(block)
            parent = block
        for block in reversed(touched):  # deepest first, as the backends free a request
            if block.num_children == 0:
                push(block)
        while len(cache) > capacity_blocks:
            _, _, stamp, block = heapq.heappop(heap)
            stale = block_version.get(block.key) != stamp or cache.get(block.key) is not block
            if stale or block.num_children:
                continue  # touched, gone, or extended since it was pushed
            del cache[block.key]
            del block_version[block.key]
            pol.evicted(block)
            up = block.parent
            if up is not None:
                up.num_children -= 1
                if up.num_children == 0 and cache.get(up.key) is up:
                    push(up)
    return _hits_per_request(trace, out)
