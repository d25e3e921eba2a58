"""Routers that need no model of any system's code: round-robin, session affinity
(production-stack's ``session`` router), and the oracle that reads every replica's true cache
(the upper bound every cache-aware router is measured against)."""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import xxhash

from prefixcache.cluster.routers.base import ReplicaState, Route, Router, least_loaded
from prefixcache.request import Request


class RoundRobin(Router):
    name = "round-robin"

    def __init__(self, num_replicas: int, *, seed: int = 0) -> None:
        super().__init__(num_replicas, seed=seed)
        self._next = 0

    def route(self, req: Request, replicas: Sequence[ReplicaState], now: float) -> Route:
        k = self._next
        self._next = (k + 1) % self.num_replicas
        return Route(k, 0, "round-robin")


def no_session(req: Request) -> str | None:
    return None


class SessionAffinity(Router):
    """vLLM production-stack's ``session`` router: a consistent hash of the session key onto a
    ring of the replicas (``virtual_nodes`` points each); a request without a key goes to the
    replica with the lowest QPS (requests routed in the last ``qps_window_s``). Upstream reads
    the key from a request header; ``session_of`` gives it here (default: no key)."""

    name = "session"

    def __init__(
        self,
        num_replicas: int,
        *,
        seed: int = 0,
        session_of: Callable[[Request], str | None] | None = None,
        virtual_nodes: int = 160,
        qps_window_s: float = 60.0,
    ) -> None:
        super().__init__(num_replicas, seed=seed)
        self.session_of = session_of if session_of is not None else no_session
        points = sorted(
            (xxhash.xxh64_intdigest(f"replica-{k}-{v}".encode()), k)
            for k in range(num_replicas)
            for v in range(virtual_nodes)
        )
        self._ring = [p for p, _ in points]
        self._owner = [k for _, k in points]
        self.qps_window_s = qps_window_s
        self._recent: list[deque[float]] = [deque() for _ in range(num_replicas)]

    def route(self, req: Request, replicas: Sequence[ReplicaState], now: float) -> Route:
        key = self.session_of(req)
        if key is None:
            for q in self._recent:
                while q and q[0] < now - self.qps_window_s:
                    q.popleft()
            k, branch = least_loaded([len(q) for q in self._recent]), "lowest-qps"
        else:
            i = bisect.bisect(self._ring, xxhash.xxh64_intdigest(key.encode())) % len(self._ring)
            k, branch = self._owner[i], "session"
        self._recent[k].append(now)
        return Route(k, 0, branch)


class Oracle(Router):
    """Sees every replica's true cache at routing time (a pure ``lookup``): the replica that
    would reuse the most, the least active one on ties. An upper bound, not a deployable router."""

    name = "oracle"

    def attach(self, cluster: Any) -> None:
        self._caches = [replica.cache for replica in cluster.replicas]

    def route(self, req: Request, replicas: Sequence[ReplicaState], now: float) -> Route:
        hits = [cache.lookup(req).tokens for cache in self._caches]
        best = max(hits)
        k = min((r.active_requests, r.index) for r in replicas if hits[r.index] == best)[1]
        return Route(k, best, "cache" if best else "balance")
