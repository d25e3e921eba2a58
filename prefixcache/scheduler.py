"""Waiting-queue policies: which waiting request the engine tries to admit first.

A policy only orders the queue; the engine does the admitting (token budget, room in the
cache, preemption). Policies reach the cache through a ``lookup`` callable (the engine's,
which times it), never through a backend's internals, so every policy works on every backend.
The matches a policy took travel on with its schedule: the engine admits with them, never
looking the same request up again for the same decision (SGLang's ``prefix_computed``).

- ``fcfs``: arrival order, preempted requests first (vLLM's default).
- ``lpm``: longest cached prefix first, with SGLang's in-batch prefix dedup; FCFS when more
  than 128 requests wait (SGLang turns the sort off there because matching is expensive).
  ``lpm-no-fallback`` sorts at any queue length (not an SGLang mode: a counterfactual).
- ``dfs-weight``: SGLang's: each waiting request hangs at the tree node where its cached
  prefix ends; a depth-first walk from the root, heavier subtrees first, emits a node's own
  requests after its subtree, so requests with no hit (at the root) come last, in queue
  order. We rebuild that part of the tree from the cached prefixes (``lookup``), which needs
  no backend internals and gives the same branching; ties between equally heavy children go
  to the one whose first request is earlier in the queue (SGLang: tree insertion order).

An *offline order* sees the whole request set before the run and fixes the queue once, which
the engine then serves FCFS (it keeps insertion order among equal arrivals): not a policy an
engine can run, but a bound to compare the online ones against, named beside them.

- ``dfs-offline``: depth-first over the token trie of every request, heavier subtrees first
  (the offline order of SGLang's Theorem 3.1, the scheduling study's optimum).
"""

from __future__ import annotations

import os
import sys
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from typing import ClassVar, NamedTuple

import numpy as np

from prefixcache.interface import Match
from prefixcache.request import Request

Lookup = Callable[[Request], Match]
NO_MATCHES: Mapping[str, Match] = {}

# SGLang's schedule_policy.py: a request whose cache match is at most CHECK_THRESHOLD tokens is
# matched against the other waiting requests; sharing at least DEPRIORITIZE_THRESHOLD tokens
# with one that goes first deprioritizes it (its prefix will be cached once that one has run).
IN_BATCH_PREFIX_CACHING_CHECK_THRESHOLD = 32
IN_BATCH_PREFIX_CACHING_DEPRIORITIZE_THRESHOLD = 32
# SGLang's _determine_active_policy: above this many waiting requests lpm falls back to FCFS.
LPM_FALLBACK_QUEUE_LEN = 128


class Schedule(NamedTuple):
    """The waiting queue in admission order, the ids to hold back this step, and the matches
    the policy took (request id -> match), for the engine to admit with.

    A held-back request is admitted only in a step where no other request was admitted
    before it, so it never waits forever.
    """

    order: Sequence[Request]  # may be the waiting queue itself (valid until it changes)
    held_back: frozenset[str]
    matches: Mapping[str, Match] = NO_MATCHES


class Scheduler(ABC):
    """Orders the waiting queue once per engine step."""

    name: ClassVar[str]

    @abstractmethod
    def schedule(self, waiting: Sequence[Request], lookup: Lookup) -> Schedule:
        """``waiting`` is in queue order (preempted requests at the front, then arrival)."""




class FCFS(Scheduler):
    name = "fcfs"

    def schedule(self, waiting: Sequence[Request], lookup: Lookup) -> Schedule:
        return Schedule(waiting, frozenset())  # the queue as it is: admission reads its front


class LongestPrefixMatch(Scheduler):
    name = "lpm"

    def __init__(
        self,
        check_threshold: int = IN_BATCH_PREFIX_CACHING_CHECK_THRESHOLD,
        deprioritize_threshold: int = IN_BATCH_PREFIX_CACHING_DEPRIORITIZE_THRESHOLD,
        fallback_queue_len: int = LPM_FALLBACK_QUEUE_LEN,
    ) -> None:
        self.check_threshold = check_threshold
        self.deprioritize_threshold = deprioritize_threshold
        self.fallback_queue_len = fallback_queue_len

    def schedule(self, waiting: Sequence[Request], lookup: Lookup) -> Schedule:
        if len(waiting) > self.fallback_queue_len:
            return Schedule(waiting, frozenset())
        matches: dict[str, Match] = {}
        deprioritized: set[str] = set()
        # SGLang matches against a simulated radix tree of the waiting requests seen so far and
        # only asks whether the match reaches the threshold: a set of first-k-token keys
        # answers exactly that question in O(1).
        k = self.deprioritize_threshold
        seen: set[tuple[object, ...]] = set()
        for r in waiting:
            match = matches[r.request_id] = lookup(r)
            if match.tokens > self.check_threshold:
                continue
            key = (r.namespace, tuple(r.all_token_ids[:k]))
            if r.num_tokens >= k and key in seen:
                deprioritized.add(r.request_id)
            else:
                seen.add(key)
        # Stable sort: equal matches keep queue order (FCFS among equals).
        order = sorted(
            waiting,
            key=lambda r: (r.request_id in deprioritized, -matches[r.request_id].tokens),
        )
        return Schedule(order, frozenset(deprioritized), matches)


class LongestPrefixMatchNoFallback(LongestPrefixMatch):
    """``lpm`` that sorts however many wait (SGLang always falls back above 128): the
    engine-trace study's counterfactual. It matches every waiting request at every pass."""

    name = "lpm-no-fallback"

    def __init__(self) -> None:
        super().__init__(fallback_queue_len=sys.maxsize)


