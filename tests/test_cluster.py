"""A cluster of replicas behind a router: requests and pages are conserved, reruns are
bit-identical, and each replica serves its share exactly as a lone engine would."""

from __future__ import annotations

from dataclasses import asdict

import pytest
from prefixcache.experiments.analysis.routing import active_over_time
from prefixcache.experiments.inputs.workloads import make_workload

from prefixcache import CacheConfig, Engine, make_cache
from prefixcache.cluster import Cluster, available_routers, make_router

WORKLOADS = {
    "multi-turn-chat": dict(conversations=4, turns=3),
    "shared-doc-qa": dict(num_requests=16, num_docs=3, doc_len=256),
}


def requests(workload: str, seed: int = 0, spacing_s: float | None = None) -> list:
    """The workload's requests, each decoding >= 4 tokens; ``spacing_s`` re-times the arrivals
    one every that many seconds (the built-in workloads send many at once)."""
    reqs = make_workload(workload, seed=seed, **WORKLOADS[workload]).generate()
    for i, r in enumerate(reqs):
        r.max_new_tokens = max(r.max_new_tokens, 4)
        if spacing_s is not None:
            r.arrival_time = i * spacing_s
    return reqs


def cluster(router: str, backend: str, n: int = 3, capacity: int = 2048, **kw) -> Cluster:
    page = 1 if backend == "radix" else 16
    caches = [make_cache(backend, CacheConfig(capacity, page)) for _ in range(n)]
    return Cluster(caches, make_router(router, n), check_invariants=True, **kw)


def engine_rows(c: Cluster) -> list[dict]:
    return [
        {k: v for k, v in asdict(rec).items() if k != "cache_op_ns"}
        for rep in c.replicas
        for rec in rep.engine.records.values()
    ]


@pytest.mark.parametrize("backend", ["hashchain", "radix"])
@pytest.mark.parametrize("router", available_routers())
@pytest.mark.parametrize("workload", list(WORKLOADS))
def test_every_request_is_routed_once_and_finishes_once_and_no_page_leaks(router, backend, workload) -> None:
    c = cluster(router, backend)
    reqs = requests(workload)
    rows = c.run(reqs)  # check_invariants after every step of every replica
    in_arrival_order = [q.request_id for q in sorted(reqs, key=lambda q: q.arrival_time)]
    assert [r.request_id for r in rows] == in_arrival_order
    assert sum(rep.finished for rep in c.replicas) == len(reqs)
    # the load events: one per routing and per finish; in time order, never below 0, ending idle
    assert len(c.load_events) == 2 * len(reqs)
    times, active = active_over_time(c.load_events, 3)
    assert active.min() >= 0 and not active[-1].any()
    for rep in c.replicas:
        assert not rep.cache.live_requests
        u = rep.cache.usage()
        assert u.in_use == 0 and sum(u) == rep.cache.num_usable_pages()
        rep.cache.check_invariants()
    for row in rows:
        assert not row.rejected and row.hit_tokens is not None and row.ttft_s is not None and row.ttft_s >= 0
        assert 0 <= row.predicted_tokens < row.prompt_tokens
        assert 0 <= row.cached_at_route < row.prompt_tokens


@pytest.mark.parametrize("router", available_routers())
def test_reruns_with_the_same_seed_are_bit_identical(router) -> None:
    first, second = (cluster(router, "radix") for _ in range(2))
    a, b = (c.run(requests("shared-doc-qa", spacing_s=0.05)) for c in (first, second))
    assert [asdict(r) for r in a] == [asdict(r) for r in b]
    assert engine_rows(first) == engine_rows(second)


def test_each_replica_serves_its_share_as_a_lone_engine_would() -> None:
    """Round-robin: replica k gets requests k, k+n, ...; its records equal a lone engine's."""
    n = 3
    c = cluster("round-robin", "hashchain", n)
    ordered = sorted(requests("multi-turn-chat"), key=lambda r: r.arrival_time)
    c.run(ordered)
    for k in range(n):
        fresh = sorted(requests("multi-turn-chat"), key=lambda r: r.arrival_time)[k::n]
        lone = Engine(make_cache("hashchain", CacheConfig(2048, 16)), "fcfs", 2048, multi_step=False)
        lone.run(fresh)
        want = [{f: v for f, v in asdict(rec).items() if f != "cache_op_ns"} for rec in lone.records.values()]
        got = [{f: v for f, v in asdict(rec).items() if f != "cache_op_ns"}
               for rec in c.replicas[k].engine.records.values()]
        assert got == want


def test_the_oracle_predicts_exactly_what_the_chosen_cache_holds() -> None:
    c = cluster("oracle", "radix")
    rows = c.run(requests("shared-doc-qa", spacing_s=1.0))
    assert all(r.predicted_tokens == r.cached_at_route for r in rows)
    assert sum(r.cached_at_route for r in rows) > 0
    # Nothing else runs between routing and admission here: what was there is what is reused.
    assert all(r.hit_tokens == r.cached_at_route for r in rows)


def test_a_request_too_large_for_its_replica_is_rejected_and_still_counted() -> None:
    c = cluster("round-robin", "radix", n=2, capacity=256)
    reqs = requests("shared-doc-qa")  # ~1100-token prompts: larger than 255 usable tokens
    rows = c.run(reqs)
    assert all(r.rejected and r.hit_tokens is None for r in rows)
    assert sum(rep.finished for rep in c.replicas) == len(reqs)


