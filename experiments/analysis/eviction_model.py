"""Eviction policies on the block-level model of ``bounds.py``: the whole traces in seconds.

The model's cache is a prefix tree of block keys (a block's parent is the block before it in
the request). After each request, while more than ``capacity`` blocks are cached, the leaf
(no cached child) with the smallest key goes, as radix evicts leaves and as our ranked
hashchain policies do, so a policy never orphans a block. Keys are computed when a block is
touched or becomes a leaf, never re-ranked later (what a sorted-index cache can afford).

Policies: every name of ``prefixcache.eviction`` (the vocabulary both backends take; time is
the request index, every block one page long, priority 0), ``lrp`` (ours, below), and the
offline ``reuse-oracle`` (knows *whether* a block is looked up again, not *when*: LRU among
the reused, never-again blocks first), the ceiling of any policy that predicts reuse.

``lrp`` (ours, ``prefixcache.eviction.LearnedReuse``, which the hashchain backend runs too):
a block's key is ``last_access + alpha * gap * p(class)``, where ``p(class)`` is the reuse
probability of the class of the request that last touched it, learned online, and ``gap`` the
mean reuse gap seen so far (here in requests). The class is what the traces show to predict
reuse (paper/LOG.md): the request's hit fraction as the cache *would* have seen it (its cached
prefix extended through a ghost list of recently evicted keys), its prompt length and its
output length.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from typing import Any

from prefixcache.experiments.analysis.bounds import BlockTrace, _hits_per_request, cached_prefix

from prefixcache.eviction import LearnedReuse, admit, forget, make_index, make_policy, note_eviction


class _Block:
    __slots__ = ("key", "parent", "num_children", "last_access_time", "creation_time", "hit_count",
                 "priority", "num_tokens", "depth", "reuse_class", "credited", "tail_tokens",
                 "ghost_hit", "policy_state", "entry")

    def __init__(self, key: int, parent: _Block | None, depth: int, now: int, page: int) -> None:
        self.key, self.parent, self.depth = key, parent, depth
        self.num_children = 0
        self.last_access_time = self.creation_time = now
        self.hit_count, self.priority, self.num_tokens = 1, 0, page  # its inserting request holds it
        self.reuse_class: tuple = ()
        self.credited = False
        self.tail_tokens = 0
        self.ghost_hit = False
        self.policy_state: tuple | None = None
        self.entry: tuple | None = None  # its entry in the eviction index, while a leaf


class ReuseOracle:
    """Offline: LRU among blocks looked up again, never-again blocks first."""

    def __init__(self, trace: BlockTrace) -> None:
        self.uses: dict[int, list[int]] = {}
        for r, look in enumerate(trace.lookups):
            for key in look:
                self.uses.setdefault(key, []).append(r)
        self.now = 0

    def priority(self, block: _Block) -> tuple[bool, int]:
        uses = self.uses.get(block.key, ())
        again = bisect.bisect_right(uses, self.now) < len(uses)  # type: ignore[arg-type]
        return (again, block.last_access_time)


MODEL_POLICIES = ("arc", "s3fifo", "lrp", "reuse-oracle")  # besides prefixcache.eviction.POLICIES


def make_model_policy(name: str, trace: BlockTrace, capacity: int) -> Any:
    if name == "reuse-oracle":
        return ReuseOracle(trace)
    return make_policy(name, capacity)  # ValueError listing the names for an unknown one


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
    learner = pol if isinstance(pol, LearnedReuse) else None
    oracle = pol if isinstance(pol, ReuseOracle) else None
    cache: dict[int, _Block] = {}
    index = make_index(pol)  # (key, -depth, serial, block) of each leaf
    serial = 0

    def rank(block: _Block) -> None:  # (re)enter the index with a key computed now
        nonlocal serial
        if block.entry is not None:
            index.remove(block.entry)
        serial += 1
        block.entry = (pol.priority(block), -block.depth, serial, block)
        index.add(block.entry)

    out = []
    for r, (look, ins) in enumerate(zip(trace.lookups, trace.inserts, strict=True)):
        hit = cached_prefix(look, cache)
        out.append(hit)
        if learner is not None:
            learner.classify(learner.begin(look, hit, r), prompts[r], outputs[r])
        if oracle is not None:
            oracle.now = r
        parent: _Block | None = None
        touched = []
        for depth, key in enumerate(ins):
            block = cache.get(key)
            if block is None:
                block = _Block(key, parent, depth, r, trace.page_size)
                admit(pol, block, key)
                cache[key] = block
                if parent is not None:
                    parent.num_children += 1
                    if parent.entry is not None:  # no longer a leaf
                        index.remove(parent.entry)
                        parent.entry = None
            else:
                if learner is not None and depth < hit:
                    learner.reused(block, r)
                block.hit_count += 1
                block.last_access_time = r
            block.tail_tokens = (len(ins) - 1 - depth) * trace.page_size
            if learner is not None:
                learner.assign(block)
            touched.append(block)
            parent = block
        for block in reversed(touched):  # deepest first, as the backends free a request
            if block.num_children == 0:
                rank(block)
        while len(cache) > capacity_blocks:
            entry = index.pop(0)
            block = entry[-1]
            block.entry = None
            del cache[block.key]
            note_eviction(pol, entry[0])
            forget(pol, block, block.key)
            if learner is not None:
                learner.evicted(block, block.key)
            up = block.parent
            if up is not None:
                up.num_children -= 1
                if up.num_children == 0 and cache.get(up.key) is up:
                    rank(up)
    return _hits_per_request(trace, out)