class DFSWeight(Scheduler):
    name = "dfs-weight"

    def schedule(self, waiting: Sequence[Request], lookup: Lookup) -> Schedule:
        if len(waiting) <= 1:
            return Schedule(list(waiting), frozenset())
        waiting = list(waiting)  # indexed below (a deque's index walks it)
        matches = {r.request_id: lookup(r) for r in waiting}
        hits = [matches[r.request_id].tokens for r in waiting]
        return Schedule(cached_prefix_dfs_order(waiting, hits), frozenset(), matches)


def cached_prefix_dfs_order(reqs: Sequence[Request], hits: Sequence[int]) -> list[Request]:
    """SGLang's ``_dfs_weight_order`` over the cached part of the tree (see the module doc)."""
    keys = {i: (reqs[i].namespace, *reqs[i].all_token_ids[: hits[i]]) for i in range(len(reqs)) if hits[i]}
    out: list[int] = []
    # ("visit", indices in queue order sharing key[:depth], depth) or ("emit", indices)
    stack: list[tuple[str, list[int], int]] = [("visit", list(keys), 0)] if keys else []
    while stack:
        what, group, depth = stack.pop()
        if what == "emit":
            out.extend(group)
            continue
        node_len = len(os.path.commonprefix([keys[i] for i in group]))  # type: ignore[misc]
        own = [i for i in group if len(keys[i]) == node_len]  # [:node_len]: the node they share
        children: dict[object, list[int]] = {}
        for i in group:
            if len(keys[i]) > node_len:
                children.setdefault(keys[i][node_len], []).append(i)
        stack.append(("emit", own, node_len))
        for child in sorted(children.values(), key=lambda g: (-len(g), g[0]), reverse=True):
            stack.append(("visit", child, node_len))  # reversed push: the heaviest pops first
    return [reqs[i] for i in out] + [r for r, h in zip(reqs, hits, strict=True) if not h]


SCHEDULERS: dict[str, type[Scheduler]] = {
    s.name: s for s in (FCFS, LongestPrefixMatch, LongestPrefixMatchNoFallback, DFSWeight)
}


def available_schedulers() -> list[str]:
    return sorted(SCHEDULERS)


def make_scheduler(name: str) -> Scheduler:
    """Build scheduler ``name``; an unknown name raises ValueError listing the valid ones."""
    try:
        return SCHEDULERS[name]()
    except KeyError:
        raise ValueError(f"unknown scheduler {name!r}; valid: {', '.join(available_schedulers())}") from None


# ------------------------------------------------------------------------------ offline orders
def dfs_weight_order(reqs: Sequence[Request]) -> list[Request]:
    """The offline order of SGLang's Theorem 3.1, the scheduling study's optimum: depth-first
    over the token trie of ``reqs``; a request ending at a node goes before the node's children,
    and at each branch the child holding more requests goes first (ties: the one whose earliest
    request is earlier in the queue)."""
    # Sorting the sequences makes every trie subtree a contiguous run; adjacent common-prefix
    # lengths (lcp[i] between items i-1 and i) then give the branch depths.
    keyed = sorted(range(len(reqs)), key=lambda i: (reqs[i].namespace, tuple(reqs[i].all_token_ids)))
    seqs = [np.asarray(reqs[i].all_token_ids, dtype=np.int64) for i in keyed]
    lcp = [0] * len(keyed)
    for i in range(1, len(keyed)):
        if reqs[keyed[i]].namespace == reqs[keyed[i - 1]].namespace:
            lcp[i] = _common_prefix(seqs[i - 1], seqs[i])
        else:
            lcp[i] = -1  # different namespaces split at the root

    out: list[int] = []
    stack = [(0, len(keyed))]  # subtrees [lo, hi) still to visit; explicit, as chains run deep
    while stack:
        lo, hi = stack.pop()
        if hi - lo == 1:
            out.append(keyed[lo])
            continue
        depth = min(lcp[lo + 1 : hi])
        runs: list[tuple[int, int]] = []
        start = lo
        for i in range(lo + 1, hi):
            if lcp[i] == depth:
                runs.append((start, i))
                start = i
        runs.append((start, hi))
        # A request that ends at this node computes the prefix its subtree shares: it goes first
        # (a chat turn before the turns that extend it); then the heavier child.
        runs.sort(key=lambda run: (len(seqs[run[0]]) != depth, -(run[1] - run[0]),
                                   min(keyed[run[0] : run[1]])))
        stack.extend(reversed(runs))  # heaviest child popped first
    return [reqs[i] for i in out]


def _common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    n = min(len(a), len(b))
    diff = np.flatnonzero(a[:n] != b[:n])
    return int(diff[0]) if diff.size else n


OFFLINE_ORDERS: dict[str, Callable[[Sequence[Request]], list[Request]]] = {"dfs-offline": dfs_weight_order}


def scheduler_names() -> list[str]:
    """What a run may name as its scheduler: the online schedulers, then the offline orders."""
    return [*available_schedulers(), *OFFLINE_ORDERS]


def check_scheduler(name: object) -> None:
    """ValueError listing ``scheduler_names()`` unless ``name`` is one of them."""
    if name not in SCHEDULERS and name not in OFFLINE_ORDERS:
        raise ValueError(f"unknown scheduler {name!r}; valid: {', '.join(scheduler_names())}")


def order_for(reqs: Sequence[Request], name: str) -> tuple[Sequence[Request], str]:
    """The queue and the online scheduler that run ``name``: an offline order sorts the whole
    queue once (every request up front) and is served FCFS; an online scheduler leaves the
    queue as it is."""
    if name in OFFLINE_ORDERS:
        return OFFLINE_ORDERS[name](list(reqs)), "fcfs"
    return reqs, name
