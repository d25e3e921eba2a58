"""A cluster: N replicas, each an engine over its own cache, one simulated clock, a router in
front.

Events run in time order: a request is routed when the clock reaches its arrival, and a
replica's next step runs when its clock is the earliest of the busy replicas' (a replica's
clock is the end of its last step). A step that began before an arrival is taken first, so
the router sees each replica as it stands after the step in progress (one step of look-ahead
at most, as a router polling engine metrics would). Decode stretches are off: an arrival
routed to a replica mid-stretch would change its steps. Decode steps inside held pages are
deferred (``Engine.defer_decoders``): the router's view reads each running request's length as
stepping one by one would have it (``Engine.num_tokens_now``), and the cache, records and
clock are exact at every step.

Every request is routed once and finishes once (or is rejected by its replica as larger than
the cache); ``run`` checks both, and the per-request rows say what the router predicted, what
the chosen replica's cache held at routing time and what the request actually reused.
"""

from __future__ import annotations

import heapq
import math
import random
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from prefixcache.cluster.routers.base import ReplicaState, Router
from prefixcache.cost_model import Clock, CostModel
from prefixcache.engine import Engine, rare_full_collections
from prefixcache.interface import PrefixCache
from prefixcache.kv_event_sink import KVEventSink
from prefixcache.request import Request
from prefixcache.tiers import HostTier


@dataclass(slots=True)
class Replica:
    index: int
    cache: PrefixCache[Any]
    engine: Engine
    finished: int = 0
    # Routed and not yet finished, in routing order: a request may be admitted and finish in
    # one step (a one-token answer), so the running list before a step does not hold them all.
    open: dict[str, Request] = field(default_factory=dict)
    # What the cache was given, read once: its host tier and KV-event sink (None: none)
    host_tier: HostTier | None = None
    kv_events: KVEventSink | None = None


@dataclass(slots=True)
class RouteRecord:
    """One routing decision and what came of it."""

    request_id: str
    replica: int
    arrival_time: float
    prompt_tokens: int
    branch: str
    predicted_tokens: int  # what the router expected to be reused
    cached_at_route: int  # what the chosen replica's cache held for it at routing time
    hit_tokens: int | None = None  # what it reused at admission (None: rejected)
    ttft_s: float | None = None
    rejected: bool = False