def test_a_request_admitted_and_finished_in_one_step_is_counted_once() -> None:
    """A one-token answer is admitted, prefilled and finished in the same engine step: the
    cluster must see it finish although it was never running before a step (a Mooncake
    synthetic request of 546 prompt tokens and 1 output token once went missing this way)."""
    from prefixcache import Request

    reqs = [Request(f"r{i}", list(range(i * 100, i * 100 + 40)), max_new_tokens=1, arrival_time=i * 0.5)
            for i in range(6)]
    c = cluster("round-robin", "hashchain", n=2)
    rows = c.run(reqs)
    assert sum(rep.finished for rep in c.replicas) == 6
    assert all(r.ttft_s is not None and r.hit_tokens == 0 for r in rows)
    assert all(not rep.open for rep in c.replicas)


def test_bad_clusters_are_value_errors() -> None:
    caches = [make_cache("radix", CacheConfig(1024, 1)) for _ in range(2)]
    with pytest.raises(ValueError, match="made for 3 replicas"):
        Cluster(caches, make_router("round-robin", 3))
    with pytest.raises(ValueError, match="its own cache"):
        Cluster([caches[0], caches[0]], make_router("round-robin", 2))
    with pytest.raises(ValueError, match="at least one"):
        Cluster([], make_router("round-robin", 1))
    reqs = requests("multi-turn-chat")
    reqs[1].request_id = reqs[0].request_id
    with pytest.raises(ValueError, match="unique"):
        Cluster(caches, make_router("round-robin", 2)).run(reqs)


def test_kv_events_reach_the_router_late_by_the_lag_and_lost_batches_leave_sequence_gaps() -> None:
    ev = pytest.importorskip("prefixcache.kv_events")
    from prefixcache.backends.radix import RadixPrefixCache

    from prefixcache.cluster.routers.simple import RoundRobin

    class TickingSink:  # one event per step: the delivery is what is tested
        def take_events(self) -> list:
            return [ev.AllBlocksCleared()]

    class Ticking(RadixPrefixCache):
        @property
        def kv_events(self) -> TickingSink:
            return TickingSink()

    class Recorder(RoundRobin):
        def __init__(self, n: int) -> None:
            super().__init__(n)
            self.seen: list[tuple[int, int, float]] = []
            self.decided_at: list[float] = []

        def on_events(self, replica, seq, events, now) -> None:
            self.seen.append((replica, seq, now))

        def route(self, req, replicas, now):
            assert all(due <= now for _, _, due in self.seen), "an event arrived before it was due"
            self.decided_at.append(now)
            return super().route(req, replicas, now)

    router = Recorder(2)
    c = Cluster([Ticking(CacheConfig(4096, 1), kv_events=True) for _ in range(2)], router, kv_events=True,
                event_lag_s=0.5, event_loss=0.3)
    c.run(requests("shared-doc-qa", spacing_s=0.2))
    assert router.seen and c.events_lost > 0
    for k in range(2):
        seqs = [s for r, s, _ in router.seen if r == k]
        assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
    delivered = len(router.seen)
    sent = sum(c._event_seq)
    assert delivered + c.events_lost + len(c._in_flight) == sent
    in_flight = len(c._in_flight)
    c.flush_events()  # what was still on its way arrives, in order, however late
    assert not c._in_flight and len(router.seen) == delivered + in_flight
    with pytest.raises(ValueError, match="event_loss"):
        Cluster([Ticking(CacheConfig(4096, 1), kv_events=True)], RoundRobin(1), kv_events=True,
                event_loss=1.0)
    # a cache made without events would publish nothing: refused, naming the replica
    with pytest.raises(ValueError, match=r"replicas \[1\] were made without kv_events=True"):
        Cluster([Ticking(CacheConfig(4096, 1), kv_events=True), RadixPrefixCache(CacheConfig(4096, 1))],
                RoundRobin(2), kv_events=True)


@pytest.mark.parametrize("backend", ["hashchain", "radix"])
@pytest.mark.parametrize("router", ["dynamo", "llm-d", "preble", "oracle"])
def test_deferred_decoders_change_no_route_no_record_and_no_replica_state(router, backend) -> None:
    """Replicas that defer decode steps inside held pages (``Engine.defer_decoders``) route,
    serve and report exactly as replicas stepping every request one by one: every
    ``ReplicaState`` a router was shown, every route and every record are equal."""
    runs = []
    for defer in (True, False):
        caches = [make_cache(backend, CacheConfig(4096, 16)) for _ in range(3)]
        c = Cluster(caches, make_router(router, 3), check_invariants=True, defer_decoders=defer)
        shown = []
        state = c.state
        c.state = lambda replica, _state=state, _shown=shown: _shown.append(_state(replica)) or _shown[-1]
        reqs = requests("multi-turn-chat", spacing_s=0.02)
        for r in reqs:
            r.max_new_tokens = 40  # decode across several pages
        rows = c.run(reqs)
        deferred = sum(rep.engine.deferred_decode_steps for rep in c.replicas)
        runs.append(([asdict(r) for r in rows], engine_rows(c), shown, deferred))
    (rows_d, recs_d, shown_d, deferred), (rows_s, recs_s, shown_s, stepped) = runs
    assert deferred > 0 and stepped == 0, "the deferring cluster must defer, the other not"
    assert any(s.decode_blocks for s in shown_d), "the routers must have seen decoders"
    assert shown_d == shown_s
    assert rows_d == rows_s and recs_d == recs_s