class Cluster:
    def __init__(
        self,
        caches: Sequence[PrefixCache[Any]],
        router: Router,
        *,
        scheduler: str = "fcfs",
        token_budget: int = 2048,
        cost_model: Clock | None = None,
        seed: int = 0,
        check_invariants: bool = False,
        kv_events: bool = False,
        event_lag_s: float = 0.0,
        event_loss: float = 0.0,
        defer_decoders: bool = True,
    ) -> None:
        """defer_decoders: each replica defers its decode steps inside held pages (the same
        routes and records as stepping each request one by one, faster)."""
        if not caches:
            raise ValueError("a cluster needs at least one replica")
        if router.num_replicas != len(caches):
            raise ValueError(
                f"the router was made for {router.num_replicas} replicas, the cluster has {len(caches)}"
            )
        if len({id(c) for c in caches}) != len(caches):
            raise ValueError("each replica needs its own cache object")
        if kv_events:
            mute = [i for i, c in enumerate(caches) if c.kv_events is None]
            if mute:
                raise ValueError(f"kv_events=True but the caches of replicas {mute} were made without "
                                 "kv_events=True: they would publish nothing")
        if event_lag_s < 0 or not 0 <= event_loss < 1:
            raise ValueError(f"need event_lag_s >= 0, 0 <= event_loss < 1: {event_lag_s}, {event_loss}")
        cm = cost_model if cost_model is not None else CostModel.measured()
        self.cost_model, self.token_budget = cm, token_budget  # what a router may cost its routes by
        self.replicas = [
            Replica(i, c, Engine(c, scheduler, token_budget, cost_model=cm, seed=seed,
                                 check_invariants=check_invariants, multi_step=defer_decoders),
                    host_tier=c.host_tier, kv_events=c.kv_events)
            for i, c in enumerate(caches)
        ]
        for replica in self.replicas:
            replica.engine.defer_decoders(True)
        self.router = router
        self.routes: dict[str, RouteRecord] = {}
        self.clock = 0.0
        # (time, replica, +1 routed / -1 finished), in event order: a finish is logged at its
        # step's end, which may be later than an arrival routed while the step ran
        self.load_events: list[tuple[float, int, int]] = []
        # KV events: each replica's batch after each step, delivered event_lag_s later; a lost
        # batch still takes its sequence number, so the router sees the gap.
        self.kv_events = kv_events
        self.event_lag_s = event_lag_s
        self.event_loss = event_loss
        self._event_rng = random.Random(seed)
        self._event_seq = [0] * len(caches)
        # (due time, send order, replica, seq, events)
        self._in_flight: list[tuple[float, int, int, int, list[Any]]] = []
        self._sent = 0
        self.events_lost = 0
        router.attach(self)

    # ---------------------------------------------------------------- what a router sees
    def state(self, replica: Replica) -> ReplicaState:
        e, cache = replica.engine, replica.cache
        queued = list(e.waiting) + e.arrivals.pending()
        prefill = sum(r.num_prompt_tokens - r.num_computed_tokens for r in queued)
        decode_blocks = 0
        for r in e.running:  # (a deferred decoder is past its prompt; its length read as now)
            if r.num_computed_tokens < r.num_prompt_tokens:
                prefill += r.num_prompt_tokens - r.num_computed_tokens
            else:
                decode_blocks += math.ceil(e.num_tokens_now(r) / cache.config.page_size)
        return ReplicaState(
            index=replica.index,
            active_requests=len(queued) + len(e.running),
            waiting=len(queued),
            kv_usage=cache.usage().in_use / cache.num_usable_pages(),
            prefill_tokens=prefill,
            decode_blocks=decode_blocks,
        )

    # ---------------------------------------------------------------- the loop
    def run(self, requests: Iterable[Request]) -> list[RouteRecord]:
        """Route and serve every request (in arrival order); returns one record per request."""
        # stable: ties keep their order. A routed request is let go of here, so that once it
        # finishes nothing holds its tokens (a whole trace's prompts are gigabytes) unless the
        # caller kept ``requests``.
        pending = deque(sorted(requests, key=lambda r: r.arrival_time))
        del requests
        ids = [r.request_id for r in pending]
        if len(set(ids)) != len(ids):
            raise ValueError("request ids must be unique across the cluster")
        with rare_full_collections():
            self._serve(pending)
        for replica in self.replicas:  # (every request finished: nothing is deferred now)
            replica.engine.defer_decoders(False)
        self._check_conservation(len(ids))
        return [self.routes[rid] for rid in ids]

    def _serve(self, pending: deque[Request]) -> None:
        """Route each pending request at its arrival and step the replicas in time order until
        every request has finished."""
        stalled = [0] * len(self.replicas)
        while True:
            busy = [(t, rep.index) for rep in self.replicas if (t := self._next_step(rep)) is not None]
            step_at = min(busy) if busy else None
            if pending and (step_at is None or pending[0].arrival_time <= step_at[0]):
                self._route(pending.popleft())
                continue
            if step_at is None:
                break
            replica = self.replicas[step_at[1]]
            self.clock = max(self.clock, step_at[0])
            tier = replica.host_tier
            if self._step(replica) == 0 and not (tier is not None and tier.transfers_in_flight()):
                stalled[replica.index] += 1
                if stalled[replica.index] > 2:
                    raise RuntimeError(f"replica {replica.index} made no progress at clock {self.clock}")
            else:
                stalled[replica.index] = 0

    def _next_step(self, replica: Replica) -> float | None:
        e = replica.engine
        if e.waiting or e.running:
            return e.clock
        t = e.arrivals.next_time()
        return None if t is None else max(e.clock, t)

    def _route(self, req: Request) -> None:
        now = req.arrival_time
        self.clock = max(self.clock, now)
        self._deliver_events(now)
        decision = self.router.route(req, [self.state(r) for r in self.replicas], now)
        if not 0 <= decision.replica < len(self.replicas):
            raise RuntimeError(
                f"router {self.router.name} chose replica {decision.replica} of {len(self.replicas)}"
            )
        replica = self.replicas[decision.replica]
        fits = req.num_tokens <= replica.cache.config.usable_tokens
        cached = replica.cache.lookup(req).tokens if fits else 0
        self.routes[req.request_id] = RouteRecord(
            req.request_id, replica.index, now, req.num_prompt_tokens, decision.branch,
            decision.predicted_tokens, cached,
        )
        replica.engine.add_request(req)
        replica.open[req.request_id] = req
        self.load_events.append((now, replica.index, 1))
        rec = replica.engine.records[req.request_id]
        if rec.rejected:
            self._finished(replica, req, now)

    def _step(self, replica: Replica) -> int:
        e = replica.engine
        computed = e.step()
        if self.kv_events:
            self._send_events(replica, e.clock)
        done = [r for rid, r in replica.open.items() if e.records[rid].finish_step is not None]
        for r in done:
            self._finished(replica, r, e.clock)
        return computed

    def _send_events(self, replica: Replica, now: float) -> None:
        assert replica.kv_events is not None, "checked at construction"
        events = replica.kv_events.take_events()
        if not events:
            return
        seq = self._event_seq[replica.index]
        self._event_seq[replica.index] += 1
        if self.event_loss and self._event_rng.random() < self.event_loss:
            self.events_lost += 1
            return
        heapq.heappush(self._in_flight, (now + self.event_lag_s, self._sent, replica.index, seq, events))
        self._sent += 1

    def flush_events(self) -> None:
        """Deliver every batch still in flight, whatever its lag (after ``run``: the router's
        view once the network has caught up)."""
        self._deliver_events(math.inf)

    def _deliver_events(self, now: float) -> None:
        while self._in_flight and self._in_flight[0][0] <= now:
            due, _, k, seq, events = heapq.heappop(self._in_flight)
            self.router.on_events(k, seq, events, due)

    def _finished(self, replica: Replica, req: Request, now: float) -> None:
        rec = replica.engine.records[req.request_id]
        route = self.routes[req.request_id]
        if route.hit_tokens is not None or route.rejected:
            raise RuntimeError(f"{req.request_id} finished twice")
        del replica.open[req.request_id]
        route.rejected = rec.rejected
        if not rec.rejected:
            route.hit_tokens = rec.hit_tokens
            assert rec.first_token_time is not None
            route.ttft_s = rec.first_token_time - rec.arrival_time
        replica.finished += 1
        self.load_events.append((now, replica.index, -1))
        self.router.on_finish(req, replica.index, now)

    def _check_conservation(self, num_requests: int) -> None:
        routed = sum(len(r.engine.records) for r in self.replicas)
        finished = sum(r.finished for r in self.replicas)
        if not routed == finished == len(self.routes) == num_requests:
            raise RuntimeError(
                f"requests not conserved: {num_requests} in, {len(self.routes)} routed, "
                f"{routed} in engines, {finished} finished"
            )
        for r in self.replicas:
            if r.engine.has_unfinished() or r.engine.num_finished != len(r.engine.records):
                raise RuntimeError(f"replica {r.index} still holds unfinished requests")
